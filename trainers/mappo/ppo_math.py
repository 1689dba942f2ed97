"""Token-level PPO math for MAPPO: per-token rewards, GAE, whitening and the three losses.

Every function works on a batch of responses padded on the right to ``[B, L]`` with a 0/1
``mask`` marking real completion tokens (each row's ones come first, then zeros).

Each response is its own episode for GAE: the turn reward ``R`` (already influence-aware, see
:mod:`trainers.mappo.rewards`) sits on the response's last token and the value after the last
token is 0. The KL penalty to the reference is folded into the per-token reward as in RLHF PPO::

    r_k = -β · kl_k              (every token k)
    r_K += R                     (last token K)

    δ_k = r_k + γ · V_{k+1} - V_k                  (V_{K+1} = 0)
    A_k = δ_k + γλ · A_{k+1}                       (generalised advantage estimation)
    G_k = A_k + V_k                                (value targets)

``kl_k`` is one of the estimators of :mod:`trainers.common.losses` (``kl_estimator``), which also
holds the masked mean and the entropy these losses share with MAGRPO (re-exported here).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from trainers.common.losses import KL_ESTIMATORS, entropy_from_logits, kl_per_token, masked_mean


def whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8,
           reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Normalise ``values`` to unit variance (and zero mean if ``shift_mean``) over the masked positions.

    ``reduce`` sums a tensor over processes, so the moments cover every process's values
    (``DistributedTraining.sum_tensor``); by default they cover these values only.
    """
    reduce = reduce or (lambda tensor: tensor)
    mask = mask.to(values.dtype)
    totals = reduce(torch.stack([(values * mask).sum(), mask.sum()]))
    count = totals[1]
    mean = totals[0] / count.clamp(min=1.0)
    variance = reduce((((values - mean) ** 2) * mask).sum()) / (count - 1).clamp(min=1.0)   # unbiased
    whitened = (values - mean) * torch.rsqrt(variance + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token; refuses empty rows and masks with holes."""
    mask = mask.long()
    lengths = mask.sum(dim=1)
    if bool((lengths == 0).any()):
        raise ValueError("every response needs at least one completion token; got an all-zero mask row")
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    if bool(((positions < lengths[:, None]).long() != mask).any()):
        raise ValueError("mask must be right-padded (ones first, then zeros) in every row")
    return lengths - 1


def token_rewards(
    turn_rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """Per-token rewards: ``-kl_coef · kl`` everywhere, plus the turn reward on the last token."""
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * kl.float()
    last = last_token_index(mask)
    rewards[torch.arange(mask.shape[0], device=mask.device), last] += turn_rewards.float()
    return rewards * mask.float()


def generalized_advantages(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the tokens of each response: returns ``(advantages, value_targets)``, both masked."""
    if rewards.shape != values.shape or rewards.shape != mask.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask {tuple(mask.shape)} must match"
        )
    last_token_index(mask)   # validates right padding
    mask = mask.to(values.dtype)
    values = values * mask
    length = rewards.shape[1]
    advantages = torch.zeros_like(values)
    next_advantage = torch.zeros_like(values[:, 0])
    for k in reversed(range(length)):
        next_value = values[:, k + 1] if k + 1 < length else torch.zeros_like(values[:, 0])  # 0 after the end
        delta = rewards[:, k] + gamma * next_value - values[:, k]          # δ_k = r_k + γV_{k+1} - V_k
        next_advantage = (delta + gamma * lam * next_advantage) * mask[:, k]   # A_k = δ_k + γλA_{k+1}
        advantages[:, k] = next_advantage
    return advantages, (advantages + values) * mask


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate ``E[max(-A·ρ, -A·clip(ρ, 1-ε, 1+ε))]``, ρ = π/π_old; returns (loss, stats).

    The expectation is over the masked tokens, or over ``tokens`` tokens when given (see :func:`masked_mean`).
    ``clipfrac`` is the share of tokens whose clipped term is in force (ρ beyond the bound on the side
    the advantage pushes it, so the token gets no gradient); a token with ρ inside the bounds is never counted.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask, tokens)
    with torch.no_grad():
        stats = {
            "clipfrac": float(masked_mean(((advantages > 0) & (ratio > 1.0 + clip_eps)
                                           | (advantages < 0) & (ratio < 1.0 - clip_eps)).float(), mask)),
            "approx_kl_old": float(masked_mean(0.5 * log_ratio**2, mask)),
            "ratio_mean": float(masked_mean(ratio, mask)),
        }
    return loss, stats


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, clip_range: float = 0.2,
    tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``½·E[max((V-G)², (V_old + clip(V-V_old, ±c) - G)²)]`` (over ``tokens`` tokens if given); (loss, stats).

    Where ``|V - V_old| <= c`` the clip does nothing and the error is ``(V-G)²`` exactly (``V_old + (V - V_old)``
    can differ from ``V`` by a rounding step); ``vf_clipfrac`` counts the tokens whose clipped error is in force.
    """
    outside = (values - old_values).abs() > clip_range
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    unclipped_error = (values - targets) ** 2
    clipped_error = (clipped_values - targets) ** 2
    in_force = outside & (clipped_error > unclipped_error)
    loss = 0.5 * masked_mean(torch.where(in_force, clipped_error, unclipped_error), mask, tokens)
    with torch.no_grad():
        stats = {"vf_clipfrac": float(masked_mean(in_force.float(), mask))}
    return loss, stats


__all__ = [
    "KL_ESTIMATORS", "masked_mean", "whiten", "kl_per_token", "last_token_index", "token_rewards",
    "generalized_advantages", "clipped_policy_loss", "clipped_value_loss", "entropy_from_logits",
]
