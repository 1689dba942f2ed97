"""MAGRPO: advantages, returns, joint actions, per-agent updates, KL, checkpoint resume after SIGKILL."""
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.rollout import Expansion, RolloutEngine, joint_actions
from llm_marl.team import Team
from llm_marl_envs.core import Verdict
from tests.toy_env import SayNumberEnv
from trainers.common.checkpoint import latest_checkpoint, resolve_checkpoint
from trainers.common.incentives import IncentiveWeights, incentive_shaped
from trainers.common.logging import read_metrics
from trainers.experimental import ExperimentalMAGRPOConfig, ExperimentalMAGRPOTrainer
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer, group_advantages
from trainers.magrpo.trainer import TreeNode, sample_diagnostics, sample_values

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def team():
    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    return Team.adapter_per_agent(model, tokenizer, 2)


def small_config(tmp_path, config_cls=MAGRPOConfig, **overrides) -> MAGRPOConfig:
    values = dict(num_generations=3, max_new_tokens=6, max_steps=1, eval_tasks=2, learning_rate=1e-2,
                  output_dir=str(tmp_path), report_to=("jsonl",), progress=False)
    return config_cls(**{**values, **overrides})


def lever_config(tmp_path, **overrides) -> ExperimentalMAGRPOConfig:
    return small_config(tmp_path, ExperimentalMAGRPOConfig, **overrides)


# ----------------------------------------------------------------------------- advantages and returns
@pytest.mark.parametrize("mode, expected", [
    ("mean", [-2.0, -1.0, 0.0, 3.0]),                 # R - mean(R), mean = 3
    ("rloo", [-8 / 3, -4 / 3, 0.0, 4.0]),             # R - mean of the other three
    ("max", [-5.0, -4.0, -3.0, 0.0]),                 # R - max(R)
    ("raw", [1.0, 2.0, 3.0, 6.0]),
])
def test_group_advantages_by_mode(mode, expected):
    values = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)
    assert torch.allclose(group_advantages(values, mode), torch.tensor(expected, dtype=torch.float64))


def test_std_normalisation_and_floor():
    values = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)
    std = math.sqrt(14 / 3)                            # unbiased: squared deviations 4+1+0+9 over G-1
    expected = torch.tensor([-2.0, -1.0, 0.0, 3.0], dtype=torch.float64) / std
    assert torch.allclose(group_advantages(values, "mean", normalize=True), expected)
    flat = torch.tensor([0.0, 0.0, 0.0, 1e-6], dtype=torch.float64)
    floored = group_advantages(flat, "mean", normalize=True, std_floor=1e-4)
    assert floored[3].item() == pytest.approx(0.75e-6 / 1e-4)


@pytest.mark.parametrize("mode", ["mean", "rloo", "max"])
@pytest.mark.parametrize("size", [3, 4, 6, 7])
def test_a_group_of_equal_values_has_exactly_zero_advantage(mode, size):
    """Three rewards of 0.1 have a mean of 0.10000000000000002: rounding must not pass for a signal."""
    values = torch.full((size,), 0.1, dtype=torch.float64)
    for normalize in (False, True):
        assert group_advantages(values, mode, normalize=normalize).tolist() == [0.0] * size
    assert sample_diagnostics([], [group_advantages(values, mode)])["zero_advantage_groups"] == 1.0
    apart = values.clone()
    apart[0] = 0.1 + 1e-9                              # a real difference, however small, is kept
    assert group_advantages(apart, mode).abs().max() > 0


def test_cross_mode_sample_values_average_over_partners():
    node = TreeNode(
        0,
        Expansion(None, {}, {"agent_0": [], "agent_1": []}, joint_actions(2, 2, "cross"), [], [], [], []),
        joint_rewards=[1, 2, 3, 4],
        returns=[1.0, 2.0, 3.0, 4.0],
    )
    # joint actions (0,0) (0,1) (1,0) (1,1) with returns 1 2 3 4
    assert sample_values(node, 0, 2).tolist() == [1.5, 3.5]
    assert sample_values(node, 1, 2).tolist() == [2.0, 3.0]


def test_tree_return_is_reward_plus_discounted_mean_of_children(tmp_path, team):
    trainer = MAGRPOTrainer(SayNumberEnv(), team, small_config(tmp_path, discount=0.5))
    leaf = TreeNode(1, None, joint_rewards=[0.5, 1.5], children=[None, None])
    root = TreeNode(0, None, joint_rewards=[1.0, 0.0], children=[leaf, None])
    assert trainer.compute_returns(root) == [1.0 + 0.5 * 1.0, 0.0]
    assert leaf.returns == [0.5, 1.5]


