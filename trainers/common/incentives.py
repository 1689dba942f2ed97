"""MAPoRL's collaboration incentives: bonuses (and penalties) for how an agent's answer moves with the others'.

Inputs are one debate episode's correctness table ``correct[t][i] = c_i^t`` (0/1, agent ``i`` at
turn ``t``); ``x`` is the last turn reached. ``M^t`` is the majority verdict of the OTHER agents
at turn ``t`` (``N - 1`` voters) and ``K^t = Σ_{j≠i} c_j^t`` the number of correct others:

=====  ==========================  ====================================================
coef   name                        fires for agent ``i`` at turn ``t`` when
=====  ==========================  ====================================================
α0     critical reasoning          ``t ≥ 1``, ``c_i^t = 1`` and ``M^{t-1}`` = wrong
α1     persuadability              ``t ≥ 1``, ``c_i^{t-1} = 0``, ``M^{t-1}`` = right, ``c_i^t = 1``
β0     useful wrong answer         ``t < x``, ``c_i^t = 0`` and ``K^{t+1} > K^t``
β1     persuasion                  ``t < x``, ``c_i^t = 1`` and ``K^{t+1} > K^t``
=====  ==========================  ====================================================

Penalties (``IncentiveWeights.penalties``, on by default in every trainer, as in MAPoRL's
reference code): the α weights are also SUBTRACTED when an agent turns a correct answer into a
wrong one: ``-α0`` when ``c_i^{t-1} = 1``, ``M^{t-1}`` = wrong and ``c_i^t = 0`` (it followed the
wrong majority away from a right answer), and ``-α1`` when ``c_i^{t-1} = 1``, ``M^{t-1}`` = right
and ``c_i^t = 0`` (it turned wrong although the others were right). The reference's β terms carry
the opposite signs of its own comments (a bonus when the others get worse), so no β penalty is
copied; see the README's list of differences.

Edge cases: at ``t = 0`` there is no previous turn, so α0/α1 never fire; at the last turn ``x``
there is no next turn, so β0/β1 never fire. ``M`` is "right" when more than half of the others
are correct, "wrong" when fewer than half are, and **undecided on a tie** (possible when
``N - 1`` is even); an undecided majority fires neither α0 nor α1. With a single agent there are
no others: nonzero incentive weights are refused with ``ValueError``.

Each weight defaults to 0 (off). MAPPO adds ``B[t, i]`` to the agent's turn reward
(:func:`trainers.mappo.rewards.turn_rewards`); MAGRPO's tree (the experimental
:class:`~trainers.experimental.ExperimentalMAGRPOConfig`) adds the mean over agents of the α
bonuses of the turn just played to each joint action's reward (:func:`incentive_shaped`). Both
configs declare these fields with :func:`incentive_field`, so their defaults and help texts are
the ones below.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llm_marl.rollout import Expansion


@dataclass(frozen=True)
class IncentiveWeights:
    """The four MAPoRL incentive weights (see the module docstring's table) and whether α also penalises."""

    alpha0: float = 0.0   # critical reasoning
    alpha1: float = 0.0   # persuadability
    beta0: float = 0.0    # useful wrong answer
    beta1: float = 0.0    # persuasion
    penalties: bool = True   # also subtract α0/α1 on correct -> incorrect transitions (MAPoRL's reference code)

    @property
    def any_nonzero(self) -> bool:
        """Whether any incentive is switched on."""
        return any(w != 0.0 for w in (self.alpha0, self.alpha1, self.beta0, self.beta1))


INCENTIVE_HELP = {
    "alpha0": "MAPoRL incentive α0 (critical reasoning): per agent right at t while the others' majority was wrong "
              "at t-1 (0: off).",
    "alpha1": "MAPoRL incentive α1 (persuadability): per agent wrong at t-1 that is right at t after the others' "
              "majority was right at t-1 (0: off).",
    "beta0": "MAPoRL incentive β0 (useful wrong answer): per agent wrong at t when more others are right at t+1 than "
             "at t (0: off).",
    "beta1": "MAPoRL incentive β1 (persuasion): per agent right at t when more others are right at t+1 than at t "
             "(0: off).",
    "incentive_penalties": "Also subtract α0/α1 per agent that turns a right answer wrong (MAPoRL's reference code; "
                           "False: bonuses only). See trainers.common.incentives.",
}


def incentive_field(name: str) -> Any:
    """The config field of incentive ``name`` (``alpha0`` … ``beta1``, ``incentive_penalties``): one default and
    help text for every trainer that offers it."""
    if name not in INCENTIVE_HELP:
        raise ValueError(f"unknown incentive field {name!r}; choose from {sorted(INCENTIVE_HELP)}")
    default = getattr(IncentiveWeights, "penalties" if name == "incentive_penalties" else name)
    return field(default=default, metadata={"help": INCENTIVE_HELP[name]})


def turn_agent_table(values: Sequence[Sequence[float]], name: str) -> np.ndarray:
    """``values`` as a finite ``[turn, agent]`` float array, or ``ValueError`` naming ``name`` and the problem."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(
            f"{name} must be a non-empty [turn][agent] table (turns x agents), got shape {array.shape}"
        )
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite numbers, got {values!r}")
    return array


def incentive_bonuses(correct: Sequence[Sequence[bool | int]], weights: IncentiveWeights) -> np.ndarray:
    """Incentive bonus ``B[t, i]`` of every turn and agent (the table in the module docstring)."""
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
    c = turn_agent_table(correct, "correct")
    if num_agents < 2:
        raise ValueError("incentive weights need at least 2 agents (they depend on the other agents); set them to 0")

    others = num_agents - 1
    k = c.sum(axis=1, keepdims=True) - c             # K[t, i]: correct agents other than i
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


def incentive_shaped(expansion: Expansion, joint_rewards: Sequence[float], weights: IncentiveWeights) -> list[float]:
    """Each joint action's reward plus the mean over agents of its incentive bonus for the turn just played.

    The bonus reads the env's per-turn ``correct`` table in the infos, so a right answer kept or found earns α
    and, with penalties, a right answer turned wrong costs α.
    """
    shaped = []
    for reward, infos in zip(joint_rewards, expansion.infos):
        table = next(iter(infos.values()), {}).get("correct") if infos else None
        if table is None:
            raise ValueError("alpha0/alpha1 incentives need an env whose infos carry the per-turn 'correct' table "
                             "(the debate envs do); set alpha0=alpha1=0 for this env")
        shaped.append(reward + float(np.mean(incentive_bonuses(table, weights)[-1])))
    return shaped


__all__ = ["IncentiveWeights", "INCENTIVE_HELP", "incentive_field", "incentive_bonuses", "incentive_shaped",
           "turn_agent_table"]
