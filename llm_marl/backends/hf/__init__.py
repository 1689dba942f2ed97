"""The transformers backend: :class:`HFPolicy`, which samples with log-probs and scores tokens for training.

One idea per module:

* :mod:`.policy` — :class:`HFPolicy`: construction, prompts, ``generate``, threads per call;
* :mod:`.options` — :class:`HFPerformanceOptions`: the switches that make it fast, with their defaults;
* :mod:`.decode_loop` — the decode loop and each row's progress;
* :mod:`.prefill` — a call's prefill and the prefix store around it;
* :mod:`.sampling` — nucleus sampling with noise keyed by token id, log-probs of chosen tokens;
* :mod:`.kv_rows` — batch rows and their KV caches (padding, shared prompts, finished rows, drafts);
* :mod:`.scoring` — log-probs of given completions, with gradients, for the trainers;
* :mod:`.adapters` — LoRA adapters, their checkpoint tensors, mixed-adapter batches;
* :mod:`.weights` — the CPU weight layout and weight-change tracking;
* :mod:`.concurrent` — several models sampling at once;
* :mod:`.compat` — what differs between transformers versions.
"""
from __future__ import annotations

from ..lora_rows import BASE_ADAPTER
from .adapters import rename_adapter
from .compat import cache_keyword
from .concurrent import concurrent_threads, generate_all
from .kv_rows import MIN_DECODE_ROWS, forget_rejected_drafts, reserved_cache, rows_to_keep, shared_rows
from .options import HFPerformanceOptions
from .policy import HFPolicy
from .sampling import NUCLEUS_CANDIDATES, chosen_logprobs_, nucleus_sample
from .scoring import LOGIT_TRANSFORMS, completion_targets
from .weights import check_state_fits, contiguous_head_input, set_weight_layout

__all__ = ["BASE_ADAPTER", "HFPerformanceOptions", "HFPolicy", "LOGIT_TRANSFORMS", "MIN_DECODE_ROWS",
           "NUCLEUS_CANDIDATES", "cache_keyword", "check_state_fits", "chosen_logprobs_", "completion_targets",
           "concurrent_threads", "contiguous_head_input", "forget_rejected_drafts", "generate_all", "nucleus_sample",
           "rename_adapter", "reserved_cache", "rows_to_keep", "set_weight_layout", "shared_rows"]
