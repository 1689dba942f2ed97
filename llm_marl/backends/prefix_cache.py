"""`PrefixCache`: KV caches of finished sequences, so a prompt that extends one prefills only its new tokens;
`AnswerSplicer`: prompts that keep a policy's own earlier answers as the token ids it sampled.

In a multi-turn episode an agent's prompt at turn t+1 is its prompt at turn t, its own answer,
and the new user message; in a MAGRPO tree a child's prompt continues its parent's prompt and
one sampled answer. After each generate call a policy (HF, llama.cpp) stores, per sequence, the
keys and values of (prompt + the completion tokens it fed) under ``(adapter, token ids)``; the
next call looks up, for each prompt, the stored sequence sharing its longest prefix and prefills
only the rest. What a stored entry holds is the backend's (HF: per-layer tensors; llama.cpp: its
sequence state bytes); the store only weighs it.

Keys are exact token ids: a hit can only reuse states the model computed for the very same
tokens under the same adapter (causal attention: the states of a prefix do not depend on what
follows). The store is bounded by bytes (least recently used entries go first); its owner drops
entries that a call extended (they are superseded) and clears it when the weights change.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..policy import Conversation

MIN_SHARED_PREFIX = 16   # tokens that a call's store-missing prompts must share before that prefix runs once for all


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
    shared: int = 0                 # prompts that started from a prefix they share with others of the call, run once
    shared_prefixes: int = 0        # such prefixes run (their tokens count in prefill_tokens once)

    def record(self, prompt_length: int, key: tuple | None, reused: int) -> bool:
        """Count one prompt reusing ``reused`` tokens of stored entry ``key``; whether it extends the whole entry."""
        self.prefill_tokens += prompt_length - reused
        self.prefill_tokens_saved += reused
        if key is None or reused == 0:
            self.misses += 1
            return False
        if reused == len(key[1]):
            self.hits += 1
            return True
        self.partial += 1
        return False

    def record_shared(self, prompt_length: int, reused: int) -> None:
        """Count one prompt that starts from a prefix of ``reused`` tokens run once for several prompts of the call."""
        self.prefill_tokens += prompt_length - reused
        self.prefill_tokens_saved += reused
        self.shared += 1

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict (for metrics)."""
        return asdict(self)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


def shared_prefixes(prompts: Sequence[Sequence[int]], min_length: int = MIN_SHARED_PREFIX) -> list[tuple[int, ...]]:
    """Prefixes of at least ``min_length`` tokens that two or more of ``prompts`` share, one per group of prompts.

    The prompts are sorted; neighbours sharing fewer than ``min_length`` tokens start a new group, and a
    group's prefix is what all its prompts share, short of each one's last token (which must still run
    to give the next token's logits). A debate turn's prompts make one group per agent (its system
    message and the instructions); the G samples of one prompt share all of it but the last token.
    """
    ordered = sorted(tuple(p) for p in prompts)
    groups: list[list[tuple[int, ...]]] = []
    shared: list[int] = []
    for before, prompt in zip([None, *ordered], ordered):
        n = common_prefix_length(before, prompt) if before is not None else 0
        if n < min_length:
            groups.append([prompt])
            shared.append(len(prompt))
        else:
            groups[-1].append(prompt)
            shared[-1] = min(shared[-1], n)
    out = []
    for group, n in zip(groups, shared):
        n = min(n, min(map(len, group)) - 1)
        if len(group) > 1 and n >= min_length:
            out.append(group[0][:n])
    return out


