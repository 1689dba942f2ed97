"""MAPPOTrainer end to end on a tiny random model: a step, the update direction, the critic input, SIGKILL resume."""

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import llm_marl_envs
from llm_marl.models import tiny_model
from llm_marl.team import Team
from trainers.common.checkpoint import latest_checkpoint
from trainers.common.logging import read_metrics
from trainers.mappo import MAPPOConfig, MAPPOTrainer
from verifiers.reward_model import RewardModel
from verifiers.reward_server import RewardClient, RewardServer

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def build_trainer(output_dir, **overrides):
    """2 agents x 2 turns of arithmetic debate, scored by a tiny (random) learned verifier: nonzero, varied rewards."""
    torch.manual_seed(0)          # PEFT initialises the LoRA adapters from the global RNG
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, agents=2)
    verifier_lm, verifier_tokenizer = tiny_model(seed=1)
    verifier = RewardModel.from_causal_lm(verifier_lm, verifier_tokenizer, seed=1, max_length=96)
    env = llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=2, num_tasks=20, split="train")
    settings = dict(max_new_tokens=6, episodes_per_step=2, minibatch_size=4, ppo_epochs=2, learning_rate=1e-3,
                    critic_learning_rate=1e-3, max_steps=1, output_dir=str(output_dir), progress=False,
                    report_to=("jsonl",), eval_tasks=2, alpha1=0.5, beta1=0.5)
    settings.update(overrides)
    return MAPPOTrainer(env, team, MAPPOConfig(**settings), verifier=verifier)


def test_one_step_trains_logs_and_checkpoints(tmp_path):
    trainer = build_trainer(tmp_path)
    adapter_before = {k: v.clone() for k, v in trainer.team.policy("agent_1").trainable_state_dict("agent_1").items()}
    head_before = trainer.critic.head.weight.detach().clone()
    history = trainer.train()
    assert len(history) == 1
    metrics = history[0]
    for key in ("reward_mean", "kl_ref", "policy_loss", "value_loss", "clipfrac", "loss", "train_accuracy"):
        assert key in metrics and metrics[key] == metrics[key]          # present and not NaN
    assert read_metrics(tmp_path)[0]["step"] == 1
    assert latest_checkpoint(tmp_path).name == "step-000001"
    adapter_after = trainer.team.policy("agent_1").trainable_state_dict("agent_1")
    assert any(not torch.equal(adapter_before[k], adapter_after[k]) for k in adapter_before)
    assert not torch.equal(head_before, trainer.critic.head.weight)
    evaluation = trainer.evaluate()
    assert len(evaluation.episodes) == 2 and len(evaluation.accuracy_per_turn) == 2


def test_evaluate_plays_held_out_tasks_never_trained_on(tmp_path):
    trainer = build_trainer(tmp_path)          # 20 train-split tasks, eval_tasks=2, no eval_env
    assert trainer.eval_tasks == [18, 19] and trainer.train_tasks == list(range(18))
    held_out = [trainer.env.tasks[i]["task_id"] for i in (18, 19)]
    assert [e["task_id"] for e in trainer.evaluate().episodes] == held_out
    drawn = {episode.task_index for step in range(1, 9) for episode in trainer.collect(step)}
    assert drawn and not drawn & {18, 19}
    test_env = llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=2, num_tasks=20, split="test")
    with_test = MAPPOTrainer(trainer.env, trainer.team, trainer.config, eval_env=test_env, verifier=trainer.verifier)
    assert with_test.train_tasks == list(range(20))
    assert [e["task_id"] for e in with_test.evaluate().episodes] == [t["task_id"] for t in test_env.tasks[:2]]


def test_update_moves_log_probs_along_the_advantages(tmp_path):
    trainer = build_trainer(tmp_path, ppo_epochs=1, minibatch_size=8, kl_coef=0.0)
    responses = trainer.compute_rewards(trainer.collect(1))
    trainer.compute_advantages(responses)
    trainer.update(responses, step=1)
    gain = 0.0
    with torch.no_grad():
        for agent, group in trainer._by_agent(responses).items():
            policy, adapter = trainer.team.policy(agent), trainer.team.adapter(agent)
            new, _ = policy.token_logprobs([r.prompt_ids for r in group], [r.completion_ids for r in group],
                                           adapter=adapter, temperature=trainer.config.temperature)
            for row, r in enumerate(group):
                gain += float((r.advantages * (new[row, :len(r.completion_ids)] - r.old_logprobs)).sum())
    assert gain > 0      # first-order improvement of the PPO surrogate Σ A·(log π_new - log π_old)


def test_without_a_kl_penalty_no_reference_forward_runs_and_the_advantages_are_unchanged(tmp_path):
    calls = []

    def advantages_of(kl_coef, skip_reference):
        trainer = build_trainer(tmp_path / str(kl_coef), kl_coef=kl_coef)
        original = trainer.reference_logprobs

        def counted(responses):
            calls.append(kl_coef)
            return original(responses)

        trainer.reference_logprobs = counted
        if not skip_reference:       # what the step did before: the reference pass, its KL multiplied by kl_coef
            trainer.config.kl_coef = 1e-30
        responses = trainer.compute_rewards(trainer.collect(1))
        stats = trainer.compute_advantages(responses)
        return [r.advantages for r in responses], stats

    skipped, stats = advantages_of(0.0, skip_reference=True)
    assert calls == [] and "kl_ref" not in stats        # KL 0: no forward of the base with adapters disabled
    scored, stats = advantages_of(0.0, skip_reference=False)
    assert calls and "kl_ref" in stats
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(skipped, scored))   # a zero-weight term: same


