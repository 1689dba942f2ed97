"""Per-token log-probs and entropies of completions under an agent's adapter, for the PPO losses.

:meth:`trainers.common.policy.HFPolicy.token_logprobs` gives log-probs only; the entropy bonus
also needs the full distribution, so this computes both from the same single forward pass
(:meth:`~trainers.common.policy.HFPolicy.completion_forward`).
"""
from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch

from trainers.common.policy import completion_targets

from .ppo_math import entropy_from_logits


def completion_logprobs(
    policy: Any,
    adapter: str | None,
    prompt_ids: Sequence[list[int]],
    completion_ids: Sequence[list[int]],
    *,
    temperature: float = 1.0,
    reference: bool = False,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``log π(y_k)`` ``[B, L]``, the completion mask, and (optionally) the per-token entropy.

    ``reference=True`` scores under the base with adapters disabled, without gradients.
    """
    if not with_entropy:
        logprobs, mask = policy.token_logprobs(prompt_ids, completion_ids, adapter=adapter, temperature=temperature,
                                               reference=reference)
        return logprobs, mask.long(), None
    context = torch.no_grad() if reference else contextlib.nullcontext()
    with context, policy.using(None if reference else adapter):
        output, width, mask = policy.completion_forward(prompt_ids, completion_ids)
    logits = output.logits[:, :-1, :].float()
    if temperature > 0:
        logits = logits / temperature
    targets = completion_targets(completion_ids, width, policy.pad_id).to(logits.device)
    logprobs = (logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)) * mask
    return logprobs, mask, entropy_from_logits(logits) * mask


__all__ = ["completion_logprobs"]