class PrefixCache:
    """A byte-bounded, least-recently-used store of per-sequence KV caches keyed by ``(adapter, token ids)``.

    A value is either per-layer ``(keys, values)`` tensors (weighed by their elements) or any object
    whose size the caller gives (``nbytes``).
    """

    def __init__(self, max_bytes: int = 2**30) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 (0 stores nothing), got {max_bytes}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[tuple[Hashable, tuple[int, ...]], tuple[Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, adapter: Hashable, ids: Sequence[int], value: Any, nbytes: int | None = None) -> None:
        """Store the states of ``ids`` (evicting the least recently used entries beyond ``max_bytes``).

        ``value``: per-layer ``(keys, values)`` tensors, or anything else of ``nbytes`` bytes.
        """
        key = (adapter, tuple(ids))
        size = nbytes if nbytes is not None else sum(k.numel() * k.element_size() + v.numel() * v.element_size()
                                                     for k, v in value)
        self.drop(key)
        if size > self.max_bytes:
            return
        self._entries[key] = (value, size)
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

    def get(self, key: tuple) -> Any:
        """The stored states of an entry, as put (e.g. ``[heads, tokens, dim]`` keys and values per layer)."""
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


class AnswerSplicer:
    """A policy's own answers as the ids it sampled, and prompts that continue one built from those ids.

    Re-tokenizing an answer's text can give other ids than the model sampled (a word split
    otherwise), so the next turn's prompt would neither be the tokens the model saw nor extend its
    stored KV cache. :meth:`spliced` encodes a conversation whose last assistant message is a
    remembered answer as (the earlier prompt ids + the answer's ids as sampled + the template's ids
    of the rest). The text is the template's: the splice is made only when the template renders
    that answer's text right after the earlier prompt; otherwise the conversation is rendered
    afresh and ``splice_fallbacks`` counts it.

    ``render(conversation)``: the chat template's text with the generation prompt; ``tokenize(text)``
    and ``detokenize(ids)`` without adding special tokens; ``stop_ids`` end an answer.
    """

    def __init__(self, render: Callable[[Conversation], str], tokenize: Callable[[str], list[int]],
                 detokenize: Callable[[list[int]], str], stop_ids: Collection[int], size: int = 4096) -> None:
        self.render, self.tokenize, self.detokenize = render, tokenize, detokenize
        self.stop_ids = set(stop_ids)
        self.size = size
        self._answers: dict[
            tuple, tuple[list[int], list[int]]
        ] = {}  # conversation + own answer -> (prompt, answer) ids

    def __len__(self) -> int:
        return len(self._answers)

    def remember(self, conversation: Conversation, prompt_ids: list[int], completion_ids: list[int], text: str) -> None:
        """Record the answer ``text`` sampled as ``completion_ids`` (a final stop token dropped) after ``prompt_ids``.

        Only answers whose ids decode back to exactly ``text`` are kept.
        """
        answer = completion_ids[:-1] if completion_ids and completion_ids[-1] in self.stop_ids else completion_ids
        if self.detokenize(answer) == text:
            key = conversation_key([*conversation, {"role": "assistant", "content": text}])
            remember(self._answers, key, (list(prompt_ids), list(answer)), self.size)

    def spliced(self, conversation: Conversation, stats: CacheStats) -> list[int] | None:
        """Ids of ``conversation`` with its last assistant message spliced in as sampled, or ``None``.

        ``None`` when that message is not a remembered answer, or when the template does not render
        its text right after the earlier prompt (counted in ``stats.splice_fallbacks``).
        """
        last = max((i for i, m in enumerate(conversation) if m["role"] == "assistant"), default=None)
        found = self._answers.get(conversation_key(conversation[:last + 1])) if last is not None else None
        if found is None:
            return None
        prompt_ids, answer_ids = found
        head = self.render(conversation[:last]) + conversation[last]["content"]
        text = self.render(conversation)
        if not text.startswith(head):
            stats.splice_fallbacks += 1
            return None
        stats.splices += 1
        return [*prompt_ids, *answer_ids, *self.tokenize(text[len(head):])]

    def clear(self) -> None:
        """Forget every answer."""
        self._answers.clear()


def conversation_key(conversation: Conversation) -> tuple:
    """A hashable key of a conversation's messages."""
    return tuple((m["role"], m["content"]) for m in conversation)


def remember(store: dict, key: Hashable, value: Any, size: int) -> None:
    """``store[key] = value``, first dropping the oldest entry when ``store`` holds ``size`` entries."""
    if len(store) >= size:
        store.pop(next(iter(store)))
    store[key] = value
