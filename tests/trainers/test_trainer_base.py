"""What MAGRPO and MAPPO share: the config base, the evaluation result, the log-prob path, the trainer shell
(seeding, resume, evaluate, optimizers); tiny random models."""
import dataclasses
import time

import pytest
import torch

import llm_marl_envs
from llm_marl.backends.hf import completion_targets
from llm_marl.episode import AgentTurn, Episode
from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.team import Team
from tests.toy_env import SayNumberEnv
from trainers.common.config import TrainerConfig
from trainers.common.evaluation import EvalResult, evaluate_episodes
from trainers.common.losses import entropy_from_logits
from trainers.common.trainer import initialise_adapters
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer
from trainers.mappo import MAPPOConfig, MAPPOTrainer
from trainers.mappo.logprobs_entropy import token_logprobs_with_entropy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONFIGS = (MAGRPOConfig, MAPPOConfig)


# ----------------------------------------------------------------------------- config base
def test_shared_fields_are_declared_once_with_each_trainers_defaults():
    shared = {f.name for f in dataclasses.fields(TrainerConfig)}
    for config_cls in CONFIGS:
        assert shared <= {f.name for f in dataclasses.fields(config_cls)}
        own = set(vars(config_cls)["__annotations__"])
        assert own & shared <= {"max_new_tokens", "learning_rate", "weight_decay", "kl_coef", "max_steps", "eval_tasks",
                                "output_dir"}
    magrpo, mappo = MAGRPOConfig(), MAPPOConfig()
    assert (magrpo.max_new_tokens, magrpo.learning_rate, magrpo.kl_coef, magrpo.max_steps, magrpo.output_dir) == \
        (64, 5e-5, 0.0, 100, "outputs/magrpo")
    assert (mappo.max_new_tokens, mappo.learning_rate, mappo.kl_coef, mappo.max_steps, mappo.output_dir) == \
        (128, 1e-4, 0.05, 10, "outputs/mappo")
    help_text = {cls: {f.name: f.metadata["help"] for f in dataclasses.fields(cls)}
                 for cls in (TrainerConfig, MAPPOConfig)}
    assert help_text[MAPPOConfig]["max_new_tokens"] == help_text[TrainerConfig]["max_new_tokens"]


@pytest.mark.parametrize("config_cls", CONFIGS)
@pytest.mark.parametrize("values, message", [
    ({"temperature": 0}, "temperature must be > 0"),
    ({"top_p": 1.5}, "top_p must be in"),
    ({"max_grad_norm": 0}, "max_grad_norm must be > 0 or None"),
    ({"save_every": -1}, "save_every must be >= 0"),
    ({"report_to": ("csv",)}, "report_to entries"),
    ({"mixed_precision": "fp8"}, "mixed_precision must be one of"),
])
def test_shared_validation_serves_both_trainers(config_cls, values, message):
    with pytest.raises(ValueError, match=message):
        config_cls(**values)


@pytest.mark.parametrize("config_cls", CONFIGS)
def test_report_to_may_be_one_name_and_clipping_may_be_off(config_cls):
    config = config_cls(report_to="jsonl", max_grad_norm=None)
    assert config.report_to == ("jsonl",) and config.to_dict()["max_grad_norm"] is None


# ----------------------------------------------------------------------------- one evaluation result
def debate_env():
    return llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=2, num_tasks=20, split="train")


def adapter_per_agent_team() -> Team:
    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    return Team.adapter_per_agent(model, tokenizer, agents=2)


def assert_eval_result(result, num_episodes: int, num_turns: int) -> None:
    assert isinstance(result, EvalResult)
    assert result.num_episodes == len(result.episodes) == len(result.rewards) == num_episodes
    assert result.team_reward_ci[0] <= result.team_reward <= result.team_reward_ci[1]
    assert len(result.accuracy_per_turn) == len(result.accuracy_per_turn_ci) == num_turns
    for accuracy, (low, high) in zip(result.accuracy_per_turn, result.accuracy_per_turn_ci):
        assert 0.0 <= low <= accuracy <= high <= 1.0
    for record in result.episodes:
        assert {"task_id", "correct", "scores", "answers", "responses", "tokens"} <= set(record)
    assert set(result.metrics()) >= {"num_episodes", "team_reward", "team_reward_ci_low", "accuracy_turn1"}


