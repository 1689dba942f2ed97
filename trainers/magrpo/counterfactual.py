"""Counterfactual per-message credit (C3-style), the rollout behind ``MAGRPOConfig(credit="counterfactual")``.

For one sampled transcript of N agents over T turns, the message of agent i at turn t is scored by
its effect on the team's outcome, measured by replaying the episode from the frozen transcript up
to that message:

1. :func:`sample_transcripts` — play each task once; every turn is one :meth:`RolloutEngine.expand`
   with one sample per agent (one batched generate call per policy for all agents of all
   transcripts), and the env before every turn is kept: the frozen context of that turn's messages.
2. :func:`replay_alternatives` — for every message (t, i) of every transcript, K alternative
   messages of agent i are sampled from that same context (ONE generate call per policy for all
   messages of all turns). Each alternative is stepped on a clone of the env before turn t
   together with the other agents' actual turn-t messages, and the rest of the episode (turns
   t+1, ...) is sampled afresh (:func:`play_out`: every branch of every message advances together,
   one generate call per policy per turn).
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


def sample_transcripts(engine: RolloutEngine, nodes: Sequence[TextEnv],
                       params: SamplingParams) -> tuple[list[Transcript], list[Generation]]:
    """Play every env of ``nodes`` (freshly reset) to its end, one sample per agent per turn; ``(transcripts,
    every generation sampled)``. ``nodes`` themselves are not stepped (each turn steps a clone)."""
    transcripts = [Transcript() for _ in nodes]
    sampled: list[Generation] = []
    frontier = list(enumerate(nodes))
    while frontier:
        expansions = engine.expand([node for _, node in frontier], 1, params=params)
        next_frontier = []
        for (index, node), expansion in zip(frontier, expansions):
            transcript = transcripts[index]
            transcript.nodes.append(node)
            transcript.messages.append({agent: samples[0] for agent, samples in expansion.samples.items()})
            transcript.rewards.append(expansion.rewards[0])
            sampled += [samples[0] for samples in expansion.samples.values()]
            if not expansion.done[0]:
                next_frontier.append((index, expansion.children[0]))
        frontier = next_frontier
    return transcripts, sampled


def play_out(engine: RolloutEngine, nodes: Sequence[TextEnv],
             params: SamplingParams) -> tuple[list[list[dict[str, float]]], list[Generation]]:
    """Finish every episode of ``nodes`` (envs mid-episode, not modified): every live node advances together, one
    sample per agent per turn. ``(per node: the rewards of the turns played, every generation sampled)``."""
    histories: list[list[dict[str, float]]] = [[] for _ in nodes]
    sampled: list[Generation] = []
    frontier = [(index, node) for index, node in enumerate(nodes) if node.agents]
    level = 0
    while frontier:
        expansions = engine.expand([node for _, node in frontier], 1, params=params.for_call(level))
        next_frontier = []
        for (index, _), expansion in zip(frontier, expansions):
            histories[index].append(expansion.rewards[0])
            sampled += [samples[0] for samples in expansion.samples.values()]
            if not expansion.done[0]:
                next_frontier.append((index, expansion.children[0]))
        frontier, level = next_frontier, level + 1
    return histories, sampled


def replay_alternatives(engine: RolloutEngine, transcripts: Sequence[Transcript], num_alternatives: int,
                        params: SamplingParams,
                        outcome: str = "final_turn") -> tuple[list[MessageReplay], list[Generation]]:
    """K alternatives for every message of every transcript, each played out from a clone of the frozen context;
    ``(one replay per message, every generation sampled)``. The transcripts are not changed."""
    if num_alternatives < 1:
        raise ValueError(f"counterfactual_samples (K alternatives per message) must be >= 1, got {num_alternatives}")
    points = [(index, turn, agent) for index, transcript in enumerate(transcripts)
              for turn, node in enumerate(transcript.nodes) for agent in node.agents]
    requests = [(agent, [dict(m) for m in transcripts[index].nodes[turn].messages[agent]])
                for index, turn, agent in points]
    alternatives = engine.sample(requests, num_samples=num_alternatives, params=params.for_call(0)) if requests else []
    sampled = [g for samples in alternatives for g in samples]

    replays, branches, prefixes = [], [], []      # per alternative: its env after turn t, its rewards up to turn t
    for (index, turn, agent), samples in zip(points, alternatives):
        transcript = transcripts[index]
        actual = transcript.messages[turn]
        replays.append(MessageReplay(index, turn, agent, actual[agent], list(samples),
                                     [team_outcome(transcript.rewards, outcome)]))
        for sample in samples:
            branch = transcript.nodes[turn].clone()
            _, rewards, _, _, _ = branch.step({a: sample.text if a == agent else g.text for a, g in actual.items()})
            branches.append(branch)
            prefixes.append(transcript.rewards[:turn] + [{a: float(r) for a, r in rewards.items()}])

    continuations, played = play_out(engine, branches, params.for_call(1))
    sampled += played
    outcomes = iter(team_outcome(prefix + rest, outcome) for prefix, rest in zip(prefixes, continuations))
    for replay in replays:
        replay.outcomes += [next(outcomes) for _ in replay.alternatives]
    return replays, sampled


def collect_counterfactual(engine: RolloutEngine, nodes: Sequence[TextEnv], num_alternatives: int,
                           params: SamplingParams, outcome: str = "final_turn") -> CounterfactualBatch:
    """Steps 1-2 of the module docstring for freshly reset envs ``nodes``: transcripts, then every message's replay."""
    transcripts, sampled = sample_transcripts(engine, nodes, params.for_call(0))
    replays, replayed = replay_alternatives(engine, transcripts, num_alternatives, params.for_call(1), outcome)
    sampled += replayed
    return CounterfactualBatch(transcripts, replays, completions_sampled=len(sampled),
                               answer_tokens_sampled=sum(g.num_tokens for g in sampled))


__all__ = ["TEAM_OUTCOMES", "Transcript", "MessageReplay", "CounterfactualBatch", "team_outcome",
           "completions_per_transcript", "sample_transcripts", "play_out", "replay_alternatives",
           "collect_counterfactual"]
