"""Counterfactual per-message credit (``ExperimentalMAGRPOConfig(credit="counterfactual")``): hand-computed credits
on a scripted debate, zero credit for a message that cannot matter, an untouched transcript, batched replays, real
updates."""
from __future__ import annotations

import copy

import pytest
import torch

from llm_marl.models import tiny_model
from llm_marl.policy import Generation, SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.team import Team
from llm_marl_envs.core import TextEnv
from tests.toy_env import SayNumberEnv
from trainers.common.logging import read_metrics
from trainers.experimental import ExperimentalMAGRPOConfig, ExperimentalMAGRPOTrainer
from trainers.experimental.counterfactual import (
    MessageReplay,
    collect_counterfactual,
    completions_per_transcript,
    team_outcome,
)
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer, group_advantages
from verifiers import Verdict


class GuessEnv(TextEnv):
    """Agents guess the task's number; reward 1 for the number, else 0. From turn 1 each agent sees the others'
    last answers as ``"agent_k: X"`` lines."""

    metadata = {"name": "guess", "render_modes": ["human", "ansi"], "is_parallelizable": True}

    def load_tasks(self):
        return [{"task_id": "seven", "number": "7"}]

    def first_prompt(self, agent_index, task):
        return [{"role": "user", "content": "Guess the number."}]

    def verify_turn(self, answers):
        return {a: Verdict(score=float(text == self.task["number"]), correct=text == self.task["number"], details={})
                for a, text in answers.items()}

    def next_prompt(self, agent_index):
        me = self.possible_agents[agent_index]
        return "\n".join(f"{a}: {text}" for a, text in self.answers[-1].items() if a != me)


class ConsensusGuessEnv(GuessEnv):
    """:class:`GuessEnv` that ends as soon as every agent gave the same answer."""

    def should_stop_early(self):
        return len(set(self.answers[-1].values())) == 1


class ScriptedPolicy:
    """A deterministic policy: ``script(agent, turn, conversation)`` lists an agent's possible answers in a context.
    Within one generate call, the j-th request for the same agent and conversation gets option ``j % len(options)``:
    a context asked once always gets its first option, a context asked K+1 times its first K+1 options."""

    name = "scripted"

    def __init__(self, script) -> None:
        self.script = script
        self.calls: list[int] = []     # requests per generate call

    def generate(self, conversations, params, *, adapters=None, num_samples=1):
        self.calls.append(len(conversations) * num_samples)
        asked: dict[str, int] = {}
        out = []
        for conversation, agent in zip(conversations, adapters):
            turn = sum(m["role"] == "assistant" for m in conversation)
            options = self.script(agent, turn, conversation)
            samples = []
            for _ in range(num_samples):
                key = repr((agent, conversation))
                j = asked[key] = asked.get(key, -1) + 1
                text = options[j % len(options)]
                samples.append(Generation(text, prompt_ids=[1], completion_ids=[ord(c) for c in text]))
            out.append(samples)
        return out


def partner_said(conversation) -> str:
    return conversation[-1]["content"].split(": ")[1]


def own_last(conversation) -> str:
    return [m["content"] for m in conversation if m["role"] == "assistant"][-1]


def debate_script(breaker: bool):
    """agent_0 answers 7 (or 5) and then keeps its answer; agent_1 answers 5 (or 9) and then copies agent_0,
    except that with ``breaker`` its first turn-1 option is a wrong 3."""
    def script(agent, turn, conversation):
        if turn == 0:
            return ["7", "5"] if agent == "agent_0" else ["5", "9"]
        if agent == "agent_0":
            return [own_last(conversation), "3"]
        return ["3", partner_said(conversation)] if breaker else [partner_said(conversation), "3"]
    return script


def scripted_engine(script, env: TextEnv | None = None) -> tuple[RolloutEngine, ScriptedPolicy]:
    policy = ScriptedPolicy(script)
    team = Team.from_policies({"agent_0": (policy, "agent_0"), "agent_1": (policy, "agent_1")})
    env = env or GuessEnv(num_agents=2, num_turns=2)
    return RolloutEngine(env, team, SamplingParams(max_new_tokens=4), progress=False), policy


