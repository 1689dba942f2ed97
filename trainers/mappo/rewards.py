"""MAPoRL turn rewards: influence-aware returns and collaboration incentives.

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

Incentives (each weight defaults to 0; the bonus is added to ``R_i^t`` after normalisation).
``M^t`` is the majority verdict of the OTHER agents at turn ``t`` (``N - 1`` voters) and
``K^t = Σ_{j≠i} c_j^t`` the number of correct others:

=====  ==========================  ====================================================
coef   name                        fires for agent ``i`` at turn ``t`` when
=====  ==========================  ====================================================
α0     critical reasoning          ``t ≥ 1``, ``c_i^t = 1`` and ``M^{t-1}`` = wrong
α1     persuadability              ``t ≥ 1``, ``c_i^{t-1} = 0``, ``M^{t-1}`` = right, ``c_i^t = 1``
β0     useful wrong answer         ``t < x``, ``c_i^t = 0`` and ``K^{t+1} > K^t``
β1     persuasion                  ``t < x``, ``c_i^t = 1`` and ``K^{t+1} > K^t``
=====  ==========================  ====================================================

Penalties (``IncentiveWeights.penalties``, on by default in :class:`~trainers.mappo.MAPPOConfig`):
MAPoRL's reference code also SUBTRACTS the α weights when an agent turns a correct answer into
a wrong one. With penalties on, ``-α0`` fires when ``c_i^{t-1} = 1``, ``M^{t-1}`` = wrong and
``c_i^t = 0`` (it followed the wrong majority away from a right answer), and ``-α1`` when
``c_i^{t-1} = 1``, ``M^{t-1}`` = right and ``c_i^t = 0`` (it turned wrong although the others were
right). The reference's β terms carry the opposite signs of its own comments (a bonus when the
others get worse), so no β penalty is copied; see the README's list of differences.

Edge cases: at ``t = 0`` there is no previous turn, so α0/α1 never fire; at the last turn ``x``
there is no next turn, so β0/β1 never fire. ``M`` is "right" when more than half of the others
are correct, "wrong" when fewer than half are, and **undecided on a tie** (possible when
``N - 1`` is even); an undecided majority fires neither α0 nor α1. With a single agent there are
no others: nonzero incentive weights are refused with ``ValueError``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

RewardRule = Literal["influence_aware", "current_turn", "last_turn"]
REWARD_RULES: tuple[str, ...] = ("influence_aware", "current_turn", "last_turn")
FUTURE_MEANS: tuple[str, ...] = ("all", "others")


@dataclass(frozen=True)
class IncentiveWeights:
    """The four MAPoRL incentive weights (see the module docstring's table)."""

    alpha0: float = 0.0   # critical reasoning
    alpha1: float = 0.0   # persuadability
    beta0: float = 0.0    # useful wrong answer
    beta1: float = 0.0    # persuasion
    penalties: bool = False   # also subtract α0/α1 on correct -> incorrect transitions (MAPoRL's reference code)

    @property
    def any_nonzero(self) -> bool:
        """Whether any incentive is switched on."""
        return any(w != 0.0 for w in (self.alpha0, self.alpha1, self.beta0, self.beta1))


def _as_turn_agent_array(values: Sequence[Sequence[float]], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(
            f"{name} must be a non-empty [turn][agent] table (turns x agents), got shape {array.shape}"
        )
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite numbers, got {values!r}")
    return array


def influence_aware_returns(
    scores: Sequence[Sequence[float]],
    gamma: float = 0.3,
    rule: RewardRule = "influence_aware",
    future_mean: Literal["all", "others"] = "all",
) -> np.ndarray:
    """Turn rewards ``R[t, i]`` from verifier scores ``scores[t][i]`` (rule in the module docstring)."""
    s = _as_turn_agent_array(scores, "scores")
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


def _others_correct_counts(c: np.ndarray) -> np.ndarray:
    """``K[t, i]`` = number of correct agents other than ``i`` at turn ``t``."""
    return c.sum(axis=1, keepdims=True) - c


def incentive_bonuses(correct: Sequence[Sequence[bool | int]], weights: IncentiveWeights) -> np.ndarray:
    """Incentive bonus ``B[t, i]`` added to ``R_i^t`` (the table in the module docstring)."""
    num_turns = len(correct)
    num_agents = len(correct[0]) if num_turns else 0
    if not weights.any_nonzero:
        return np.zeros((num_turns, num_agents))
    for t, row in enumerate(correct):
        for i, value in enumerate(row):
            if value is None or value not in (0, 1, True, False):
                raise ValueError(
                    f"incentives need binary correctness, got correct[{t}][{i}]={value!r}; "
                    "set all incentive weights to 0 for verifiers without a correct/incorrect verdict"
                )
    c = _as_turn_agent_array(correct, "correct")
    if num_agents < 2:
        raise ValueError("incentive weights need at least 2 agents (they depend on the other agents); set them to 0")

    others = num_agents - 1
    k = _others_correct_counts(c)                    # K[t, i]
    majority_right = k * 2 > others                  # M^t = right
    majority_wrong = k * 2 < others                  # M^t = wrong (a tie is neither)
    bonus = np.zeros_like(c)
    # α terms look back one turn: defined for t >= 1
    bonus[1:] += weights.alpha0 * (c[1:] * majority_wrong[:-1])
    bonus[1:] += weights.alpha1 * ((1 - c[:-1]) * majority_right[:-1] * c[1:])
    if weights.penalties:    # the mirror transitions: correct at t-1, wrong at t
        broke = c[:-1] * (1 - c[1:])
        bonus[1:] -= weights.alpha0 * (broke * majority_wrong[:-1])
        bonus[1:] -= weights.alpha1 * (broke * majority_right[:-1])
    # β terms look ahead one turn: defined for t <= x - 1
    others_improved = k[1:] > k[:-1]
    bonus[:-1] += weights.beta0 * ((1 - c[:-1]) * others_improved)
    bonus[:-1] += weights.beta1 * (c[:-1] * others_improved)
    return bonus


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


__all__ = [
    "IncentiveWeights", "REWARD_RULES", "FUTURE_MEANS", "RewardRule",
    "influence_aware_returns", "incentive_bonuses", "turn_rewards",
]
