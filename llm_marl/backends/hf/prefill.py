"""`StoredPrefill`: the prefill of a generate call, and the prefix store around it.

A prompt prefills only the tokens past its longest prefix in the store
(:class:`~llm_marl.backends.prefix_cache.PrefixCache`);
the prefix that a call's store-missing prompts share runs once per adapter first; rows that share a prompt and
an adapter (the G samples of one agent) prefill once and copy their cache; every row's cache is stored after.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..prefix_cache import MIN_SHARED_PREFIX, CacheStats, PrefixCache, shared_prefixes
from .compat import cache_keyword
from .kv_rows import left_pad, reserved_cache, shared_rows


@dataclass
class Prefill:
    """What a call's prefill leaves for its decode loop: the last position's logits of every row (``[rows, 1, V]``,
    float32), the KV cache, the attention mask, each row's newest position, and the store entries it superseded."""

    logits: torch.Tensor
    cache: Any
    mask: torch.Tensor
    position: torch.Tensor
    extended: set[tuple]


class StoredPrefill:
    """Prefill methods of :class:`~llm_marl.backends.hf.HFPolicy` (a mixin: the policy holds ``model``, ``device``,
    ``pad_id``, ``reuse_cache``, ``kv_cache`` and ``cache_stats``)."""

    model: Any
    pad_id: int
    reuse_cache: bool
    kv_cache: PrefixCache
    cache_stats: CacheStats

    def _prefill(self, prompts: list[list[int]], adapters: list[str | None], max_new_tokens: int,
                 select: Callable[[list[str | None]], dict[str, Any]]) -> Prefill:
        """Run the prompts of a call: each distinct (prompt, adapter) once past its stored prefix, then copied to
        every row holding it."""
        source, firsts = shared_rows([(tuple(p), a) for p, a in zip(prompts, adapters)])
        distinct, distinct_adapters = [prompts[r] for r in firsts], [adapters[r] for r in firsts]
        shared = self._prefill_shared_prefixes(distinct, distinct_adapters, select)
        ids, mask, positions, cache, extended = self._prefill_inputs(distinct, distinct_adapters, max_new_tokens,
                                                                     shared)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         **cache_keyword(self.model, cache), use_cache=True, logits_to_keep=1,
                         **select(distinct_adapters))
        expand = torch.tensor(source, dtype=torch.long, device=self.device)
        if len(firsts) < len(prompts):                                      # copy each prompt's cache to its G rows
            cache.batch_select_indices(expand)
        logits = out.logits[:, -1:, :].float()[expand]                      # [rows, positions fed, vocab]
        return Prefill(logits, cache, mask[expand], positions[expand][:, -1], extended)

    def _prefill_shared_prefixes(self, prompts: list[list[int]], adapters: list[str | None], select) -> set[tuple]:
        """Run, once per adapter, the prefix its store-missing prompts share, and store it; returns the stored keys.

        The prompts of one turn of many episodes (or the roots of many MAGRPO trees) share their
        system message and instructions (41 of 69 tokens in ``arithmetic_debate-v0``) but have nothing
        stored yet. Where distinct prompts of an adapter reuse less than :data:`MIN_SHARED_PREFIX` tokens
        from the store and share at least that many (:func:`~llm_marl.backends.prefix_cache.shared_prefixes`),
        each such prefix runs in one row and goes into the store, so the prefill that follows runs only
        what each prompt adds (counted as ``shared``; the entries are dropped after the call). Only with
        ``reuse_cache``.
        """
        if not self.reuse_cache:
            return set()
        candidates: dict[str | None, list[list[int]]] = {}
        for prompt, adapter in zip(prompts, adapters):
            if self.kv_cache.longest_prefix(adapter, prompt)[1] < MIN_SHARED_PREFIX:
                candidates.setdefault(adapter, []).append(prompt)
        prefixes = [
            (list(prefix), adapter) for adapter, group in candidates.items() for prefix in shared_prefixes(group)
        ]
        if not prefixes:
            return set()
        shared_prompts, shared_adapters = [p for p, _ in prefixes], [a for _, a in prefixes]
        ids, mask, positions, cache, _ = self._prefill_inputs(shared_prompts, shared_adapters, 0, record=False)
        self.model(input_ids=ids, attention_mask=mask, position_ids=positions, **cache_keyword(self.model, cache),
                   use_cache=True, logits_to_keep=1, **select(shared_adapters))
        self._store(cache, mask, list(range(len(prefixes))), shared_prompts, shared_adapters, [[]] * len(prefixes))
        self.cache_stats.shared_prefixes += len(prefixes)
        return {(adapter, tuple(prompt)) for prompt, adapter in prefixes}

    def _prefill_inputs(self, prompts: list[list[int]], adapters: list[str | None], max_new_tokens: int,
                        shared: set[tuple] = frozenset(), record: bool = True):
        """``(ids, mask, positions, cache, extended)`` of the prefill: each prompt's tokens past its stored prefix.

        Row layout: ``[pad][stored prefix][pad][new tokens]``. The stored keys and values are copied into
        the cache, left-padded to the longest prefix; the mask zeroes both pads, and positions count real
        tokens only, so each row computes what a prefill of its whole prompt would. ``extended``: the
        entries some prompt extended whole (superseded once the call is done), and the ``shared`` prefixes
        (see :meth:`_prefill_shared_prefixes`). ``record=False``: the caller counts these prompts itself.
        """
        matches = [self.kv_cache.longest_prefix(a, p) if self.reuse_cache else (None, 0)
                   for p, a in zip(prompts, adapters)]
        reused = [n for _, n in matches]
        extended = set(shared)
        for prompt, (key, n) in zip(prompts, matches):
            if key in shared and n == len(key[1]):
                self.cache_stats.record_shared(len(prompt), n)
            elif record and self.cache_stats.record(len(prompt), key, n):
                extended.add(key)
            elif not record:
                self.cache_stats.prefill_tokens += len(prompt) - n
                self.cache_stats.prefill_tokens_saved += n
        ids, new_mask = left_pad([p[n:] for p, n in zip(prompts, reused)], self.pad_id)
        width = max(reused)
        stored_mask = torch.tensor([[0] * (width - n) + [1] * n for n in reused], dtype=torch.long)
        mask = torch.cat([stored_mask, new_mask], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, width:]
        device = self.device
        cache = reserved_cache(room=max_new_tokens + ids.shape[1])
        if width:
            layers = [self.kv_cache.get(key) if key is not None else None for key, _ in matches]
            template = next(entry for entry in layers if entry is not None)
            for layer, (k0, v0) in enumerate(template):
                keys = k0.new_zeros((len(prompts), k0.shape[0], width, k0.shape[-1]), device=device)
                values = v0.new_zeros(keys.shape)
                for row, (entry, n) in enumerate(zip(layers, reused)):
                    if n:
                        keys[row, :, width - n:] = entry[layer][0][:, :n]
                        values[row, :, width - n:] = entry[layer][1][:, :n]
                cache.update(keys, values, layer)
        return ids.to(device), mask.to(device), positions.to(device), cache, extended

    def _store(self, cache, mask: torch.Tensor, cache_rows: list[int], prompts: list[list[int]],
               adapters: list[str | None], completions: list[list[int]]) -> None:
        """Keep the states of (prompt + the completion tokens fed back) of each given cache row in the store."""
        seen = set()
        for row, prompt, adapter, completion in zip(cache_rows, prompts, adapters, completions):
            columns = mask[row].nonzero().squeeze(-1)
            length = min(len(prompt) + len(completion), len(columns))   # the last sampled token was not fed
            key = (adapter, tuple(prompt + completion)[:length])
            if key in seen:
                continue
            seen.add(key)
            columns = columns[:length]
            self.kv_cache.put(adapter, key[1], [(layer.keys[row][:, columns], layer.values[row][:, columns])
                                                for layer in cache.layers])
