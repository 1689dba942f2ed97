"""Log-probs with the per-token entropy, for MAPPO's entropy bonus.

Log-probs alone come from :meth:`llm_marl.backends.hf.HFPolicy.token_logprobs`. It returns only
the sampled tokens' log-probs, while the entropy needs the whole distribution; this runs the
forward pass ``token_logprobs`` runs (:meth:`~llm_marl.backends.hf.HFPolicy.completion_logits`)
and takes both from its logits.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from llm_marl.backends.hf import completion_targets
from trainers.common.losses import logprobs_and_entropy


def token_logprobs_with_entropy(
    policy: Any,
    adapter: str | None,
    prompt_ids: Sequence[list[int]],
    completion_ids: Sequence[list[int]],
    *,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``policy.token_logprobs(...)`` under ``adapter`` (with gradients) plus the per-token entropy, all ``[B, L]``."""
    with policy.using(adapter):
        logits, width, mask = policy.completion_logits(prompt_ids, completion_ids)
    targets = completion_targets(completion_ids, width, policy.pad_id).to(logits.device)
    logprobs, entropy = logprobs_and_entropy(logits, targets, temperature)
    return logprobs * mask, mask.bool(), entropy * mask


__all__ = ["token_logprobs_with_entropy"]
