"""The centralized critic's input: the task plus every agent's answers so far.

MAPoRL's original critic read only the question. Ours reads the joint history, because the
influence-aware return of agent ``i`` at turn ``t`` depends on what the OTHER agents answer
next, which in turn depends on what they have already said. The critic of agent ``i``'s answer
at turn ``t`` sees:

* the task (agent ``i``'s opening prompt, rendered as text),
* every agent's answers of turns ``0 .. t-1`` (the history the debate has produced),
* the OTHER agents' answers of turn ``t`` (answered simultaneously with ``i``), and
* agent ``i``'s answer of turn ``t``, whose tokens receive the per-token values.

Conditioning on the others' simultaneous answers is allowed because a baseline may depend on
anything that does not depend on agent ``i``'s own action (the others sample independently of
``i`` given the history), and it removes the variance those answers add to ``R_i^t``.
The critic is centralized only during training; the actors still see only their own history.
"""
from __future__ import annotations

from typing import Mapping, Sequence


def critic_context(task_text: str, answers: Sequence[Mapping[str, str]], agent: str, turn: int) -> str:
    """Text the critic reads before agent ``agent``'s turn-``turn`` answer (see the module docstring)."""
    if turn < 0 or turn >= len(answers):
        raise ValueError(f"turn must be in [0, {len(answers)}) for a history of {len(answers)} turns, got {turn}")
    if agent not in answers[turn]:
        raise ValueError(f"agent {agent!r} has no answer at turn {turn}; agents there are {sorted(answers[turn])}")
    parts = [f"Task:\n{task_text.strip()}"]
    for t in range(turn):
        for other, text in answers[t].items():
            parts.append(f"Turn {t}, {other} answered:\n{text.strip()}")
    for other, text in answers[turn].items():
        if other != agent:
            parts.append(f"Turn {turn}, {other} answered:\n{text.strip()}")
    parts.append(f"Turn {turn}, {agent} answers:\n")
    return "\n\n".join(parts)


__all__ = ["critic_context"]