def test_joint_action_counts_aligned_vs_cross(team):
    assert joint_actions(3, 2, "aligned") == [(0, 0), (1, 1), (2, 2)]
    assert len(joint_actions(3, 2, "cross")) == 9
    engine = RolloutEngine(SayNumberEnv(num_turns=2), team, SamplingParams(max_new_tokens=6), progress=False)
    nodes = engine.reset_nodes([0, 1])
    for mode, count in (("aligned", 3), ("cross", 9)):
        expansions = engine.expand(nodes, 3, mode)
        for node, expansion in zip(nodes, expansions):
            assert len(expansion.children) == count and node.turn == 0          # the node itself is untouched
            for combo, child in zip(expansion.joint, expansion.children):
                assert child.turn == 1
                for agent, g in zip(("agent_0", "agent_1"), combo):
                    assert child.answers[0][agent] == expansion.samples[agent][g].text


# ----------------------------------------------------------------------------- updates
def snapshot(team):
    model = team.policy("agent_0").model
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def changed(before, after, marker):
    return any(not torch.equal(before[n], after[n]) for n in before if marker(n))


def test_update_changes_only_the_agents_own_adapter(tmp_path, team):
    trainer = MAGRPOTrainer(SayNumberEnv(), team, small_config(tmp_path))
    prompt = team.policy("agent_0").encode([{"role": "user", "content": "say 3"}])
    rows = [(prompt, [18, 19, 20], 1.0), (prompt, [21, 22], -1.0)]
    before = snapshot(team)
    trainer._update_agent("agent_0", 0, rows)
    after = snapshot(team)
    assert changed(before, after, lambda n: ".agent_0." in n)
    assert not changed(before, after, lambda n: ".agent_1." in n)
    assert not changed(before, after, lambda n: "lora_" not in n)           # the shared base stays frozen
    trainer._update_agent("agent_1", 0, rows)
    final = snapshot(team)
    assert changed(after, final, lambda n: ".agent_1." in n)
    assert not changed(after, final, lambda n: ".agent_0." in n)


def test_kl_is_zero_at_step_zero_and_positive_after_an_update(tmp_path, team):
    trainer = MAGRPOTrainer(SayNumberEnv(), team, small_config(tmp_path, kl_coef=0.1, learning_rate=5e-2,
                                                               kl_placement="loss"))
    prompt = team.policy("agent_0").encode([{"role": "user", "content": "say 3"}])
    args = ("agent_0", [prompt, prompt], [[18, 19, 20], [21, 22]], torch.tensor([1.0, -1.0]), 2)
    _, kl = trainer.loss(*args)
    assert kl.item() == 0.0
    trainer._update_agent("agent_0", 0, [(prompt, [18, 19, 20], 1.0), (prompt, [21, 22], -1.0)])
    _, kl = trainer.loss(*args)
    assert kl.item() > 0


def test_train_step_logs_per_agent_per_turn_metrics_and_checkpoints(tmp_path, team):
    trainer = MAGRPOTrainer(SayNumberEnv(num_turns=2), team, small_config(tmp_path, max_steps=1, joint_mode="cross",
                                                                          num_generations=2))
    before = snapshot(team)
    trainer.train()
    record = read_metrics(tmp_path)[-1]
    for key in ("turn0/agent_0/loss", "turn1/agent_1/advantage_std", "turn0/agent_1/grad_norm", "tokens_per_s",
                "turn1/return_mean"):
        assert key in record
    assert (tmp_path / "checkpoints" / "step-000001" / "agents" / "agent_1" / "adapter_model.safetensors").is_file()
    assert changed(before, snapshot(team), lambda n: "lora_" in n)
    result = trainer.evaluate()
    assert result.num_episodes == 2 and result.team_reward_ci[0] <= result.team_reward <= result.team_reward_ci[1]


def test_updated_samples_counts_the_samples_with_a_nonzero_advantage(tmp_path, team):
    trainer = MAGRPOTrainer(SayNumberEnv(num_turns=2), team, small_config(tmp_path, max_steps=1, num_generations=3))
    nonzero: dict[str, int] = {}
    advantages_of = trainer.compute_advantages

    def recorded(node, kl=None):
        advantages = advantages_of(node, kl)
        if node.turn == 1:                   # groups whose rewards were all equal: no gradient, so no update
            advantages["agent_1"] = torch.zeros_like(advantages["agent_1"])
        for agent, values in advantages.items():
            key = f"turn{node.turn}/{agent}/updated_samples"
            nonzero[key] = nonzero.get(key, 0) + int((values != 0).sum())
        return advantages

    trainer.compute_advantages = recorded
    record = trainer.train_step()
    assert nonzero and {key: record[key] for key in nonzero} == nonzero
    assert nonzero["turn1/agent_1/updated_samples"] == 0 and nonzero["turn1/agent_0/updated_samples"] > 0


