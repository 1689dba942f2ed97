"""Small statistics helpers shared by trainers, examples and benchmarks."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def bootstrap_ci(values: Sequence[float], confidence: float = 0.95, num_resamples: int = 10_000,
                 seed: int = 0) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` and its percentile-bootstrap confidence interval."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(num_resamples, data.size))].mean(axis=1)
    tail = (1 - confidence) / 2
    return float(data.mean()), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))
