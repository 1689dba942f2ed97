"""Token-level loss terms both trainers use: KL estimators, masked means, log-probs and entropy from logits.

Every function works on completions padded on the right to ``[B, L]`` with a 0/1 (or bool)
``mask`` marking real completion tokens.

KL estimators of KL(π || π_ref) from the sampled tokens' log-probs (Schulman, "Approximating KL
divergence"), with ``log r = log π_ref - log π``::

    k1 = -log r                  unbiased, can be negative per token
    k3 = exp(log r) - log r - 1  unbiased, always >= 0, lower variance

MAPPO folds either into the per-token reward; MAGRPO adds the per-sample mean of k3 to its loss
(as a loss term k1's expected gradient is zero, so it is not offered there).
"""
from __future__ import annotations

from typing import Literal

import torch

from .config import KL_ESTIMATORS


def kl_per_token(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: Literal["k1", "k3"] = "k1"
) -> torch.Tensor:
    """Per-token estimate of KL(π || π_ref) from the sampled tokens' log-probs (k1 or k3)."""
    log_ratio = ref_logprobs - logprobs           # log π_ref/π
    if estimator == "k1":
        return -log_ratio
    if estimator == "k3":
        return torch.expm1(log_ratio) - log_ratio
    raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, denominator: float | None = None) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1.

    With ``denominator``, the masked sum divided by it instead: the share of a mean over a larger
    batch (e.g. a minibatch split over processes, whose token count is ``denominator``).
    """
    mask = mask.to(values.dtype)
    return (values * mask).sum() / (mask.sum().clamp(min=1.0) if denominator is None else denominator)


def sequence_means(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]``: each row's mean of ``values`` over its masked positions (0 for a row without any)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy ``-Σ_v p_v log p_v`` of the categorical given by ``logits`` (last dim)."""
    return _entropy(torch.log_softmax(logits.float(), dim=-1))


def logprobs_and_entropy(logits: torch.Tensor, targets: torch.Tensor,
                         temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log π(target), entropy)`` per position of ``logits`` ``[B, L, V]`` scaled by ``temperature`` (0: unscaled)."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    log_p = torch.log_softmax(logits, dim=-1)
    return log_p.gather(-1, targets[..., None]).squeeze(-1), _entropy(log_p)


def _entropy(log_p: torch.Tensor) -> torch.Tensor:
    return -(log_p.exp() * log_p).sum(dim=-1)


__all__ = ["KL_ESTIMATORS", "kl_per_token", "masked_mean", "sequence_means", "entropy_from_logits",
           "logprobs_and_entropy"]
