"""The one inference interface every backend implements (HF, llama.cpp, OpenAI-compatible).

The rollout engine, both trainers and the benchmark harness only talk to a :class:`Policy`.
A backend that can also score tokens (the HF policy, used for training) fills in
``Generation.prompt_ids``/``completion_ids``/``logprobs``; inference-only backends leave them
``None``. A backend that keeps state between calls (the HF and llama.cpp policies' KV caches of earlier turns)
may offer ``clear_cache()``; the rollout engine calls it when the episodes or trees it ran are done.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numpy as np

Message = dict[str, str]          # {"role": "system"|"user"|"assistant", "content": str}
Conversation = list[Message]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions.

    ``seed`` makes ONE ``generate`` call reproducible: the same seed, prompts and weights give the
    same samples. A caller that samples several times (every turn of an episode, every level of a
    MAGRPO tree) must not reuse it, or turn t+1 would draw the same noise as turn t; it derives a
    fresh seed per call with :meth:`for_call` (the rollout engine does this for every turn), so a
    whole run stays reproducible from its one seed while every call draws new noise.

    ``no_repeat_ngram = n > 0`` bans, at every step, each token that would complete a token n-gram the
    completion already holds (the prompt may still be quoted): greedy decoding cannot fall into a loop.
    Only the ``hf`` backend applies it; the others refuse it with ``ValueError``.
    """

    max_new_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.9
    seed: int | None = None
    no_repeat_ngram: int = 0     # n > 0: a completion never repeats one of its own word-piece n-grams (HF backend)

    def __post_init__(self) -> None:
        if self.no_repeat_ngram < 0:
            raise ValueError(f"no_repeat_ngram must be >= 0 (0: off), got {self.no_repeat_ngram}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def for_call(self, *keys: int) -> SamplingParams:
        """These settings with a seed derived from ``(seed, *keys)``: distinct keys give independent noise.

        Without a seed the backend draws fresh noise from its own generator anyway: ``self`` is returned.
        """
        if self.seed is None:
            return self
        state = np.random.SeedSequence([self.seed & 0xFFFFFFFFFFFFFFFF, *keys]).generate_state(1)[0]
        return replace(self, seed=int(state) & 0x7FFFFFFF)


@dataclass
class Generation:
    """One sampled completion."""

    text: str
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None     # per completion token, under the sampling policy
    finish_reason: str = "stop"             # "stop" (EOS) or "length" (hit max_new_tokens)

    @property
    def num_tokens(self) -> int:
        """Completion length in tokens (0 when the backend did not report tokens)."""
        return len(self.completion_ids) if self.completion_ids is not None else 0


@runtime_checkable
class Policy(Protocol):
    """Anything that turns chat conversations into sampled completions."""

    name: str

    def generate(
        self,
        conversations: Sequence[Conversation],
        params: SamplingParams,
        *,
        adapters: Sequence[str | None] | None = None,
        num_samples: int = 1,
    ) -> list[list[Generation]]:
        """Sample ``num_samples`` completions per conversation, in one batched call where possible.

        ``adapters[i]`` names the LoRA adapter to use for conversation ``i`` (``None`` = base
        model); backends without adapters reject a non-``None`` name with ``ValueError``.
        Returns one list of ``num_samples`` generations per conversation, in input order.
        """
        ...
