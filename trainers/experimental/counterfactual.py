"""Counterfactual per-message credit (C3-style): the rollout behind
``ExperimentalMAGRPOConfig(credit="counterfactual")``.

For one sampled transcript of N agents over T turns, the message of agent i at turn t is scored by
its effect on the team's outcome, measured by replaying the episode from the frozen transcript up
to that message:

1. Each task is played once (the transcript); the env before every turn is kept, the frozen
   context of that turn's messages.
2. For every message (t, i), K alternative messages of agent i are sampled from that same
   context. Each alternative is stepped on a clone of the env before turn t together with the
   other agents' transcript messages of turn t, and the rest of its episode (turns t+1, ...,
   every agent) is sampled afresh.

   :func:`collect_counterfactual` does both level by level through the one rollout engine: at
   each turn ONE :meth:`RolloutEngine.sample` call (one generate call per policy) holds every
   transcript's prompts, each asked K+1 times (its message and its K alternatives), and every
   live branch's prompts, asked once.
3. The outcome R of a transcript or branch is :func:`team_outcome` of its rewards (the agents' mean
   reward at the final turn, or over every turn). A message's group is R_0 (the transcript's own
   outcome) and R_1..R_K (its alternatives); the trainer turns it into advantages with MAGRPO's
   group baselines, so the transcript message's credit is ``R_0 - mean(R_0..R_K)`` by default.

A message that cannot change the outcome gets the same R in every branch, hence zero credit; a
turn-1 answer that turns the team's right answer wrong is blamed for it. The replay never changes
the transcript: every branch steps its own clone.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from llm_marl.policy import Generation, SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl_envs.core import TextEnv

TEAM_OUTCOMES = ("final_turn", "episode_mean")


@dataclass
class Transcript:
    """One sampled episode, with the env before every turn (never modified)."""

    nodes: list[TextEnv] = field(default_factory=list)                    # env before turn t
    messages: list[dict[str, Generation]] = field(default_factory=list)   # per turn: agent -> its message
    rewards: list[dict[str, float]] = field(default_factory=list)         # per turn: agent -> env reward


@dataclass
class MessageReplay:
    """One transcript message and its K alternatives from the same context, with every branch's outcome."""

    transcript: int                  # index in the batch's transcripts
    turn: int
    agent: str
    actual: Generation               # the transcript's message
    alternatives: list[Generation]   # K samples of the agent from the same context
    outcomes: list[float]            # R_0 (the transcript), then R_1..R_K (one per alternative)


@dataclass
class CounterfactualBatch:
    """What one counterfactual step sampled: the transcripts, every message's replay, and the compute spent."""

    transcripts: list[Transcript]
    replays: list[MessageReplay]
    completions_sampled: int         # completions generated: transcripts + alternatives + continuations
    answer_tokens_sampled: int       # their completion tokens


def team_outcome(rewards: Sequence[Mapping[str, float]], outcome: str = "final_turn") -> float:
    """The team's score of an episode from its per-turn rewards: ``final_turn`` (the agents' mean reward at the
    last turn played) or ``episode_mean`` (the mean over every agent and turn)."""
    if not rewards:
        raise ValueError("team_outcome needs the rewards of at least one turn")
    if outcome == "final_turn":
        return float(np.mean(list(rewards[-1].values())))
    if outcome == "episode_mean":
        return float(np.mean([r for turn in rewards for r in turn.values()]))
    raise ValueError(f"counterfactual_reward must be one of {TEAM_OUTCOMES}, got {outcome!r}")


def completions_per_transcript(num_agents: int, num_turns: int, num_alternatives: int) -> int:
    """Completions one transcript costs with K alternatives per message when no episode stops early:
    ``N·T`` (the transcript) ``+ N·T·K`` (alternatives) ``+ K·N²·T(T-1)/2`` (the rest of each branch)."""
    n, t, k = num_agents, num_turns, num_alternatives
    return n * t + n * t * k + k * n * n * t * (t - 1) // 2


