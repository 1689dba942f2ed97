"""Verifiers: modules that judge an agent's text and return a :class:`Verdict`.

Every verifier is a plain function ``(response, gold, ...) -> Verdict``; rewards in the
environments are the verdicts' scores. Verifiers never raise on bad model output: an
unparseable answer is score 0 with the reason in ``details["reason"]``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one response.

    Attributes:
        score: reward in the verifier's range (1.0/0.0 for exact-answer tasks, fraction of
            asserts for code, a weighted sum for writing).
        correct: whether the answer is right; ``None`` where correctness is not binary.
        details: verifier-specific facts (extracted answer, reason for a 0, components).
    """

    score: float
    correct: bool | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form (used in infos and episode logs)."""
        return {"score": float(self.score), "correct": self.correct, "details": dict(self.details)}


__all__ = ["Verdict"]
