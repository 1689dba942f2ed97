"""Small statistics helpers shared by trainers, examples and benchmarks."""
from __future__ import annotations

from typing import Sequence

from llm_marl_envs import metrics


def bootstrap_ci(values: Sequence[float], confidence: float = 0.95, num_resamples: int = 10_000,
                 seed: int = 0) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` and its percentile-bootstrap confidence interval.

    A scalar front of :func:`llm_marl_envs.metrics.bootstrap_ci` (one resampling routine serves both).
    """
    if len(values) == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    mean, low, high = metrics.bootstrap_ci(values, confidence=confidence, num_resamples=num_resamples, seed=seed)
    return float(mean), float(low), float(high)