@dataclass
class _Branch:
    """An alternative's episode in progress: its own env, the replay and slot it scores, its rewards so far."""

    env: TextEnv
    replay: MessageReplay
    slot: int                        # index of its outcome in replay.outcomes (1..K)
    rewards: list[dict[str, float]]


def _step(env: TextEnv, actions: Mapping[str, Generation]) -> dict[str, float]:
    _, rewards, _, _, _ = env.step({agent: generation.text for agent, generation in actions.items()})
    return {agent: float(reward) for agent, reward in rewards.items()}


def collect_counterfactual(engine: RolloutEngine, nodes: Sequence[TextEnv], num_alternatives: int,
                           params: SamplingParams, outcome: str = "final_turn") -> CounterfactualBatch:
    """Transcripts of the freshly reset envs ``nodes`` and every message's K replayed alternatives (steps 1-2 of the
    module docstring); ``nodes`` are not stepped.

    Transcripts and branches advance together, one level (turn) at a time, and every level is ONE
    :meth:`RolloutEngine.sample` call (one generate call per policy): each transcript prompt is asked K+1 times
    (its message and the K alternatives, from the same context), each live branch prompt once (the rest of that
    alternative's episode). An alternative is stepped on a clone of the env before its turn, with the other agents'
    transcript messages of that turn; each branch then steps its own env, so no transcript env is ever stepped.
    """
    if num_alternatives < 1:
        raise ValueError(f"counterfactual_samples (K alternatives per message) must be >= 1, got {num_alternatives}")
    asks = num_alternatives + 1
    transcripts = [Transcript() for _ in nodes]
    replays: list[MessageReplay] = []
    sampled: list[Generation] = []
    live = [(index, node) for index, node in enumerate(nodes)]     # transcript index, env before its next turn
    branches: list[_Branch] = []
    level = 0
    while live or branches:
        requests = [(agent, [dict(m) for m in node.messages[agent]])
                    for _, node in live for agent in node.agents for _ in range(asks)]
        requests += [(agent, [dict(m) for m in branch.env.messages[agent]])
                     for branch in branches for agent in branch.env.agents]
        generations = iter(samples[0] for samples in engine.sample(requests, params=params.for_call(level)))
        next_live, next_branches = [], []
        for index, node in live:
            transcript = transcripts[index]
            drawn = {agent: [next(generations) for _ in range(asks)] for agent in node.agents}
            actual = {agent: samples[0] for agent, samples in drawn.items()}
            child = node.clone()
            transcript.nodes.append(node)
            transcript.messages.append(actual)
            transcript.rewards.append(_step(child, actual))
            if child.agents:
                next_live.append((index, child))
            for agent, samples in drawn.items():
                replay = MessageReplay(index, node.turn, agent, samples[0], samples[1:], [0.0] * asks)
                replays.append(replay)
                for slot, alternative in enumerate(replay.alternatives, start=1):
                    env = node.clone()
                    rewards = _step(env, {**actual, agent: alternative})
                    next_branches.append(_Branch(env, replay, slot, transcript.rewards[:-1] + [rewards]))
            sampled += [g for samples in drawn.values() for g in samples]
        for branch in branches:
            actions = {agent: next(generations) for agent in branch.env.agents}
            branch.rewards.append(_step(branch.env, actions))
            next_branches.append(branch)
            sampled += actions.values()
        for branch in next_branches:
            if not branch.env.agents:                  # this alternative's episode is over: score it
                branch.replay.outcomes[branch.slot] = team_outcome(branch.rewards, outcome)
        live, branches, level = next_live, [b for b in next_branches if b.env.agents], level + 1
    for replay in replays:
        replay.outcomes[0] = team_outcome(transcripts[replay.transcript].rewards, outcome)
    return CounterfactualBatch(transcripts, replays, completions_sampled=len(sampled),
                               answer_tokens_sampled=sum(g.num_tokens for g in sampled))


__all__ = ["TEAM_OUTCOMES", "Transcript", "MessageReplay", "CounterfactualBatch", "team_outcome",
           "completions_per_transcript", "collect_counterfactual"]