def test_critic_reads_the_other_agents_answers_of_the_episode(tmp_path):
    trainer = build_trainer(tmp_path)
    episode = trainer.collect(1)[0]
    responses = trainer.compute_rewards([episode])
    tokenizer = trainer.team.policy("agent_0").tokenizer
    late = next(r for r in responses if r.agent == "agent_0" and r.turn == 1)
    critic_text = tokenizer.decode(late.critic_ids)
    for turn in episode.turns:                    # agent_1's answers of turns 0 and 1 are in agent_0's critic input
        assert turn["agent_1"].text.strip() in critic_text
    assert "agent_1 answered" in critic_text
    examples = trainer.reward_examples([episode])         # rollout data for a learned verifier
    assert len(examples) == 4 and examples[0].question == trainer.env.tasks[episode.task_index]["question"]
    assert [e.correct for e in examples] == [
        bool(turn[a].correct) for turn in episode.turns for a in ("agent_0", "agent_1")
    ]


def test_learned_verifier_served_over_http(tmp_path):
    trainer = build_trainer(tmp_path)
    episode = trainer.collect(1)[0]
    with RewardServer(trainer.verifier.score_batch) as server:
        config = dataclasses.replace(trainer.config, verifier="learned", reward_server_url=server.url)
        served = MAPPOTrainer(trainer.env, trainer.team, config)       # same team: reuses the critic adapter
        assert isinstance(served.verifier, RewardClient)
        remote, local = served.score(episode), trainer.score(episode)
    assert sum(remote.scores, []) == pytest.approx(sum(local.scores, []), abs=1e-5)
    assert remote.correct == local.correct


def test_config_validation_names_the_fix():
    with pytest.raises(ValueError, match="reward_rule must be one of"):
        MAPPOConfig(reward_rule="sum")
    with pytest.raises(ValueError, match="temperature must be > 0"):
        MAPPOConfig(temperature=0)
    with pytest.raises(ValueError, match="exactly one of reward_model_path or reward_server_url"):
        MAPPOConfig(verifier="learned")
    with pytest.raises(ValueError, match="kl_estimator"):
        MAPPOConfig(kl_estimator="k9")
    with pytest.raises(ValueError, match="report_to"):
        MAPPOConfig(report_to=("csv",))


def run_child(output_dir: str) -> None:
    """Entry point of the process the resume test kills: trains 3 steps, checkpointing every step."""
    build_trainer(output_dir, max_steps=3, save_every=1).train()


def test_resume_after_sigkill_reproduces_the_next_step_loss(tmp_path):
    reference = build_trainer(tmp_path / "reference", max_steps=3).train()

    killed = tmp_path / "killed"
    child = subprocess.Popen(
        [sys.executable, "-c", f"from tests.trainers.test_mappo_trainer import run_child; run_child({str(killed)!r})"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 600
    while latest_checkpoint(killed) is None:
        if child.poll() is not None:
            pytest.fail(f"child exited before its first checkpoint: {child.stderr.read().decode()[-2000:]}")
        assert time.monotonic() < deadline, "no checkpoint within 10 minutes"
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    done = int(latest_checkpoint(killed).name.split("-")[1])
    assert done < 3, "the child finished before it could be killed"

    resumed = build_trainer(killed, max_steps=done + 1, resume_from_checkpoint="latest")
    assert resumed.step == done
    next_step = resumed.train()[-1]
    expected = reference[done]
    assert next_step["step"] == expected["step"] == done + 1
    for key in ("loss", "policy_loss", "value_loss", "reward_mean"):
        assert next_step[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key


def test_a_critic_on_the_top_layers_trains_from_the_trunk_run_once_per_step(tmp_path):
    trainer = build_trainer(tmp_path, critic_layers=1)
    calls = {"trunk": 0}
    trunk = trainer.critic.trunk

    def counted(*args, **kwargs):
        calls["trunk"] += 1
        return trunk(*args, **kwargs)

    trainer.critic.trunk = counted
    critic_before = {k: v.clone() for k, v in trainer.critic.trainable_state_dict().items()}
    history = trainer.train()
    assert history[0]["value_loss"] == history[0]["value_loss"]
    after = trainer.critic.trainable_state_dict()
    assert any(not torch.equal(critic_before[k], after[k]) for k in critic_before)
    total = len(trainer.critic._decoder().layers)
    assert all(f".layers.{total - 1}." in k for k in after if k.startswith("adapter."))
    # 2 episodes x 2 turns x 2 agents = 8 responses, minibatch 4: one trunk forward per rollout bucket, none in
    # the 2 epochs' value losses
    assert 1 <= calls["trunk"] <= 2


def test_critic_layers_is_refused_with_the_range():
    with pytest.raises(ValueError, match="critic_layers must be None"):
        MAPPOConfig(critic_layers=0)


def test_critic_depth_is_refused_with_the_range():
    with pytest.raises(ValueError, match="critic_depth must be None"):
        MAPPOConfig(critic_depth=0)
    with pytest.raises(ValueError, match="counts adapted layers within critic_depth"):
        MAPPOConfig(critic_depth=2, critic_layers=3)