def replays_by_message(breaker: bool, outcome: str = "final_turn", k: int = 1):
    engine, policy = scripted_engine(debate_script(breaker))
    batch = collect_counterfactual(engine, engine.reset_nodes([0]), k, engine.params, outcome)
    return {(r.turn, r.agent): r for r in batch.replays}, batch, policy


def credits(replays, mode="mean"):
    """Per message: the advantages of its group (the transcript's message first), as the trainer computes them."""
    return {key: group_advantages(torch.tensor(r.outcomes, dtype=torch.float64), mode).tolist()
            for key, r in replays.items()}


# ----------------------------------------------------------------------------- hand-computed credits
def test_credits_equal_hand_computed_values_on_a_scripted_debate():
    replays, batch, _ = replays_by_message(breaker=False)
    # transcript: turn 0 agent_0 "7" (right), agent_1 "5" (wrong); turn 1 both "7": final-turn outcome 1
    assert [{a: g.text for a, g in m.items()} for m in batch.transcripts[0].messages] == [
        {"agent_0": "7", "agent_1": "5"}, {"agent_0": "7", "agent_1": "7"}]
    assert {key: [g.text for g in r.alternatives] for key, r in replays.items()} == {
        (0, "agent_0"): ["5"], (0, "agent_1"): ["9"], (1, "agent_0"): ["3"], (1, "agent_1"): ["3"]}
    # (turn 0, agent_0): alternative "5" -> agent_0 keeps it, agent_1 copies it: both wrong at the end, 0
    assert replays[(0, "agent_0")].outcomes == [1.0, 0.0]
    # (turn 0, agent_1): agent_1's first answer is never read -> 1 whatever it says
    assert replays[(0, "agent_1")].outcomes == [1.0, 1.0]
    # turn 1: alternative "3" with the partner's "7" fixed: one of two right, 0.5
    assert replays[(1, "agent_0")].outcomes == [1.0, 0.5]
    assert replays[(1, "agent_1")].outcomes == [1.0, 0.5]
    got = credits(replays)
    assert got[(0, "agent_0")] == [0.5, -0.5]                 # R - mean(1, 0)
    assert got[(0, "agent_1")] == [0.0, 0.0]                  # cannot change the outcome: zero credit
    assert got[(1, "agent_0")] == [0.25, -0.25]               # R - mean(1, 0.5)
    assert got[(1, "agent_1")] == [0.25, -0.25]
    # C3's leave-one-out baseline: R - mean of the others
    assert credits(replays, "rloo")[(0, "agent_0")] == [1.0, -1.0]


def test_a_turn_one_answer_that_breaks_the_right_answer_is_blamed():
    replays, batch, _ = replays_by_message(breaker=True)
    # transcript: agent_1 answers 3 at turn 1 although agent_0 said 7: final-turn outcome 0.5
    assert batch.transcripts[0].messages[1]["agent_1"].text == "3"
    assert replays[(1, "agent_1")].outcomes == [0.5, 1.0]                  # its alternative "7" fixes it
    got = credits(replays)
    assert got[(1, "agent_1")] == [-0.25, 0.25]
    # agent_0's right turn-0 answer still earns credit: its alternative "5" makes both wrong
    assert replays[(0, "agent_0")].outcomes == [0.5, 0.0]
    assert got[(0, "agent_0")] == [0.25, -0.25]
    assert got[(0, "agent_1")] == [0.0, 0.0]                               # agent_1's turn 0 still cannot matter


