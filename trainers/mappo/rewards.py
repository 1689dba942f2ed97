"""MAPoRL turn rewards: influence-aware returns, plus the collaboration incentives.

Inputs are one debate episode's verifier outputs, indexed ``[turn][agent]``:
``scores[t][i] = s_i^t`` (the verifier score of agent ``i`` at turn ``t``) and, for the
incentives, ``correct[t][i] = c_i^t`` (0/1). ``x`` is the last turn reached (``len(scores) - 1``;
an env may stop early on consensus).

Influence-aware return (``rule="influence_aware"``, MAPoRL's default, γ = 0.3 in the paper)::

    R_i^t = [ s_i^t + Σ_{t'=t+1..x} γ^{t'-t} · s̄^{t'} ]  /  Σ_{t'=t..x} γ^{t'-t}

so an answer is credited with its own score plus the discounted team score of the turns it
influences, normalised so that ``R`` stays in the verifier's range. For three turns::

    R_i^0 = (s_i^0 + 0.3·s̄^1 + 0.09·s̄^2) / 1.39,   R_i^1 = (s_i^1 + 0.3·s̄^2) / 1.3,   R_i^2 = s_i^2

``s̄^{t'}`` is the mean over **all** agents (``future_mean="all"``, default) — the reading of the
issue's ``mean_j`` and of the paper's prose ("the average verifier score of the agents'
future responses"); the paper's equation could not be retrieved offline, so this is a documented
choice. ``future_mean="others"`` averages over ``j ≠ i`` only, which isolates the influence on
the other agents from the agent's own later answers. Other rules: ``"current_turn"``
(``R_i^t = s_i^t``) and ``"last_turn"`` (``R_i^t = s_i^x``, the agent's own final score).

Incentives: MAPoRL's collaboration bonuses α0/α1/β0/β1 (and the α penalties) are defined in
:mod:`trainers.common.incentives`; :func:`turn_rewards` adds them to ``R_i^t`` after normalisation.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from trainers.common.incentives import IncentiveWeights, incentive_bonuses, turn_agent_table

RewardRule = Literal["influence_aware", "current_turn", "last_turn"]
REWARD_RULES: tuple[str, ...] = ("influence_aware", "current_turn", "last_turn")
FUTURE_MEANS: tuple[str, ...] = ("all", "others")


def influence_aware_returns(
    scores: Sequence[Sequence[float]],
    gamma: float = 0.3,
    rule: RewardRule = "influence_aware",
    future_mean: Literal["all", "others"] = "all",
) -> np.ndarray:
    """Turn rewards ``R[t, i]`` from verifier scores ``scores[t][i]`` (rule in the module docstring)."""
    s = turn_agent_table(scores, "scores")
    num_turns, num_agents = s.shape
    if rule not in REWARD_RULES:
        raise ValueError(f"rule must be one of {REWARD_RULES}, got {rule!r}")
    if rule == "current_turn":
        return s.copy()
    if rule == "last_turn":
        return np.repeat(s[-1:], num_turns, axis=0)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1] for influence-aware returns, got {gamma}")
    if future_mean not in FUTURE_MEANS:
        raise ValueError(f"future_mean must be one of {FUTURE_MEANS}, got {future_mean!r}")
    if future_mean == "others" and num_agents < 2:
        raise ValueError("future_mean='others' needs at least 2 agents; use future_mean='all'")

    # team[t', i] = s̄^{t'} as seen by agent i (mean over all agents, or over the others)
    if future_mean == "all":
        team = np.repeat(s.mean(axis=1, keepdims=True), num_agents, axis=1)
    else:
        team = (s.sum(axis=1, keepdims=True) - s) / (num_agents - 1)

    returns = np.empty_like(s)
    for t in range(num_turns):
        discounts = gamma ** np.arange(num_turns - t)        # γ^{t'-t} for t' = t..x
        numerator = s[t] + (discounts[1:, None] * team[t + 1:]).sum(axis=0)
        returns[t] = numerator / discounts.sum()
    return returns


def turn_rewards(
    scores: Sequence[Sequence[float]],
    correct: Sequence[Sequence[bool | None]] | None = None,
    *,
    gamma: float = 0.3,
    rule: RewardRule = "influence_aware",
    future_mean: Literal["all", "others"] = "all",
    incentives: IncentiveWeights = IncentiveWeights(),
) -> np.ndarray:
    """The MAPPO training reward of every (turn, agent): the chosen return rule plus incentives."""
    rewards = influence_aware_returns(scores, gamma=gamma, rule=rule, future_mean=future_mean)
    if incentives.any_nonzero:
        if correct is None:
            raise ValueError("incentive weights are set but no correctness table was given")
        bonus = incentive_bonuses(correct, incentives)
        if bonus.shape != rewards.shape:
            raise ValueError(f"correct has shape {bonus.shape} but scores has shape {rewards.shape}; they must match")
        rewards = rewards + bonus
    return rewards


__all__ = ["REWARD_RULES", "FUTURE_MEANS", "RewardRule", "influence_aware_returns", "turn_rewards"]