class LastTurnPaysEnv(SayNumberEnv):
    """SayNumberEnv whose answers earn their score only at the last turn, as on an information-split env."""

    def verify_turn(self, answers):
        verdicts = super().verify_turn(answers)
        if self.turn == self.num_turns - 1:
            return verdicts
        return {agent: Verdict(score=0.0, correct=False, details={}) for agent in verdicts}


def test_the_progress_bar_shows_the_reward_of_the_joint_actions_that_end_an_episode(tmp_path, team, capsys):
    config = small_config(tmp_path, num_generations=3, progress=True)
    (logged,) = MAGRPOTrainer(LastTurnPaysEnv(num_turns=2), team, config).train()
    assert logged["joint_reward_mean"] == 0.0 == logged["turn0/joint_reward_mean"]     # turn 0 earns nothing here
    assert logged["final_joint_reward_mean"] == pytest.approx(logged["turn1/joint_reward_mean"])
    assert logged["final_joint_reward_mean"] > 0
    assert f"final_joint_reward_mean={logged['final_joint_reward_mean']:.3f}" in capsys.readouterr().err


def test_config_errors_say_what_to_change():
    with pytest.raises(ValueError, match="num_generations must be >= 2"):
        MAGRPOConfig(num_generations=1)
    with pytest.raises(ValueError, match="joint_mode must be one of"):
        MAGRPOConfig(joint_mode="diagonal")
    with pytest.raises(ValueError, match="advantage_mode"):
        MAGRPOConfig(advantage_mode="median")
    with pytest.raises(ValueError, match="report_to"):
        MAGRPOConfig(report_to=("mlflow",))


def test_too_many_eval_tasks_is_a_clear_error(tmp_path, team):
    with pytest.raises(ValueError, match="lower eval_tasks"):
        MAGRPOTrainer(SayNumberEnv(num_tasks=3), team, small_config(tmp_path, eval_tasks=3))