def test_both_trainers_evaluate_to_the_same_shape_and_log_it_every_eval_every_steps(tmp_path):
    common = dict(max_new_tokens=4, max_steps=1, eval_every=1, eval_tasks=2, report_to=("jsonl",), progress=False)
    magrpo = MAGRPOTrainer(debate_env(), adapter_per_agent_team(),
                           MAGRPOConfig(num_generations=2, output_dir=str(tmp_path / "magrpo"), **common))
    mappo = MAPPOTrainer(debate_env(), adapter_per_agent_team(),
                         MAPPOConfig(episodes_per_step=1, ppo_epochs=1, output_dir=str(tmp_path / "mappo"), **common))
    results = {}
    for name, trainer in (("magrpo", magrpo), ("mappo", mappo)):
        history = trainer.train()
        assert history[-1]["eval/num_episodes"] == 2.0 and "eval/accuracy_turn0" in history[-1]
        results[name] = trainer.evaluate()
        assert_eval_result(results[name], num_episodes=2, num_turns=2)
        page = (tmp_path / name / "eval" / f"step-{trainer.step:06d}" / "report.html").read_text()
        assert 'id="ep-eval-1"' in page and "Episodes" in page      # the evaluation's episodes, as in bench
    assert {f.name: type(getattr(results["magrpo"], f.name)) for f in dataclasses.fields(EvalResult)} == \
        {f.name: type(getattr(results["mappo"], f.name)) for f in dataclasses.fields(EvalResult)}
    assert results["magrpo"].episodes[0].keys() == results["mappo"].episodes[0].keys()


def test_a_batched_evaluation_gives_each_episode_its_share_of_the_batch_and_reports_the_real_total(tmp_path):
    env = debate_env()
    engine = RolloutEngine(env, adapter_per_agent_team(), progress=False, env_name="arithmetic_debate-v0")
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    began = time.perf_counter()
    result = evaluate_episodes(engine, None, None, list(range(6)), [0] * 6, params, parallel=3,
                               report_path=tmp_path / "report.html")
    elapsed = time.perf_counter() - began
    shares = [record["wall_time_s"] for record in result.episodes]
    assert len(set(shares[:3])) == 1 and len(set(shares[3:])) == 1           # two batches of 3, one share each
    assert 0 < sum(shares) <= result.wall_time_s <= elapsed                  # the shares add up to the time played
    page = (tmp_path / "report.html").read_text()
    assert f"{result.wall_time_s:.1f}" in page.split("wall time (total, s)", 1)[1][:200]


def fake_episode(correct: list[list[bool | None]], reward: float, task_id: str = "t") -> Episode:
    turns = [{f"agent_{i}": AgentTurn(f"agent_{i}", t, [], "x", reward,
                                      verdict={"score": reward, "correct": flag, "details": {}})
              for i, flag in enumerate(row)} for t, row in enumerate(correct)]
    return Episode(env="fake", task_id=task_id, seed=0, task_index=0, turns=turns)


def test_eval_result_pads_early_stopped_episodes_and_has_no_accuracy_without_correctness():
    result = EvalResult.from_episodes([fake_episode([[True, False]], 1.0),
                                       fake_episode([[False, False], [True, True]], 0.0)], num_turns=2,
                                      models=["m", "m"])
    assert result.accuracy_per_turn == [0.25, 0.75]        # episode 1 keeps its turn-0 answers at turn 1
    assert result.team_reward == pytest.approx(0.5) and result.rewards == [1.0, 0.0]
    unjudged = EvalResult.from_episodes([fake_episode([[None, None]], 0.3)], num_turns=1, models=["m", "m"])
    assert unjudged.accuracy_per_turn is None and unjudged.accuracy_per_turn_ci is None
    assert "accuracy_turn0" not in unjudged.metrics()
    with pytest.raises(ValueError, match="at least one episode"):
        EvalResult.from_episodes([], num_turns=1, models=["m"])


# ----------------------------------------------------------------------------- one log-prob path
@pytest.mark.parametrize("shared_prompt", [False, True])     # one forward, or a prompt pass reused by both rows
def test_entropy_path_gives_the_policys_log_probs_and_the_distributions_entropy(shared_prompt):
    team = adapter_per_agent_team()
    policy, adapter = team.policy("agent_0"), team.adapter("agent_0")
    prompt = policy.encode([{"role": "user", "content": "2 + 2?"}])
    prompts, completions = [prompt, prompt if shared_prompt else prompt[:-1]], [[18, 19, 20], [21]]
    with torch.no_grad():
        logp, mask, entropy = token_logprobs_with_entropy(policy, adapter, prompts, completions, temperature=0.7)
        expected, expected_mask = policy.token_logprobs(prompts, completions, adapter=adapter, temperature=0.7)
        with policy.using(adapter):
            logits, width, _ = policy.completion_logits(prompts, completions)
    assert torch.equal(mask, expected_mask)
    assert torch.allclose(logp, expected, atol=1e-5)
    assert torch.allclose(entropy, entropy_from_logits(logits / 0.7) * mask, atol=1e-5)
    assert completion_targets(completions, width, policy.pad_id).shape == logp.shape


