"""Where the papers' reference code and ours could differ: the default follows the paper, the rest is an option.

MAPPO (MAPoRL): advantages whitened per (turn, agent); α penalties for correct -> incorrect; incentives
read the answer labels even with a learned verifier; the critic keeps the task when it truncates and
refuses agents whose token ids it cannot read. MAGRPO (CoMLRL): KL in the return, early termination
on a node's mean reward, the last turn updated first.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from llm_marl.models import tiny_model
from llm_marl.team import Team, default_lora_config
from tests.toy_env import SayNumberEnv
from tests.trainers.test_mappo_trainer import build_trainer
from trainers.common.incentives import IncentiveWeights, incentive_bonuses
from trainers.experimental import ExperimentalMAGRPOConfig
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer
from trainers.mappo import MAPPOConfig, MAPPOTrainer
from trainers.mappo.critic import CentralizedCritic, critic_context_parts

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- MAPPO incentives
def test_alpha_penalties_fire_on_correct_to_incorrect_only_when_asked():
    correct = [[1, 0, 0], [0, 0, 0],          # agent 0 right, others wrong -> agent 0 follows them: -α0
               [1, 1, 1], [0, 1, 1]]          # agent 0 right, others right -> agent 0 breaks its answer: -α1
    first, second = correct[:2], correct[2:]
    on = IncentiveWeights(alpha0=1.0, alpha1=2.0, penalties=True)
    off = IncentiveWeights(alpha0=1.0, alpha1=2.0, penalties=False)
    assert incentive_bonuses(first, on).tolist() == [[0, 0, 0], [-1, 0, 0]]
    assert incentive_bonuses(second, on).tolist() == [[0, 0, 0], [-2, 0, 0]]
    assert incentive_bonuses(first, off).tolist() == [[0, 0, 0], [0, 0, 0]]
    assert incentive_bonuses(second, off).tolist() == [[0, 0, 0], [0, 0, 0]]
    assert MAPPOConfig().incentives.penalties is True            # the reference's behaviour is the default
    assert MAPPOConfig(incentive_penalties=False).incentives.penalties is False
    # one default for every trainer that offers the incentives, the weights' own
    assert IncentiveWeights().penalties is ExperimentalMAGRPOConfig().incentives.penalties is True


def test_incentives_use_labels_even_with_a_learned_verifier(tmp_path):
    trainer = build_trainer(tmp_path)                            # a tiny random learned verifier
    episodes = trainer.collect(1)
    for episode in episodes:
        outcome = trainer.score(episode)
        labels = [[turn[a].correct for a in trainer.agents] for turn in episode.turns]
        predicted = [[v.correct for v in trainer.verifier.score_batch(
            [(trainer.question(episode), turn[a].text) for a in trainer.agents])] for turn in episode.turns]
        assert outcome.correct == labels
        assert outcome.extras["predicted_correct"] == predicted


# ----------------------------------------------------------------------------- MAPPO whitening
def whitened_groups(tmp_path, scope):
    trainer = build_trainer(tmp_path / scope, whiten_scope=scope, episodes_per_step=4)
    responses = trainer.compute_rewards(trainer.collect(1))
    trainer.compute_advantages(responses)
    groups = {}
    for r in responses:
        groups.setdefault((r.turn, r.agent), []).append(r.advantages)
    return {key: torch.cat(parts) for key, parts in groups.items()}, torch.cat([r.advantages for r in responses])


def test_advantages_are_whitened_per_turn_and_agent_by_default(tmp_path):
    assert MAPPOConfig().whiten_scope == "turn_agent"
    groups, _ = whitened_groups(tmp_path, "turn_agent")
    assert len(groups) == 4
    for values in groups.values():
        assert abs(float(values.mean())) < 1e-4 and float(values.std()) == pytest.approx(1.0, abs=1e-3)
    groups, everything = whitened_groups(tmp_path, "all")
    assert abs(float(everything.mean())) < 1e-4 and float(everything.std()) == pytest.approx(1.0, abs=1e-3)
    assert max(abs(float(v.mean())) for v in groups.values()) > 1e-3    # groups are not centred one by one
    with pytest.raises(ValueError, match="whiten_scope must be one of"):
        MAPPOConfig(whiten_scope="batch")


# ----------------------------------------------------------------------------- MAPPO critic
@pytest.fixture(scope="module")
def critic():
    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, 2)
    return CentralizedCritic(team.policy("agent_0"), max_context_tokens=60, seed=0)


def test_critic_truncation_keeps_the_task_and_drops_the_oldest_turns(critic):
    task = "TASK: what is 17 + 25?"
    answers = [{"agent_0": f"turn {t} says " + "blah " * 12, "agent_1": f"other {t} " + "word " * 12} for t in range(4)]
    parts = critic_context_parts(task, answers, "agent_0", 3)
    ids = critic.context_ids(parts)
    text = critic.policy.tokenizer.decode(ids)
    assert len(ids) <= 60
    assert text.startswith("Task:\n" + task)                       # the task survives
    assert text.rstrip().endswith("Turn 3, agent_0 answers:")      # so does the agent's own header
    assert "other 3" in text                                       # the latest answer is kept
    assert "turn 0 says" not in text                               # the oldest went first
    whole = critic.context_ids("\n\n".join(parts))                 # a plain string keeps only its tail
    assert task not in critic.policy.tokenizer.decode(whole)


def test_critic_refuses_agents_whose_tokenizer_differs():
    torch.manual_seed(0)
    model_a, tokenizer_a = tiny_model(seed=0)
    model_b, tokenizer_b = tiny_model(seed=1)
    tokenizer_b = copy.deepcopy(tokenizer_b)
    tokenizer_b.add_tokens(["<only-in-b>"])
    model_b.resize_token_embeddings(len(tokenizer_b))
    team = Team.separate([(model_a, tokenizer_a), (model_b, tokenizer_b)], lora_config=default_lora_config())
    with pytest.raises(ValueError, match="different tokenizer from the critic"):
        MAPPOTrainer(SayNumberEnv(), team, MAPPOConfig(output_dir="unused", progress=False))


# ----------------------------------------------------------------------------- MAGRPO
@pytest.fixture()
def team():
    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    return Team.adapter_per_agent(model, tokenizer, 2)


def magrpo(tmp_path, team, env=None, **overrides):
    values = dict(num_generations=3, max_new_tokens=6, max_steps=1, eval_tasks=2, learning_rate=5e-2,
                  output_dir=str(tmp_path), report_to=("jsonl",), progress=False)
    return MAGRPOTrainer(env or SayNumberEnv(), team, MAGRPOConfig(**{**values, **overrides}))


def test_kl_enters_the_return_by_default(tmp_path, team):
    trainer = magrpo(tmp_path, team, kl_coef=0.5)
    assert trainer.config.kl_placement == "reward"
    roots = trainer.collect()
    for root in roots:
        trainer.compute_returns(root)
    node = roots[0]
    rows = [(g.prompt_ids, g.completion_ids) for g in node.expansion.samples["agent_0"]]
    assert torch.all(trainer.sequence_kls("agent_0", rows) == 0)           # adapters start at zero: π = reference
    trainer._update_agent("agent_0", 0, [(p, c, 1.0 - i) for i, (p, c) in enumerate(rows)])
    kl = trainer.sequence_kls("agent_0", rows)
    assert torch.all(kl >= 0) and float(kl.sum()) > 0
    plain = trainer.compute_advantages(node)["agent_0"]
    penalised = trainer.compute_advantages(node, {"agent_0": kl})["agent_0"]
    expected = plain - 0.5 * (kl.double() - kl.double().mean())          # mean baseline: A = (R - βkl) - mean(R - βkl)
    assert torch.allclose(penalised, expected, atol=1e-6)
    loss, loss_kl = trainer.loss(
        "agent_0", [r[0] for r in rows], [r[1] for r in rows], torch.ones(len(rows)), len(rows)
    )
    assert loss_kl.item() == 0.0                                          # and not in the loss


def test_early_termination_on_the_node_mean_or_per_joint_action(tmp_path, team):
    node_mean = magrpo(tmp_path, team, early_termination_threshold=0.5)
    assert node_mean.config.early_termination == "node_mean"
    assert node_mean.stops_here([0.0, 1.0, 1.0])          # mean 0.67 > 0.5: the whole node stops
    assert not node_mean.stops_here([0.0, 0.0, 1.0])      # mean 0.33: every branch goes on, even the 1.0
    branch = magrpo(tmp_path, team, early_termination_threshold=0.5, early_termination="joint_action")
    assert branch.stops_here([1.0]) and not branch.stops_here([0.0])
    two_turns = SayNumberEnv(num_turns=2)
    everything = magrpo(tmp_path, team, env=two_turns, early_termination_threshold=-1.0).collect()
    assert all(child is None for root in everything for child in root.children)
    full = magrpo(tmp_path, team, env=two_turns).collect()
    assert all(child is not None for root in full for child in root.children)


@pytest.mark.parametrize("order, expected", [("last_turn_first", [1, 1, 0, 0]), ("first_turn_first", [0, 0, 1, 1])])
def test_update_order(tmp_path, team, order, expected):
    trainer = magrpo(tmp_path, team, env=SayNumberEnv(num_turns=2), update_order=order, num_generations=2)
    turns, real = [], trainer._update_agent

    def recording(agent, turn, rows):
        turns.append(turn)
        return real(agent, turn, rows)

    trainer._update_agent = recording
    roots = trainer.collect()
    for root in roots:
        trainer.compute_returns(root)
    trainer.update(roots)
    assert turns == expected
    assert MAGRPOConfig().update_order == "last_turn_first"
    with pytest.raises(ValueError, match="update_order must be one of"):
        MAGRPOConfig(update_order="random")
    assert np.isfinite(trainer.evaluate(1).team_reward)
