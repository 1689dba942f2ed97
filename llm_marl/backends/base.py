"""What the inference-only backends (llama.cpp, OpenAI-compatible servers) share: argument checks and seeds.

Sampling seeds: with ``SamplingParams.seed`` set, sample ``j`` of conversation ``i`` in a call uses
a seed derived from ``(seed, i, j)``: identical prompts in one call (e.g. every debater's first
turn) still get independent samples, and a call is reproducible on its own. Callers that sample
repeatedly derive a new seed per call (``SamplingParams.for_call``; the rollout engine does it per
turn). Without a seed, seeds are drawn from the policy's own generator (seeded by the
constructor's ``seed``), fresh on every call.

Neither inference backend can score tokens, so ``Generation.logprobs`` stays ``None`` (use the HF
policy for training). Both report token counts: llama.cpp returns the real ids, a server its
``usage.completion_tokens`` (:class:`CountedGeneration`).
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..policy import Conversation, Generation, SamplingParams


@dataclass
class CountedGeneration(Generation):
    """A generation from a backend that reports a token count but not the token ids."""

    reported_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        """Completion length in tokens, as reported by the backend."""
        return self.reported_tokens


class SeedSource:
    """Per-sample seeds: derived from ``SamplingParams.seed`` when set, else from a seeded generator."""

    def __init__(self, seed: int | None) -> None:
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()

    def seeds(self, params: SamplingParams, num_conversations: int, num_samples: int) -> list[list[int]]:
        """One 31-bit seed per (conversation, sample)."""
        if params.seed is not None:
            return [[int(np.random.SeedSequence([params.seed, i, j]).generate_state(1)[0] >> 1)
                     for j in range(num_samples)] for i in range(num_conversations)]
        with self._lock:
            drawn = self._rng.integers(0, 2**31 - 1, size=(num_conversations, num_samples))
        return drawn.tolist()


class InferenceBackend:
    """The shared front of the inference-only backends: argument checks and per-sample seeds."""

    backend: str
    _seeds: SeedSource

    def generate(
        self,
        conversations: Sequence[Conversation],
        params: SamplingParams,
        *,
        adapters: Sequence[str | None] | None = None,
        num_samples: int = 1,
    ) -> list[list[Generation]]:
        """Sample ``num_samples`` completions per conversation (no adapters: these backends serve one model)."""
        if adapters is not None and any(a is not None for a in adapters):
            raise ValueError(f"backend {self.backend!r} has no LoRA adapters, got adapters={list(adapters)}; "
                             "use the 'hf' backend to run adapters, or pass adapters=None")
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if params.no_repeat_ngram:
            raise ValueError(f"backend {self.backend!r} does not apply no_repeat_ngram={params.no_repeat_ngram}; "
                             "use the 'hf' backend, or no_repeat_ngram=0")
        for i, conversation in enumerate(conversations):
            if not conversation or not all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in conversation):
                raise ValueError(f"conversation {i} must be a non-empty list of {{'role', 'content'}} messages, "
                                 f"got {conversation!r:.200}")
        return self._sample_all(conversations, params, self._seeds.seeds(params, len(conversations), num_samples))

    def _sample_all(self, conversations: Sequence[Conversation], params: SamplingParams,
                    seeds: list[list[int]]) -> list[list[Generation]]:
        raise NotImplementedError