def test_mappo_trains_with_the_entropy_bonus(tmp_path):
    config = MAPPOConfig(max_new_tokens=4, max_steps=1, episodes_per_step=1, ppo_epochs=1, entropy_coef=0.01,
                         output_dir=str(tmp_path), report_to=(), progress=False, eval_tasks=1)
    history = MAPPOTrainer(debate_env(), adapter_per_agent_team(), config).train()
    assert history[0]["entropy"] > 0


# ----------------------------------------------------------------------------- one shell: seeding, resume, optimizers
def lora_tensors(team: Team, adapter: str) -> dict[str, torch.Tensor]:
    return team.policy(adapter).trainable_state_dict(adapter)


def replay_child(out: str, rng_noise: int, seed: int) -> None:
    """Entry of a fresh process: whatever the global RNG holds (``rng_noise``) when the team is built, train 2 steps
    of MAGRPO and of MAPPO with ``seed``; write every trained adapter tensor to ``out/adapters.safetensors``."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    torch.manual_seed(rng_noise)
    trained = {}
    runs = {"magrpo": (MAGRPOTrainer, MAGRPOConfig(num_generations=2, **REPLAY_SETTINGS)),
            "mappo": (MAPPOTrainer, MAPPOConfig(episodes_per_step=2, minibatch_size=4, ppo_epochs=1,
                                                **REPLAY_SETTINGS))}
    for name, (trainer_cls, config) in runs.items():
        team = Team.adapter_per_agent(*tiny_model(seed=0), 2)           # PEFT draws the adapters from the global RNG
        config = dataclasses.replace(config, seed=seed, output_dir=f"{out}/{name}")
        trainer_cls(SayNumberEnv(num_turns=2), team, config).train()
        for agent in ("agent_0", "agent_1"):
            trained.update({f"{name}/{key}": value for key, value in lora_tensors(team, agent).items()})
    save_file(trained, f"{out}/adapters.safetensors")


REPLAY_SETTINGS = dict(max_new_tokens=4, max_steps=2, eval_tasks=2, learning_rate=1e-2, report_to=(),
                       progress=False)


def train_in_a_fresh_process(out, rng_noise: int, seed: int) -> dict[str, torch.Tensor]:
    import os
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    root = Path(__file__).resolve().parents[2]
    child = subprocess.run(
        [sys.executable, "-c", f"from tests.trainers.test_trainer_base import replay_child; "
                               f"replay_child({str(out)!r}, {rng_noise}, {seed})"],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}, capture_output=True,
        text=True, timeout=900)
    assert child.returncode == 0, child.stderr[-3000:]
    return load_file(str(out / "adapters.safetensors"))


def test_two_fresh_processes_with_one_seed_train_bit_identical_adapters(tmp_path):
    first = train_in_a_fresh_process(tmp_path / "first", rng_noise=1, seed=7)
    again = train_in_a_fresh_process(tmp_path / "again", rng_noise=2, seed=7)
    assert first.keys() == again.keys() and {k.split("/")[0] for k in first} == {"magrpo", "mappo"}
    assert [k for k in first if not torch.equal(first[k], again[k])] == []
    trained = [v for k, v in first.items() if "lora_B" in k]     # zero at initialisation: training moved them
    assert trained and all(v.abs().sum() > 0 for v in trained)


def test_a_fresh_run_draws_untrained_adapters_from_its_seed_and_leaves_trained_ones_alone():
    def team_after_noise(noise: int) -> Team:
        torch.manual_seed(noise)
        return Team.adapter_per_agent(*tiny_model(seed=0), 2)

    a, b, c, d = (team_after_noise(noise) for noise in (1, 2, 3, 4))
    assert not torch.equal(*(next(v for k, v in lora_tensors(t, "agent_0").items() if "lora_A" in k) for t in (a, b)))
    agents = ["agent_0", "agent_1"]
    assert initialise_adapters(a, agents, seed=5) == agents
    initialise_adapters(b, agents, seed=5)
    initialise_adapters(c, agents, seed=6)
    for agent in agents:
        drawn, same, other = (lora_tensors(t, agent) for t in (a, b, c))
        assert all(torch.equal(drawn[k], same[k]) for k in drawn)               # the seed decides, not the RNG
        assert any(not torch.equal(drawn[k], other[k]) for k in drawn if "lora_A" in k)
        assert all(not v.any() for k, v in drawn.items() if "lora_B" in k)      # still the base's own function
    # a later trainer on the same model (the next phase of a curriculum) starts where the first left the adapters
    a.policy("agent_1").load_trainable_state_dict("agent_1", {k.replace(".agent_0.", ".agent_1."): v for k, v in
                                                               lora_tensors(a, "agent_0").items()})
    copied = lora_tensors(a, "agent_1")
    assert initialise_adapters(a, agents, seed=9) == []
    assert all(torch.equal(v, lora_tensors(a, "agent_1")[k]) for k, v in copied.items())
    # an adapter that changes its base (trained, or loaded from a checkpoint) keeps its weights
    with torch.no_grad():
        next(p for n, p in d.policy("agent_1").model.named_parameters() if ".agent_1." in n and "lora_B" in n).add_(1)
    trained = lora_tensors(d, "agent_1")
    assert initialise_adapters(d, agents, seed=5) == ["agent_0"]
    assert all(torch.equal(v, lora_tensors(d, "agent_1")[k]) for k, v in trained.items())


def magrpo_trainer(tmp_path, team: Team, **overrides) -> MAGRPOTrainer:
    values = dict(num_generations=2, max_new_tokens=4, max_steps=2, eval_tasks=2, save_every=1, learning_rate=1e-2,
                  output_dir=str(tmp_path), report_to=("jsonl",), progress=False)
    # the toy env's graded rewards: every step moves the adapters
    return MAGRPOTrainer(SayNumberEnv(num_turns=2), team, MAGRPOConfig(**{**values, **overrides}))


def test_a_trainer_built_to_resume_starts_at_the_checkpoint_with_its_records(tmp_path):
    straight = magrpo_trainer(tmp_path, adapter_per_agent_team())
    history = straight.train()
    assert [r["step"] for r in history] == [1, 2]
    checkpoint = tmp_path / "checkpoints" / "step-000001"
    resumed = magrpo_trainer(tmp_path, adapter_per_agent_team(), resume_from_checkpoint=str(checkpoint))
    assert resumed.step == 1 and resumed.history == history[:1]               # restored when built, as MAPPO
    before = lora_tensors(resumed.team, "agent_0")
    assert not all(torch.equal(v, lora_tensors(straight.team, "agent_0")[k]) for k, v in before.items())
    again = resumed.train()
    assert [r["step"] for r in again] == [2] and [r["step"] for r in resumed.history] == [1, 2]
    assert again[0]["turn0/agent_0/loss"] == pytest.approx(history[1]["turn0/agent_0/loss"], rel=1e-6, abs=1e-9)
    assert all(torch.equal(v, lora_tensors(straight.team, "agent_0")[k])
               for k, v in lora_tensors(resumed.team, "agent_0").items())


@pytest.mark.parametrize("trainer_cls", [MAGRPOTrainer, MAPPOTrainer])
def test_evaluate_takes_a_number_of_held_out_tasks_the_same_way_in_both_trainers(tmp_path, trainer_cls):
    config_cls = MAGRPOConfig if trainer_cls is MAGRPOTrainer else MAPPOConfig
    trainer = trainer_cls(debate_env(), adapter_per_agent_team(),
                          config_cls(max_new_tokens=2, eval_tasks=3, output_dir=str(tmp_path), report_to=(),
                                     progress=False))
    assert trainer.evaluate().num_episodes == 3 and trainer.evaluate(1).num_episodes == 1
    for bad in (0, 4):
        with pytest.raises(ValueError, match="num_tasks must be between 1 and the 3 held-out tasks"):
            trainer.evaluate(bad)


def test_agents_sharing_one_adapter_share_one_optimizer_in_mappo_too(tmp_path):
    torch.manual_seed(0)
    team = Team.shared_adapter(*tiny_model(seed=0), 2)
    config = MAPPOConfig(max_new_tokens=4, max_steps=1, episodes_per_step=1, ppo_epochs=1, minibatch_size=64,
                         eval_tasks=1, output_dir=str(tmp_path), report_to=(), progress=False)
    trainer = MAPPOTrainer(debate_env(), team, config)
    assert trainer.update_groups == {"agent_0": ["agent_0", "agent_1"]}
    assert trainer.optimizers["agent_0"] is trainer.optimizers["agent_1"]
    trainer.train()
    steps = {int(s["step"]) for s in trainer.optimizers["agent_0"].state_dict()["state"].values()}
    assert steps == {1}                   # one minibatch: the shared adapter stepped once, not once per agent
    for optimizer in (trainer.optimizers["agent_0"], trainer.critic_optimizer):
        assert optimizer.param_groups[0]["weight_decay"] == config.weight_decay == 0.01
    assert MAGRPOConfig().weight_decay == 0.0
