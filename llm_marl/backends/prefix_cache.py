"""`PrefixCache`: KV caches of finished sequences, so a prompt that extends one prefills only its new tokens.

In a multi-turn episode an agent's prompt at turn t+1 is its prompt at turn t, its own answer,
and the new user message; in a MAGRPO tree a child's prompt continues its parent's prompt and
one sampled answer. After each generate call the HF policy stores, per row, the keys and values
of (prompt + the completion tokens it fed) under ``(adapter, token ids)``; the next call looks up,
for each prompt, the stored sequence sharing its longest prefix and prefills only the rest.

Keys are exact token ids: a hit can only reuse states the model computed for the very same
tokens under the same adapter (causal attention: the states of a prefix do not depend on what
follows). The store is bounded by bytes (least recently used entries go first); its owner drops
entries that a call extended (they are superseded) and clears it when the weights change.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Hashable, Sequence

import torch

KVLayers = list[tuple[torch.Tensor, torch.Tensor]]   # per layer: keys, values of one sequence [heads, tokens, dim]


@dataclass
class CacheStats:
    """Counters of prefix reuse (per distinct prompt row) and of answers spliced in as sampled."""

    hits: int = 0                   # the prompt extended a whole stored sequence
    partial: int = 0                # it shared only part of one (the re-rendered history diverged from the stored ids)
    misses: int = 0                 # nothing stored shared a prefix with it: full prefill
    prefill_tokens: int = 0         # prompt tokens run through the model
    prefill_tokens_saved: int = 0   # prompt tokens taken from the store instead
    splices: int = 0                # prompts built with the agent's earlier answer ids as sampled
    splice_fallbacks: int = 0       # earlier answers the chat template would not let us splice (rendered afresh)

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict (for metrics)."""
        return asdict(self)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


class PrefixCache:
    """A byte-bounded, least-recently-used store of per-sequence KV caches keyed by ``(adapter, token ids)``."""

    def __init__(self, max_bytes: int = 2**30) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 (0 stores nothing), got {max_bytes}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[tuple[Hashable, tuple[int, ...]], tuple[KVLayers, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, adapter: Hashable, ids: Sequence[int], layers: KVLayers) -> None:
        """Store the states of ``ids`` (evicting the least recently used entries beyond ``max_bytes``)."""
        key = (adapter, tuple(ids))
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        self.drop(key)
        if size > self.max_bytes:
            return
        self._entries[key] = (layers, size)
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            self.drop(next(iter(self._entries)))

    def longest_prefix(self, adapter: Hashable, ids: Sequence[int]) -> tuple[tuple | None, int]:
        """``(key, n)``: the entry of ``adapter`` sharing the longest prefix with ``ids`` and its length ``n``.

        ``n`` is at most ``len(ids) - 1``: the last prompt token must still run to give the next token's logits.
        """
        ids = tuple(ids)
        best, best_n = None, 0
        for key in self._entries:
            if key[0] == adapter:
                n = common_prefix_length(key[1], ids)
                if n > best_n:
                    best, best_n = key, n
        if best is not None:
            self._entries.move_to_end(best)
        return best, min(best_n, len(ids) - 1)

    def layers(self, key: tuple) -> KVLayers:
        """The stored states of an entry (``[heads, tokens, dim]`` keys and values per layer)."""
        return self._entries[key][0]

    def drop(self, key: tuple) -> None:
        """Forget one entry (no error if absent)."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.nbytes -= entry[1]

    def clear(self) -> None:
        """Forget everything."""
        self._entries.clear()
        self.nbytes = 0
