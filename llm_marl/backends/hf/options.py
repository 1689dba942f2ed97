"""`HFPerformanceOptions`: the switches that make :class:`~llm_marl.backends.hf.HFPolicy` fast, in one place."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..prompt_lookup import DRAFT_FREE_POSITIONS, DRAFT_TOKENS


@dataclass(frozen=True)
class HFPerformanceOptions:
    """How :class:`~llm_marl.backends.hf.HFPolicy` runs its forwards. The defaults are the fastest settings
    (``benchmarks/`` times each against the plain path; the Performance page lists them); each switch can be
    turned off to compare against the plain path.

    Parameters that reuse work across calls (multi-turn prompts extend earlier ones):

    * ``reuse_cache``, ``cache_bytes``: keep each row's KV cache after a call in a byte-bounded store and
      prefill a later prompt only past its longest stored prefix.
    * ``splice_answers``: encode a conversation that continues one of the policy's own answers with the
      answer's ids as sampled (the model sees the tokens it produced; every later turn hits the store).
      Off, the conversation is rendered and tokenized afresh, which can split an answer otherwise.

    Parameters of the decode loop:

    * ``threads``: torch threads for each generate call; ``None``: chosen per call (see
      :meth:`~llm_marl.backends.hf.HFPolicy.call_threads`).
    * ``grouped_lora``: a mixed-adapter batch stacks every adapter of a layer into two matrix products
      (:class:`~llm_marl.backends.lora_rows.AdapterRows`) instead of PEFT's per-adapter hooks.
    * ``drop_finished_rows``: rows that sampled EOS leave the decode batch once a quarter have.
    * ``draft_tokens``, ``draft_free_positions``: greedy decoding feeds up to ``draft_tokens`` prompt-lookup
      drafts per row and step (:mod:`~llm_marl.backends.prompt_lookup`); ``0`` is off.

    Parameters of the weights:

    * ``input_major_weights``: a float32 model on the CPU gets its linear weights stored transposed
      (:func:`~llm_marl.backends.hf.set_weight_layout`).

    Each switch changes speed or memory only: outputs agree within float rounding either way, except
    ``splice_answers``, which changes which ids a re-rendered answer has.
    """

    reuse_cache: bool = field(default=True, metadata={"help": "keep KV caches between calls (prefix store)"})
    cache_bytes: int = field(default=2**30, metadata={"help": "bytes the prefix store may hold"})
    splice_answers: bool = field(default=True, metadata={"help": "keep the policy's own answers as sampled ids"})
    threads: int | None = field(default=None, metadata={"help": "torch threads per call (None: chosen per call)"})
    grouped_lora: bool = field(default=True, metadata={"help": "stacked mixed-adapter LoRA products"})
    drop_finished_rows: bool = field(default=True, metadata={"help": "finished rows leave the decode batch"})
    draft_tokens: int = field(default=DRAFT_TOKENS, metadata={"help": "prompt-lookup drafts per greedy step"})
    draft_free_positions: float = field(default=DRAFT_FREE_POSITIONS,
                                        metadata={"help": "a decode step's fixed cost in positions' compute"})
    input_major_weights: bool = field(default=True, metadata={"help": "store float32 CPU linear weights transposed"})

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 (or None: chosen at each call), got {self.threads}")
        if self.draft_tokens < 0:
            raise ValueError(f"draft_tokens must be >= 0 (0: no prompt-lookup drafts), got {self.draft_tokens}")
        if self.cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0 (0 stores nothing), got {self.cache_bytes}")

    @classmethod
    def names(cls) -> list[str]:
        """The switches' names."""
        return [f.name for f in fields(cls)]

    def with_switches(self, **switches: Any) -> HFPerformanceOptions:
        """A copy with some switches changed; an unknown name is a ``TypeError`` listing the known ones."""
        unknown = sorted(set(switches) - set(self.names()))
        if unknown:
            raise TypeError(f"unknown HFPolicy option(s) {unknown}; the options are {self.names()}")
        return replace(self, **switches) if switches else self


class PolicyOption:
    """A policy attribute kept in its options: ``policy.reuse_cache`` reads ``policy.options.reuse_cache``, and
    setting it replaces the options with a validated copy."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, policy: Any, owner: type | None = None) -> Any:
        return self if policy is None else getattr(policy.options, self.name)

    def __set__(self, policy: Any, value: Any) -> None:
        policy.options = policy.options.with_switches(**{self.name: value})