# ----------------------------------------------------------------------------- resume after SIGKILL
def run_worker(output_dir: Path, max_steps: int, resume: bool = False) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, str(ROOT / "tests" / "magrpo_worker.py"), str(output_dir), str(max_steps)]
    return subprocess.Popen(args + (["--resume"] if resume else []), env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def loss_at(output_dir: Path, step: int) -> float:
    records = [r for r in read_metrics(output_dir) if r["step"] == step]
    return sum(v for k, v in records[-1].items() if k.endswith("/loss"))   # the latest run's record


CHECKPOINT_FILES = {"agents", "optimizers.pt", "schedulers.pt", "trainer_state.pt", "config.json", "team.json"}


def assert_complete_checkpoint(path: Path, agents=("agent_0", "agent_1")) -> None:
    """``path`` holds every file a checkpoint writes, one PEFT adapter folder per agent."""
    assert {p.name for p in path.iterdir()} == CHECKPOINT_FILES, path
    assert {p.name for p in (path / "agents").iterdir()} == set(agents), path
    for agent in agents:
        assert {p.name for p in (path / "agents" / agent).iterdir()} == {"adapter_config.json",
                                                                        "adapter_model.safetensors"}, path


def test_a_crash_while_saving_leaves_the_last_good_checkpoint_the_latest(tmp_path, team, monkeypatch):
    trainer = MAGRPOTrainer(SayNumberEnv(), team, small_config(tmp_path))
    trainer.save()
    good = tmp_path / "checkpoints" / "step-000000"
    assert_complete_checkpoint(good)
    real_save = torch.save

    def crash_on_trainer_state(obj, file, *args, **kwargs):
        if str(file).endswith("trainer_state.pt"):
            raise OSError("disk full (simulated)")
        return real_save(obj, file, *args, **kwargs)

    trainer.step = 1
    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", crash_on_trainer_state)
        with pytest.raises(OSError, match="simulated"):
            trainer.save()                     # weights and optimizer states already written when it fails
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000000"]
    # a SIGKILL mid-write skips the clean-up: its temp dir, half written, must never count as a checkpoint
    (tmp_path / "checkpoints" / ".tmp-step-000002.x1y2" / "agents").mkdir(parents=True)
    assert latest_checkpoint(tmp_path) == good
    assert resolve_checkpoint("latest", tmp_path) == good
    assert_complete_checkpoint(good)


@pytest.mark.timeout(2400)
def test_resume_after_sigkill_reproduces_the_uninterrupted_loss(tmp_path):
    steps = 4
    straight = run_worker(tmp_path / "straight", steps)
    killed = run_worker(tmp_path / "killed", steps)
    first = tmp_path / "killed" / "checkpoints" / "step-000001"
    deadline = time.time() + 1200           # a bound for a hung worker only: a step takes minutes under heavy load
    while not first.exists() and killed.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert first.exists(), killed.stderr.read().decode()[-2000:]
    published = sorted((tmp_path / "killed" / "checkpoints").glob("step-*"))
    for path in published:                     # a kill may leave a hidden temp dir, never a half-written step-*
        assert_complete_checkpoint(path)
    assert latest_checkpoint(tmp_path / "killed") == published[-1]
    resumed_from = int(published[-1].name.split("-")[1])
    assert resumed_from < steps, "the run finished before it could be killed; raise `steps`"
    resumed = run_worker(tmp_path / "killed", steps, resume=True)
    for process in (straight, resumed):
        assert process.wait(timeout=600) == 0, process.stderr.read().decode()[-2000:]
    for step in range(resumed_from + 1, steps + 1):
        assert loss_at(tmp_path / "killed", step) == pytest.approx(
            loss_at(tmp_path / "straight", step), rel=1e-6, abs=1e-9
        )
    assert loss_at(tmp_path / "straight", steps) != 0.0


# ----------------------------------------------------------------------------- MAPoRL incentives
class EvenLengthEnv(SayNumberEnv):
    """SayNumberEnv whose answers are 'correct' when they have an even length: random tiny-model answers mix both."""

    def verify_turn(self, answers):
        verdicts = super().verify_turn(answers)
        for agent, text in answers.items():
            verdicts[agent] = verdicts[agent].__class__(score=float(len(text) % 2 == 0), correct=len(text) % 2 == 0,
                                                        details={})
        return verdicts


def two_agent_bonus(me_before, me_now, other_before, alpha0, alpha1, penalties):
    """MAPoRL's α terms written out for two agents (the other agent is the whole majority)."""
    bonus = alpha0 * me_now * (1 - other_before) + alpha1 * (1 - me_before) * other_before * me_now
    if penalties:
        bonus -= me_before * (1 - me_now) * (alpha0 * (1 - other_before) + alpha1 * other_before)
    return bonus


@pytest.mark.parametrize("penalties", [False, True])
def test_incentives_add_the_mean_bonus_of_the_turn_to_each_joint_reward(tmp_path, team, penalties):
    env = EvenLengthEnv(num_turns=2)
    config = lever_config(tmp_path, num_generations=4, max_new_tokens=5, alpha0=0.3, alpha1=0.2,
                          incentive_penalties=penalties, prompts_per_step=2)
    trainer = ExperimentalMAGRPOTrainer(env, team, config)
    roots = trainer.collect()
    fired = 0
    for root in roots:
        assert root.joint_rewards == [sum(r.values()) / 2 for r in root.expansion.rewards]   # turn 0: no bonus
        for child in root.children:
            for reward, raw, infos in zip(child.joint_rewards, child.expansion.rewards, child.expansion.infos):
                (a0, a1), (b0, b1) = [[int(c) for c in turn] for turn in infos["agent_0"]["correct"]]
                bonus = (two_agent_bonus(a0, b0, a1, 0.3, 0.2, penalties)
                         + two_agent_bonus(a1, b1, a0, 0.3, 0.2, penalties)) / 2
                fired += bonus != 0
                assert reward == pytest.approx(sum(raw.values()) / 2 + bonus)
    assert fired > 0, "the random answers never triggered an incentive: the test checks nothing"


def test_incentives_need_a_correct_table_and_two_agents(tmp_path, team):
    bare = Expansion(None, {}, {}, [(0, 0)], [None], [{"agent_0": 1.0}], [False], [{"agent_0": {}}])
    with pytest.raises(ValueError, match="'correct' table"):
        incentive_shaped(bare, [1.0], IncentiveWeights(alpha0=0.1))
    solo_team = Team.adapter_per_agent(*tiny_model(seed=0), 1)
    with pytest.raises(ValueError, match="at least 2 agents"):
        ExperimentalMAGRPOTrainer(SayNumberEnv(num_agents=1), solo_team, lever_config(tmp_path, alpha1=0.1))
    with pytest.raises(ValueError, match="must be >= 0"):
        lever_config(tmp_path, alpha0=-0.1)
    with pytest.raises(ValueError, match="credit='counterfactual'"):
        lever_config(tmp_path, alpha0=0.1, credit="counterfactual")


def test_final_turn_rewards_credit_the_first_answer_through_the_second_turn_only(tmp_path, team):
    config = lever_config(tmp_path, reward_turns="final", discount=0.5)
    trainer = ExperimentalMAGRPOTrainer(SayNumberEnv(num_turns=2), team, config)
    (root,) = trainer.collect()
    assert root.joint_rewards == [0.0] * config.num_generations
    assert any(sum(r.values()) > 0 for r in root.expansion.rewards)      # the env did reward the first answers
    for child in root.children:
        assert child.joint_rewards == [sum(r.values()) / 2 for r in child.expansion.rewards]
    returns = trainer.compute_returns(root)
    assert returns == pytest.approx([0.5 * sum(child.joint_rewards) / len(child.joint_rewards)
                                     for child in root.children])
    (logged,) = ExperimentalMAGRPOTrainer(SayNumberEnv(num_turns=2), team, config).train()
    assert logged["turn0/joint_reward_mean"] == 0.0           # zeroed: the step's headline is the episodes' ends
    assert logged["joint_reward_mean"] == pytest.approx(logged["turn1/joint_reward_mean"]) and logged[
        "joint_reward_mean"] > 0
    with pytest.raises(ValueError, match="reward_turns must be one of"):
        lever_config(tmp_path, reward_turns="last")
    with pytest.raises(ValueError, match="early termination stops"):
        lever_config(tmp_path, reward_turns="final", early_termination_threshold=0.5)


def test_no_repeat_ngram_keeps_every_training_sample_free_of_repeated_ngrams(tmp_path, team):
    def repeats(ids, n=3):
        grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
        return len(grams) - len(set(grams))

    def sampled_ids(trainer):
        (root,) = trainer.collect()
        return [g.completion_ids for group in root.expansion.samples.values() for g in group]

    loose = dict(temperature=0.1, max_new_tokens=40)
    plain = MAGRPOTrainer(SayNumberEnv(), team, small_config(tmp_path / "plain", **loose))
    assert any(repeats(ids) for ids in sampled_ids(plain)), "the tiny model did not loop: nothing to guard against"
    guarded = ExperimentalMAGRPOTrainer(SayNumberEnv(), team, lever_config(tmp_path / "guarded", no_repeat_ngram=3,
                                                                            **loose))
    assert guarded.sampling.no_repeat_ngram == 3
    samples = sampled_ids(guarded)
    assert all(len(ids) > 6 and repeats(ids) == 0 for ids in samples)
    with pytest.raises(ValueError, match="no_repeat_ngram must be >= 0"):
        lever_config(tmp_path, no_repeat_ngram=-1)


def test_agents_that_share_one_adapter_take_one_step_per_turn_on_all_their_samples(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    team = Team.shared_adapter(model, tokenizer, 2)
    assert team.adapter("agent_0") == team.adapter("agent_1") == "shared"
    config = small_config(tmp_path, save_every=1)
    trainer = MAGRPOTrainer(SayNumberEnv(num_turns=2), team, config)
    assert trainer.update_groups == {"agent_0": ["agent_0", "agent_1"]}
    assert trainer.optimizers["agent_0"] is trainer.optimizers["agent_1"]
    stepped = []
    update_agent = trainer._update_agent
    monkeypatch.setattr(trainer, "_update_agent",
                        lambda agent, turn, rows: stepped.append((agent, turn, len(rows))) or update_agent(agent, turn,
                                                                                                           rows))
    before = {k: v.clone() for k, v in team.policy("agent_0").trainable_state_dict("shared").items()}
    trainer.train()
    g = config.num_generations
    assert sorted(stepped) == [("agent_0", 0, 2 * g), ("agent_0", 1, 2 * g * g)]   # both agents' samples, one step
    state = trainer.optimizers["agent_0"].state_dict()["state"]
    assert {int(s["step"]) for s in state.values()} == {2}          # one optimiser step per turn, not per agent
    after = team.policy("agent_0").trainable_state_dict("shared")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    resumed = MAGRPOTrainer(SayNumberEnv(num_turns=2), Team.shared_adapter(*tiny_model(seed=0), 2), config)
    resumed.load(trainer.latest_checkpoint())
    assert all(torch.equal(after[k], v) for k, v in resumed.team.policy("agent_1").trainable_state_dict("shared")
               .items())
    with pytest.raises(ValueError, match="share one adapter"):
        MAGRPOTrainer(SayNumberEnv(), Team.shared_adapter(*tiny_model(seed=0), 2), small_config(
            tmp_path, agent_learning_rates={"agent_1": 1e-3}))