def test_episodes_that_end_early_are_scored_at_their_last_turn():
    engine, policy = scripted_engine(debate_script(False), ConsensusGuessEnv(num_agents=2, num_turns=3))
    batch = collect_counterfactual(engine, engine.reset_nodes([0]), 1, engine.params)
    replays = {(r.turn, r.agent): r for r in batch.replays}
    # transcript: (7, 5), then (7, 7): consensus ends it after turn 1, outcome 1
    assert len(batch.transcripts[0].nodes) == 2
    # (turn 0, agent_0) "5": (5, 5) is a consensus, the branch ends at turn 0 with both wrong
    assert replays[(0, "agent_0")].outcomes == [1.0, 0.0]
    # (turn 0, agent_1) "9": (7, 9), then (7, 7)
    assert replays[(0, "agent_1")].outcomes == [1.0, 1.0]
    # (turn 1, agent_0) "3": (3, 7), then agent_0 keeps 3 and agent_1 copies it: (3, 3), both wrong at turn 2
    assert replays[(1, "agent_0")].outcomes == [1.0, 0.0]
    # (turn 1, agent_1) "3": (7, 3), then agent_1 copies 7 again: (7, 7), the damage is undone
    assert replays[(1, "agent_1")].outcomes == [1.0, 1.0]
    # turn 0: 2 prompts x 2; turn 1: the transcript's 2 x 2 and one live branch's 2; turn 2: two branches' 2 each
    assert policy.calls == [4, 6, 4] and batch.completions_sampled == 14


def test_episode_mean_outcome_counts_every_turn():
    replays, _, _ = replays_by_message(breaker=False, outcome="episode_mean")
    # transcript rewards: turn 0 (1, 0), turn 1 (1, 1) -> 3/4; alternative "5" at turn 0: (0, 0), (0, 0) -> 0
    assert replays[(0, "agent_0")].outcomes == [0.75, 0.0]
    assert replays[(0, "agent_1")].outcomes == [0.75, 0.75]    # agent_1's turn-0 reward is 0 for both 5 and 9
    assert team_outcome([{"a": 1.0, "b": 0.0}, {"a": 1.0, "b": 1.0}], "final_turn") == 1.0
    with pytest.raises(ValueError, match="counterfactual_reward must be one of"):
        team_outcome([{"a": 1.0}], "best_turn")


# ----------------------------------------------------------------------------- batching and accounting
def test_one_generate_call_per_turn_and_the_compute_is_counted():
    _, batch, policy = replays_by_message(breaker=False, k=2)
    # turn 0: both agents' transcript prompts, 3 times each; turn 1: the same, plus the 4 branches of the turn-0
    # alternatives (2 agents each)
    assert policy.calls == [6, 6 + 8]
    assert batch.completions_sampled == completions_per_transcript(2, 2, 2) == 4 + 8 + 8
    assert batch.answer_tokens_sampled == 20           # every scripted answer is one character (one token here)
    assert completions_per_transcript(3, 3, 4) == 9 + 36 + 4 * 9 * 3


def test_k_below_one_is_refused():
    engine, _ = scripted_engine(debate_script(False))
    with pytest.raises(ValueError, match="counterfactual_samples .* must be >= 1, got 0"):
        collect_counterfactual(engine, engine.reset_nodes([0]), 0, engine.params)


# ----------------------------------------------------------------------------- the transcript is never changed
def env_state(env: TextEnv):
    return (env.turn, list(env.agents), copy.deepcopy(env.messages), copy.deepcopy(env.answers),
            [{a: v.to_dict() for a, v in turn.items()} for turn in env.verdicts], dict(env.task or {}), env._ended,
            copy.deepcopy(env.np_random.bit_generator.state))


@pytest.mark.parametrize("breaker", [False, True])
def test_replay_never_changes_the_transcript_it_branches_from(breaker):
    engine, _ = scripted_engine(debate_script(breaker))
    template = env_state(engine.env)
    batch = collect_counterfactual(engine, engine.reset_nodes([0], seeds=[3]), 2, engine.params)
    transcript = batch.transcripts[0]
    # replaying the transcript's own messages on a fresh env gives, turn by turn, exactly its recorded envs
    # and rewards: no branch stepped them
    fresh = engine.reset_nodes([0], seeds=[3])[0]
    for turn, (node, messages, rewards) in enumerate(zip(transcript.nodes, transcript.messages, transcript.rewards)):
        assert env_state(node) == env_state(fresh)
        assert node.turn == turn
        _, replayed, _, _, _ = fresh.step({a: g.text for a, g in messages.items()})
        assert replayed == rewards
    assert not fresh.agents and len(transcript.nodes) == 2
    assert env_state(engine.env) == template
    # every message was replayed, with its own outcome per alternative
    assert sorted((r.turn, r.agent) for r in batch.replays) == [(0, "agent_0"), (0, "agent_1"), (1, "agent_0"),
                                                                (1, "agent_1")]
    assert all(len(r.outcomes) == 3 and len(r.alternatives) == 2 for r in batch.replays)


