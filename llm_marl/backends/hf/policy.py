"""`HFPolicy`: a transformers causal LM as a :class:`~llm_marl.policy.Policy` that samples with log-probs and
scores tokens for training."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...hardware import CoreMeter, keep_freed_memory
from ...policy import Conversation, Generation, SamplingParams
from ..prefix_cache import AnswerSplicer, CacheStats, PrefixCache, conversation_key, remember
from .adapters import AdapterAccess
from .decode_loop import DecodeLoop
from .options import HFPerformanceOptions, PolicyOption
from .prefill import StoredPrefill
from .scoring import Scoring
from .weights import OptimizerSteps, contiguous_head_input, set_weight_layout, weights_version


class HFPolicy(AdapterAccess, Scoring, StoredPrefill, DecodeLoop):
    """A transformers causal LM + tokenizer, optionally a PEFT model carrying several named LoRA adapters.

    Sampling runs a lean decode loop (KV cache, one forward per new token, left padding) that
    also returns per-token log-probs; a batch may mix adapters (PEFT ``adapter_names``), so all
    agents sharing one frozen base are sampled in ONE call. :meth:`token_logprobs` recomputes
    log-probs of given completions under one adapter (with gradients, for the losses) or under
    the reference policy (the base with adapters disabled). The model stays in eval mode: PEFT
    refuses mixed-adapter batches in training mode and the Llama family has no dropout.
    Inputs are built on the model's device (:attr:`device`), so the model may live on any GPU.

    ``options`` (:class:`~llm_marl.backends.hf.HFPerformanceOptions`) holds the switches that make it
    fast; each may also be passed as a keyword (``HFPolicy(model, tokenizer, reuse_cache=False)``) and
    read or set as an attribute (``policy.reuse_cache``). Multi-turn prompts extend earlier ones, and
    two of them make that cheap and exact:

    * ``reuse_cache``: after each call the KV cache of every row (prompt + fed completion tokens) is
      kept in a :class:`~llm_marl.backends.prefix_cache.PrefixCache` of at most ``cache_bytes``; a
      later prompt prefills only the tokens past the longest stored prefix under its adapter. The
      store lives here, keyed by token ids, rather than behind handles the rollout engine passes
      around: ids cannot go stale or point at the wrong row, the :class:`~llm_marl.policy.Policy`
      interface stays the same for every backend, and MAGRPO children (env clones) hit their
      parent's entry with no bookkeeping. A sequence extended by a call is dropped (superseded),
      the store is cleared when any weight changes, and the rollout engine calls
      :meth:`clear_cache` when its episodes or trees are done. Prompts of one call that find nothing
      stored but share a prefix (a debate turn's system message and instructions) have that prefix
      run once per adapter first.
    * ``splice_answers``: a conversation that continues one of this policy's own answers is encoded
      as (the earlier prompt ids + the answer's ids as sampled + the template's tokens for the rest)
      instead of re-tokenizing the answer's text, which can give other ids. The text is the same
      (the ids decode to the template's rendering); the model sees the tokens it produced, the
      trajectory stays token-exact for the trainers, and every later turn hits the cache. Where
      the template renders a past answer otherwise, the conversation is rendered afresh (counted).
      (:class:`~llm_marl.backends.prefix_cache.AnswerSplicer`, shared with the llama.cpp policy.)

    :attr:`cache_stats` counts hits, prefill tokens run and saved, splices and fallbacks;
    :attr:`decode_steps`, :attr:`draft_tokens_fed` and :attr:`draft_tokens_accepted` count the decode loop.

    A seeded call replays: its samples depend on the seed, the weights, the prompts and the thread count, and
    a seeded call's thread count does not follow the machine's load (:meth:`call_threads`); a prefix from the
    store or another batch layout changes a sample only where two tokens tie within float rounding (see
    :mod:`~llm_marl.backends.hf.sampling` and ``docs/reliability_seeds.md``).

    Building a policy also makes the process's ``malloc`` keep freed memory for the next tensor
    (:func:`~llm_marl.hardware.keep_freed_memory`; ``LLM_MARL_HEAP=system`` leaves it alone), recorded
    in :attr:`heap`.
    """

    reuse_cache = PolicyOption()
    splice_answers = PolicyOption()
    threads = PolicyOption()
    grouped_lora = PolicyOption()
    drop_finished_rows = PolicyOption()
    draft_tokens = PolicyOption()
    draft_free_positions = PolicyOption()

    def __init__(self, model, tokenizer, name: str | None = None, template_cache_size: int = 4096, *,
                 options: HFPerformanceOptions | None = None, **switches: Any) -> None:
        self.options = (options or HFPerformanceOptions()).with_switches(**switches)
        self.heap = keep_freed_memory()  # activations reuse freed heap memory instead of faulting in new pages
        if self.options.input_major_weights:
            set_weight_layout(model, input_major=True)
        self.model = model
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_id = int(tokenizer.pad_token_id)
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos = eos if isinstance(eos, (list, tuple)) else [eos]
        self.stop_ids = sorted({int(t) for t in [*eos, tokenizer.eos_token_id] if t is not None})
        self._templates: dict[tuple, list[int]] = {}
        self.splicer = AnswerSplicer(
            render=lambda conversation: self._render(conversation, tokenize=False),
            tokenize=lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
            detokenize=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            stop_ids=self.stop_ids, size=template_cache_size)
        self._template_cache_size = template_cache_size
        self.kv_cache = PrefixCache(self.options.cache_bytes)
        self.cache_stats = CacheStats()
        self._weights_version: tuple[int, int] | None = None
        OptimizerSteps.start()           # from now on, count optimizer steps (see _check_weights)
        self._check_weights()
        self.generate_calls = 0          # batched generate calls made (the rollout engine batches across agents)
        self.prefill_seconds = 0.0       # wall time of sampling calls spent in prefill forwards (shared prefixes too)
        self.decode_seconds = 0.0        # ... and in decode steps (forward + sampling), for roofline measurements
        self.gradient_checkpointing = False
        self.lockstep = False            # sharded weights (FSDP): scoring makes the same forward calls on every process
        self.decode_steps = 0            # decode forwards run
        self.draft_tokens_fed = 0        # prompt-lookup draft tokens fed to decode steps ...
        self.draft_tokens_accepted = 0   # ... and kept
        self.core_meter = CoreMeter()
        self.last_threads: int | None = None
        contiguous_head_input(model)
        model.eval()

    @property
    def device(self) -> torch.device:
        """The device of the model's (first) parameters, where inputs are put."""
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ prompts
    def encode(self, conversation: Conversation) -> list[int]:
        """Token ids of ``conversation`` rendered by the chat template with the generation prompt (cached).

        With ``splice_answers``, a conversation that continues one of this policy's answers keeps that
        answer's sampled ids (see the class docstring).
        """
        key = conversation_key(conversation)
        ids = self._templates.get(key)
        if ids is None:
            ids = (self.splicer.spliced(conversation, self.cache_stats) if self.splice_answers else None) \
                or self._render(conversation)
            remember(self._templates, key, ids, self._template_cache_size)
        return ids

    def _render(self, conversation: Conversation, tokenize: bool = True) -> Any:
        """The chat template's rendering with the generation prompt: token ids, or the text."""
        out = self.tokenizer.apply_chat_template(list(conversation), add_generation_prompt=True, tokenize=tokenize,
                                                 return_dict=False)
        if not tokenize:
            return out
        return list(out[0] if out and isinstance(out[0], list) else out)   # some tokenizers return a batch

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def generate(
        self,
        conversations: Sequence[Conversation],
        params: SamplingParams,
        *,
        adapters: Sequence[str | None] | None = None,
        num_samples: int = 1,
        threads: int | Callable[[], int] | None = None,
    ) -> list[list[Generation]]:
        """Sample ``num_samples`` completions per conversation in ONE batched decode (adapters may differ per row).

        ``threads``: torch threads for this call only (default: :meth:`call_threads`); a callable is asked again
        before every decode step (:func:`~llm_marl.backends.hf.generate_all` hands the cores of a finished
        concurrent call to the ones still running).
        """
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if adapters is not None and len(adapters) != len(conversations):
            raise ValueError(
                f"got {len(adapters)} adapters for {len(conversations)} conversations; pass one per conversation"
            )
        if not conversations:
            return []
        adapters = list(adapters) if adapters is not None else [None] * len(conversations)
        for adapter in set(adapters):
            self._check_adapter(adapter)
        self._check_weights()
        prompts = [self.encode(c) for c in conversations for _ in range(num_samples)]
        row_adapters = [a for a in adapters for _ in range(num_samples)]
        step_threads = threads if callable(threads) else None
        chosen = self.call_threads(step_threads() if step_threads else threads, seeded=params.seed is not None)
        with self._running_on(chosen):
            completions, logprobs, finished = self._decode(prompts, row_adapters, params, step_threads)
        self.generate_calls += 1
        out: list[list[Generation]] = []
        for i in range(len(conversations)):
            group = []
            for row in range(i * num_samples, (i + 1) * num_samples):
                text = self.tokenizer.decode(completions[row], skip_special_tokens=True)
                if self.splice_answers:
                    self.splicer.remember(conversations[i], prompts[row], completions[row], text)
                group.append(Generation(text=text, prompt_ids=prompts[row], completion_ids=completions[row],
                                        logprobs=logprobs[row], finish_reason="stop" if finished[row] else "length"))
            out.append(group)
        return out

    def clear_cache(self) -> None:
        """Forget the stored KV caches and answer ids (when the episodes or trees that made them are done)."""
        self.kv_cache.clear()
        self.splicer.clear()

    def weights_version(self) -> tuple[int, int]:
        """A value that changes whenever a weight of the model may have (a load, an optimizer step)."""
        return weights_version(self.model)

    def adopt(self, conversation: Conversation, generation: Generation) -> None:
        """Take ``generation`` as this policy's answer to ``conversation`` without sampling it (a kept greedy
        answer, :class:`~llm_marl.rollout.GreedyCache`): the next turn's prompt splices its ids as if sampled."""
        if self.splice_answers and generation.prompt_ids is not None and generation.completion_ids is not None:
            self.splicer.remember(conversation, generation.prompt_ids, generation.completion_ids, generation.text)

    def _check_weights(self) -> None:
        """Clear the KV store if any weight may have changed since it was filled (:func:`weights_version`)."""
        version = weights_version(self.model)
        if version != self._weights_version:
            self.kv_cache.clear()
            self._weights_version = version

    # ------------------------------------------------------------------ threads
    def call_threads(self, threads: int | None = None, seeded: bool = False) -> int:
        """Torch threads for one generate call: ``threads`` if given, else the policy's ``threads``, else
        the process's ``torch.get_num_threads()`` for a ``seeded`` call, else the cores other processes
        leave free (:class:`~llm_marl.hardware.CoreMeter`), at most the process setting.

        A seeded call does not follow the machine's load because the thread count can change how float sums
        round (how a matrix product splits its work), and so which token a near-tie gives; the process setting
        is the user's to fix (``torch.set_num_threads``, ``--threads``).
        """
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1 (or None), got {threads}")
        process = torch.get_num_threads()
        if threads or self.threads:
            return threads or self.threads
        return process if seeded else min(process, self.core_meter.free_cores())

    @contextlib.contextmanager
    def _running_on(self, threads: int):
        """Run one call on ``threads`` torch threads (recorded in :attr:`last_threads`); restore the setting after."""
        before = torch.get_num_threads()
        self.last_threads = threads
        if threads != before:
            torch.set_num_threads(threads)
        try:
            yield
        finally:
            if threads != before:
                torch.set_num_threads(before)
