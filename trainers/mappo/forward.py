"""Forward passes over ``[prompt][completion]`` rows of an HF policy, for the PPO losses and the critic.

Row layout (as in :meth:`trainers.common.policy.HFPolicy.token_logprobs`): ``[left pad][prompt]
[completion][right pad]``, so every completion fills the last ``width`` columns and the output at
the position before completion token ``k`` is the state in which token ``k`` was chosen.
Unlike ``token_logprobs`` this also yields the per-token entropy (for the entropy bonus) or the
hidden states (for the value head) from the same single forward pass.
"""
from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch

from .ppo_math import entropy_from_logits


def completion_forward(
    policy: Any,
    prompt_ids: Sequence[list[int]],
    completion_ids: Sequence[list[int]],
    *,
    output_hidden_states: bool = False,
) -> tuple[Any, int, torch.Tensor]:
    """Run ``policy`` (with whatever adapter is active) on the rows; returns (output, width, completion mask)."""
    if len(prompt_ids) != len(completion_ids) or not prompt_ids:
        raise ValueError(f"need one completion per prompt, at least one (got {len(prompt_ids)} and {len(completion_ids)})")
    width = max(1, max(len(c) for c in completion_ids))
    rows = [list(p) + list(c) + [policy.pad_id] * (width - len(c)) for p, c in zip(prompt_ids, completion_ids)]
    ids, mask = policy._left_pad(rows)
    for row, completion in enumerate(completion_ids):
        if width - len(completion):
            mask[row, -(width - len(completion)):] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    output = policy.forward_module(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
        logits_to_keep=1 if output_hidden_states else width + 1, output_hidden_states=output_hidden_states,
    )
    return output, width, mask[:, -width:]


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
    context = torch.no_grad() if reference else contextlib.nullcontext()
    with context, policy.using(None if reference else adapter):
        output, width, mask = completion_forward(policy, prompt_ids, completion_ids)
    logits = output.logits[:, :-1, :].float()
    if temperature > 0:
        logits = logits / temperature
    targets = torch.tensor(
        [list(c) + [policy.pad_id] * (width - len(c)) for c in completion_ids], dtype=torch.long
    )
    logprobs = (logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)) * mask
    entropy = entropy_from_logits(logits) * mask if with_entropy else None
    return logprobs, mask, entropy


__all__ = ["completion_forward", "completion_logprobs"]