# ----------------------------------------------------------------------------- config
def test_bad_counterfactual_settings_are_clear_errors():
    with pytest.raises(ValueError, match="counterfactual_samples .* must be an int >= 1, got 0"):
        ExperimentalMAGRPOConfig(credit="counterfactual", counterfactual_samples=0)
    with pytest.raises(ValueError, match="credit must be one of"):
        ExperimentalMAGRPOConfig(credit="shapley")
    with pytest.raises(ValueError, match="counterfactual_reward must be one of"):
        ExperimentalMAGRPOConfig(credit="counterfactual", counterfactual_reward="best")
    with pytest.raises(ValueError, match="counterfactual_update must be one of"):
        ExperimentalMAGRPOConfig(credit="counterfactual", counterfactual_update="some")
    with pytest.raises(ValueError, match="joint_mode='cross' does not apply"):
        ExperimentalMAGRPOConfig(credit="counterfactual", joint_mode="cross")
    with pytest.raises(ValueError, match="early_termination_threshold"):
        ExperimentalMAGRPOConfig(credit="counterfactual", early_termination_threshold=0.5)
    with pytest.raises(ValueError, match="kl_placement='loss'"):
        ExperimentalMAGRPOConfig(credit="counterfactual", kl_coef=0.1)
    assert ExperimentalMAGRPOConfig().credit == "group"


# ----------------------------------------------------------------------------- training with a real (tiny) model
@pytest.fixture()
def team():
    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    return Team.adapter_per_agent(model, tokenizer, 2)


def lora_weights(team):
    return {n: p.detach().clone() for n, p in team.policy("agent_0").model.named_parameters() if "lora_" in n}


@pytest.mark.parametrize("update", ["all", "transcript"])
def test_a_counterfactual_step_updates_the_weights_and_logs_its_compute(tmp_path, team, update):
    config = ExperimentalMAGRPOConfig(credit="counterfactual", counterfactual_samples=2, counterfactual_update=update,
                                      max_new_tokens=6, max_steps=1, eval_tasks=2, learning_rate=1e-2,
                                      output_dir=str(tmp_path), report_to=("jsonl",), progress=False)
    trainer = ExperimentalMAGRPOTrainer(SayNumberEnv(num_turns=2), team, config)
    before = lora_weights(team)
    trainer.train()
    after = lora_weights(team)
    for agent in ("agent_0", "agent_1"):
        assert any(not torch.equal(before[n], after[n]) for n in before if f".{agent}." in n)
    record = read_metrics(tmp_path)[-1]
    assert record["completions_sampled"] == completions_per_transcript(2, 2, 2)
    group = MessageReplay(0, 0, "agent_0", None, [None, None], outcomes=[1.0, 1.0, 0.0])
    assert trainer.counterfactual_advantages(group).tolist() == pytest.approx([1 / 3, 1 / 3, -2 / 3], abs=1e-12)
    assert record["answer_tokens_sampled"] > 0
    for key in ("turn0/agent_0/credit_mean", "turn1/agent_1/loss", "turn1/agent_0/reward_std",
                "turn0/agent_1/advantage_std", "turn1/joint_reward_mean", "team_outcome_mean", "joint_reward_mean",
                "tokens_per_s"):
        assert key in record
    # every transcript ends at turn 1 and each of its two messages there is replayed once: the same mean
    assert record["final_joint_reward_mean"] == pytest.approx(record["turn1/joint_reward_mean"])


def test_group_credit_logs_the_same_compute_counters(tmp_path, team):
    config = MAGRPOConfig(num_generations=2, max_new_tokens=6, max_steps=1, eval_tasks=2, output_dir=str(tmp_path),
                          report_to=("jsonl",), progress=False)
    MAGRPOTrainer(SayNumberEnv(num_turns=2), team, config).train()
    record = read_metrics(tmp_path)[-1]
    assert record["completions_sampled"] == 2 * 2 + 2 * 2 * 2     # turn 0: 2 agents x G; turn 1: G children x 2 x G
    assert record["answer_tokens_sampled"] > 0
