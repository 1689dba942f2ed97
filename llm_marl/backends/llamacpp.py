"""llama.cpp on a GGUF file (the default backend for the embedded SmolLM2-135M): :class:`LlamaCppPolicy`.

Batched llama.cpp decoding (llama-cpp-python's low-level API: ``llama_batch``, ``llama_decode``,
per-sequence KV cache operations, sampler chains):

* One context holds up to ``max_batch`` sequences (``n_seq_max``), each with its own KV stream of
  ``n_ctx`` tokens (``kv_unified=False``: a sequence attends to its own cells only). Every
  (conversation, sample) of a call is one *stream*; stream ``k`` is llama.cpp sequence ``k``.
* A step is ONE ``llama_decode`` of one batch holding, in sequence order, the next prompt chunk
  of every stream still prefilling (prefills share the batch's ``n_batch`` tokens in equal chunks,
  so new prompts are prefilled together, beside the other streams' decoding) and the last sampled
  token of every other stream. Logits are kept only where a token is to be sampled. Streams take
  sequence ids in order of the prompt tokens they have left (fewest first), so those still
  prefilling are consecutive ids: llama.cpp then runs a step as one or two micro-batches (it splits
  a batch into micro-batches holding equally many tokens of each sequence), where prompts fed whole
  made one per distinct prompt length (:meth:`LlamaCppPolicy._fill_batch`).
* Each stream samples with its own chain — greedy at temperature 0, else temperature, top-p and a
  draw seeded by the sample's seed — and ends on an end-of-turn token (``finish_reason="stop"``)
  or after ``max_new_tokens`` (``"length"``). Temperature comes before top-p as in the HF policy,
  so both backends sample the same distribution for the same :class:`SamplingParams` (llama.cpp's
  own default chain applies top-p first, which sorts SmolLM2's large raw nucleus for every token).
* A finished stream's KV cells are freed (``llama_memory_seq_rm``) and its slot goes to the next
  waiting sample, so a call with more than ``max_batch`` samples runs as a rolling batch. With
  nobody waiting, the last stream moves into the slot (``llama_memory_seq_cp``): llama.cpp decodes
  consecutive sequence ids as one micro-batch but scattered ones as several.
* Batching changes the speed, not the model: greedy outputs equal one-sequence-at-a-time decoding
  and seeded samples do not depend on ``max_batch`` (both tested), up to float rounding — llama.cpp
  computes a micro-batch of ONE token (a lone sequence's step) with other CPU kernels than one of
  several, and the rounding differences grow through the layers (last-token logits of a debate
  prompt: up to 0.64 apart, top logit ~29), enough to flip a near-tie: a few greedy debate answers of
  64 tokens differ between ``max_batch`` 16 and 1.
* Multi-turn prompts extend earlier ones (``reuse_cache``, off by default here, see the class): when a
  stream finishes, its sequence state (the KV cells of prompt + fed completion, ``llama_state_seq_get_data``) is kept
  in a :class:`~llm_marl.backends.prefix_cache.PrefixCache` in host memory, keyed by its token ids and
  bounded by ``cache_bytes``. A new stream looks up the stored sequence sharing its prompt's longest
  prefix, restores it into its own sequence (``llama_state_seq_set_data``), removes the cells past
  the shared prefix (``llama_memory_seq_rm``) and prefills only the rest. Keeping states off the
  context leaves the live sequence ids dense and the context's size at ``max_batch * n_ctx``; a
  restore is a copy of ~23 KB per token. ``splice_answers`` encodes an agent's own earlier answer as
  the ids it sampled (:class:`~llm_marl.backends.prefix_cache.AnswerSplicer`), so the next turn's
  prompt extends the stored sequence whole. Entries a call extended are dropped afterwards
  (superseded), and :meth:`LlamaCppPolicy.clear_cache` forgets the rest (the rollout engine calls it
  when its episodes or trees are done). :attr:`~LlamaCppPolicy.cache_stats` counts per stream.
  Reuse changes the speed, not the model, up to float rounding as batching does (next point): a
  token's states depend a little on the step that computed them (llama.cpp picks its attention
  kernels by the number of query tokens and KV cells of the step), and a restored prefix was
  computed in earlier steps than a full prefill would use: splitting a prefill into two steps leaves
  the last logits bit-identical for most split points and moves them a little for others, so some
  greedy agent turns of ``benchmarks/rollout_reuse.py`` differ with and without reuse (a flipped
  near-tie changes that answer and the turns after it).
* Memory: the KV cache is allocated up front, ``max_batch * n_ctx`` tokens (f16; 23 KB per token
  for SmolLM2-135M: 0.75 GB at the defaults 8 x 4096).
* Threads: the cores other processes leave free, measured again before every call
  (:class:`~llm_marl.hardware.CoreMeter`); ``n_threads`` fixes them.
* Weight buffers: llama.cpp's extra (repacked) buffer types, except on CPUs with AMX, whose ggml
  kernel crashes (:func:`~llm_marl.hardware.llamacpp_extra_buffers`).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..hardware import CoreMeter, buffer_choice, short_openmp_spin
from ..policy import Conversation, Generation, SamplingParams
from .base import InferenceBackend, SeedSource
from .prefix_cache import MIN_SHARED_PREFIX, AnswerSplicer, CacheStats, PrefixCache, shared_prefixes


def _close_all(resources_ref: weakref.ref[contextlib.ExitStack]) -> None:
    resources = resources_ref()
    if resources is not None:
        resources.close()


@dataclass
class _Stream:
    """One (prompt, seed) being decoded in the shared llama.cpp context, as one of its sequences."""

    job: int                      # index of this sample in the call's flat list of samples
    prompt: list[int]
    sampler: Any                  # llama_cpp LlamaSampler chain, owned (and freed) by this stream
    fed: int = 0                  # tokens (prompt, then completion) already in the KV cache (restored ones included)
    completion: list[int] = field(default_factory=list)
    output_row: int = -1          # batch index of this stream's logits in the last decode, -1 = none

    @property
    def prefilling(self) -> bool:
        """Whether part of the prompt is still to be fed."""
        return self.fed < len(self.prompt)


class LlamaCppPolicy(InferenceBackend):
    """llama.cpp on a GGUF file: up to ``max_batch`` sequences decoded together, with the GGUF's chat template.

    ``n_ctx`` is the context of ONE sequence (prompt + completion); the KV cache holds
    ``max_batch`` of them (see the module docstring). Bigger calls are split into rolling batches.
    ``reuse_cache``, ``cache_bytes`` and ``splice_answers`` keep finished sequences' states for
    prompts that extend them, as :class:`~llm_marl.backends.hf.HFPolicy` does (module docstring).
    ``reuse_cache`` is off by default here: a restored prefix was computed in other ubatch splits than
    a full prefill, which can flip a greedy near-tie (79 of 96 agent turns identical in
    ``benchmarks/rollout_reuse.py``), and results must not change unless asked; it halves prefill.
    """

    backend = "llamacpp"

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        n_ctx: int = 4096,
        max_batch: int = 8,
        n_threads: int | None = None,
        seed: int | None = 0,
        name: str | None = None,
        use_extra_bufts: bool | None = None,
        reuse_cache: bool = False,
        cache_bytes: int = 2**30,
        splice_answers: bool = True,
    ) -> None:
        """Load ``model_path`` with room for ``max_batch`` sequences of ``n_ctx`` tokens each.

        ``n_threads`` fixes the threads; by default every call takes the cores other processes leave
        free (:class:`~llm_marl.hardware.CoreMeter`), so a busy moment at load time does not stick.
        ``use_extra_bufts`` (llama.cpp's repacked/AMX weight buffers) defaults to
        :func:`~llm_marl.hardware.llamacpp_extra_buffers` of this CPU: off where it has AMX.
        """
        # ggml's OpenMP workers wait at a barrier after every operation: a short spin, not libgomp's long
        # one (starves a busy CPU) nor a passive sleep (slows 2 threads down; docs/performance.md, OpenMP
        # wait policies). Effective only if no OpenMP runtime started yet in this process (the CLI sets it first).
        short_openmp_spin()
        try:
            import llama_cpp
            from llama_cpp import _internals
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        except ImportError as err:  # pragma: no cover - depends on the install
            raise ImportError("the 'llamacpp' backend needs llama-cpp-python: pip install llama-cpp-python") from err
        path = Path(model_path)
        if not path.is_file():
            raise ValueError(f"GGUF file {str(path)!r} does not exist; pass the path of a .gguf model file")
        if not isinstance(max_batch, int) or not 1 <= max_batch <= llama_cpp.llama_max_parallel_sequences():
            raise ValueError(f"max_batch must be an int in [1, {llama_cpp.llama_max_parallel_sequences()}] "
                             f"(sequences decoded together), got {max_batch!r}")
        if not isinstance(n_ctx, int) or n_ctx < 16:
            raise ValueError(f"n_ctx must be an int >= 16 (tokens of context per sequence), got {n_ctx!r}")
        self.name = name or path.stem
        self.model_path = str(path)
        self.max_batch = max_batch
        self.fixed_threads = n_threads
        self.core_meter = CoreMeter()
        self.n_threads = n_threads or self.core_meter.free_cores()
        self._llama_cpp = llama_cpp
        self._sampler_chain = _internals.LlamaSampler
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)   # what Llama(verbose=False) does
        llama_cpp.llama_backend_init()

        self._resources = contextlib.ExitStack()
        atexit.register(_close_all, weakref.ref(self._resources))  # before interpreter teardown breaks destructors
        self.buffers = buffer_choice(use_extra_bufts)
        model_params = llama_cpp.llama_model_default_params()
        model_params.use_extra_bufts = self.buffers.use_extra_bufts
        self._model = self._resources.enter_context(contextlib.closing(_internals.LlamaModel(
            path_model=str(path), params=model_params, verbose=False)))
        params = llama_cpp.llama_context_default_params()
        params.n_seq_max = max_batch
        params.n_ctx = n_ctx * max_batch          # total cells; each sequence gets its own n_ctx of them
        params.kv_unified = False                 # one KV stream per sequence: attention spans its own tokens only
        params.n_batch = max(512, max_batch)      # tokens per llama_decode call (prompt chunks + one per stream)
        params.n_ubatch = 512
        params.n_threads = params.n_threads_batch = self.n_threads
        # as llama_cpp.Llama: no flash attention (same numerics as the single-stream backend; no faster on CPU here)
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self._ctx = self._resources.enter_context(contextlib.closing(
            _internals.LlamaContext(model=self._model, params=params, verbose=False)))
        self._memory = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._n_batch = params.n_batch
        self._batch = self._resources.enter_context(contextlib.closing(
            _internals.LlamaBatch(n_tokens=self._n_batch, embd=0, n_seq_max=1, verbose=False)))
        self.n_ctx = llama_cpp.llama_n_ctx_seq(self._ctx.ctx)

        template = self._model.metadata().get("tokenizer.chat_template")
        if not template:
            raise ValueError(f"{path.name} has no tokenizer.chat_template in its GGUF metadata; "
                             "use a chat model or format prompts yourself")
        eos_id = self._model.token_eos()
        bos_id = self._model.token_bos()
        self._formatter = Jinja2ChatFormatter(template=template, eos_token=self._token_text(eos_id),
                                              bos_token=self._token_text(bos_id) if bos_id >= 0 else "")
        self._stop_ids = {eos_id, *(self._special_id(t) for t in ("<|im_end|>", "<|eot_id|>", "<|end|>"))} - {None}
        self._seeds = SeedSource(seed)
        self._lock = threading.Lock()  # one llama context: calls from several threads are serialised
        self.reuse_cache = reuse_cache
        self.splice_answers = splice_answers
        self.kv_cache = PrefixCache(cache_bytes)
        self.cache_stats = CacheStats()
        self._shared: set[tuple] = set()      # store keys of the prefixes this call's streams share
        self.splicer = AnswerSplicer(
            render=self._render, tokenize=self._tokenize,
            detokenize=lambda ids: self._model.detokenize(ids).decode("utf-8", errors="replace"),
            stop_ids=self._stop_ids)

    def close(self) -> None:
        """Free the llama.cpp context and model (also done at exit)."""
        self._resources.close()

    def _token_text(self, token_id: int) -> str:
        return self._model.detokenize([token_id], special=True).decode("utf-8", errors="replace")

    def _special_id(self, text: str) -> int | None:
        ids = self._model.tokenize(text.encode(), add_bos=False, special=True)
        return ids[0] if len(ids) == 1 else None

    def _render(self, conversation: Conversation) -> str:
        """The chat template's text of ``conversation``, ready for the assistant turn."""
        return self._formatter(messages=list(conversation)).prompt

    def _tokenize(self, text: str) -> list[int]:
        return self._model.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def prompt_ids(self, conversation: Conversation) -> list[int]:
        """Token ids of ``conversation`` rendered with the chat template, ready for the assistant turn.

        With ``splice_answers``, a conversation that continues one of this policy's answers keeps that
        answer's sampled ids (module docstring).
        """
        spliced = self.splicer.spliced(conversation, self.cache_stats) if self.splice_answers else None
        return spliced or self._tokenize(self._render(conversation))

    def clear_cache(self) -> None:
        """Forget the stored sequence states and answer ids (when the episodes or trees that made them are done)."""
        self.kv_cache.clear()
        self.splicer.clear()

    def _sample_all(self, conversations: Sequence[Conversation], params: SamplingParams,
                    seeds: list[list[int]]) -> list[list[Generation]]:
        """Every (conversation, sample) as one sequence of a batched decode; results in input order."""
        if self._ctx.ctx is None:
            raise RuntimeError(f"llama.cpp policy {self.name!r} was closed; load a new one")
        with self._lock:
            prompts = [self.prompt_ids(c) for c in conversations]
            for i, ids in enumerate(prompts):
                if len(ids) + params.max_new_tokens > self.n_ctx:
                    raise ValueError(f"prompt {i} of {len(ids)} tokens + max_new_tokens={params.max_new_tokens} "
                                     f"exceeds the context of {self.n_ctx}; raise n_ctx or shorten the episode")
            jobs = [(ids, seed) for ids, row in zip(prompts, seeds) for seed in row]
            self._choose_threads()
            generations = self._decode(jobs, params)
            if self.splice_answers:
                owners = [conversations[i] for i, row in enumerate(seeds) for _ in row]
                for conversation, g in zip(owners, generations):
                    self.splicer.remember(conversation, g.prompt_ids, g.completion_ids, g.text)
        flat = iter(generations)
        return [[next(flat) for _ in row] for row in seeds]

    def _choose_threads(self) -> None:
        """Set the context's threads for this call: ``n_threads`` if fixed, else the cores free right now."""
        threads = self.fixed_threads or self.core_meter.free_cores()
        if threads != self.n_threads:
            self._llama_cpp.llama_set_n_threads(self._ctx.ctx, threads, threads)
            self.n_threads = threads

    # ------------------------------------------------------------------ the batched decode loop
    def _decode(self, jobs: list[tuple[list[int], int]], params: SamplingParams) -> list[Generation]:
        """Decode ``(prompt ids, seed)`` jobs, at most ``max_batch`` at a time, one llama_decode per step.

        ``streams[i]`` is llama.cpp sequence ``i``: the live sequences are always ``0..len(streams)-1``
        (see :meth:`_release`). Each step feeds every stream's next tokens in one batch — a chunk of
        its prompt while prefilling, else its last sampled token — then samples one token for every
        stream whose prompt is complete.
        """
        lib = self._llama_cpp
        streams: list[_Stream] = []
        results: list[Generation | None] = [None] * len(jobs)
        self._extended: set = set()                     # stored entries some job extended whole: superseded
        try:
            self._shared = self._prefill_shared_prefixes([ids for ids, _ in jobs]) if self.reuse_cache else set()
            queue = deque(self._admission_order(jobs))
            while queue or streams:
                while queue and len(streams) < self.max_batch:
                    streams.append(self._start(queue.popleft(), jobs, params, len(streams)))
                self._fill_batch(streams)
                status = lib.llama_decode(self._ctx.ctx, self._batch.batch)
                if status != 0:
                    raise RuntimeError(f"llama_decode failed with status {status} on a batch of "
                                       f"{self._batch.batch.n_tokens} tokens from {len(streams)} sequences")
                finished = []
                for seq, stream in enumerate(streams):
                    if stream.output_row < 0:
                        continue
                    token = stream.sampler.sample(self._ctx, stream.output_row)   # also advances the chain
                    if token in self._stop_ids:
                        finished.append((seq, "stop"))
                        continue
                    stream.completion.append(token)
                    if len(stream.completion) >= params.max_new_tokens:
                        finished.append((seq, "length"))
                for seq, finish_reason in reversed(finished):
                    results[streams[seq].job] = self._generation(streams[seq], finish_reason)
                    if self.reuse_cache:
                        self._store(seq, streams[seq])
                    self._release(streams, seq, queue, jobs, params)
            for key in self._extended:
                self.kv_cache.drop(key)
        finally:
            for stream in streams:
                stream.sampler.close()
            lib.llama_memory_clear(self._memory, False)
        return results  # type: ignore[return-value]

    def _admission_order(self, jobs: list[tuple[list[int], int]]) -> list[int]:
        """The jobs in the order they take sequences: fewest prompt tokens left to prefill first.

        With the equal prefill chunks of :meth:`_fill_batch`, the streams whose prompts are done first
        are then the lowest sequence ids, and those still prefilling stay one run of consecutive ids,
        which llama.cpp computes as one micro-batch (see :meth:`_fill_batch`).
        """
        def left(job: int) -> int:
            prompt = jobs[job][0]
            return len(prompt) - (self.kv_cache.longest_prefix(None, prompt)[1] if self.reuse_cache else 0)
        return sorted(range(len(jobs)), key=left)

    def _prefill_shared_prefixes(self, prompts: list[list[int]]) -> set[tuple]:
        """Prefill, once each, the prefixes that the call's store-missing streams share, and store them; their keys.

        A call's prompts share their system message and instructions (and the G samples of one prompt
        share all of it). Streams that reuse less than ``MIN_SHARED_PREFIX`` tokens from the store are
        grouped by what they share (:func:`~llm_marl.backends.prefix_cache.shared_prefixes`); each
        group's prefix runs once, in sequences ``0..k-1`` of one batch, and goes into the store, so each
        stream restores it and prefills only the rest (counted as ``shared``; dropped after the call).
        """
        candidates = [p for p in prompts if self.kv_cache.longest_prefix(None, p)[1] < MIN_SHARED_PREFIX]
        streams = [_Stream(job=-1, prompt=list(prefix), sampler=None)
                   for prefix in shared_prefixes(candidates)][:self.max_batch]
        while any(stream.prefilling for stream in streams):
            self._fill_batch(streams)
            status = self._llama_cpp.llama_decode(self._ctx.ctx, self._batch.batch)
            if status != 0:
                raise RuntimeError(
                    f"llama_decode failed with status {status} prefilling {len(streams)} shared prefixes"
                )
        keys = set()
        for seq, stream in enumerate(streams):
            self._store(seq, stream)
            self._llama_cpp.llama_memory_seq_rm(self._memory, seq, -1, -1)
            self.cache_stats.prefill_tokens += len(stream.prompt)
            self.cache_stats.shared_prefixes += 1
            keys.add((None, tuple(stream.prompt)))
        self._extended |= keys
        return keys

    def _restore(self, prompt: list[int], seq: int) -> int:
        """Put the stored states of ``prompt``'s longest stored prefix into empty sequence ``seq``; its length.

        Counts the stream in :attr:`cache_stats` (one per stream, so the G samples of a prompt count G times).
        """
        key, n = self.kv_cache.longest_prefix(None, prompt) if self.reuse_cache else (None, 0)
        if key in self._shared and n == len(key[1]):
            self.cache_stats.record_shared(len(prompt), n)
        elif self.cache_stats.record(len(prompt), key, n):
            self._extended.add(key)
        if key is None or n == 0:
            return 0
        state = self.kv_cache.get(key)
        if self._llama_cpp.llama_state_seq_set_data(self._ctx.ctx, state, len(state), seq) != len(state):
            raise RuntimeError(f"llama.cpp could not restore a stored sequence of {len(key[1])} tokens into "
                               f"sequence {seq}; construct the policy with reuse_cache=False to go on without reuse")
        self._llama_cpp.llama_memory_seq_rm(self._memory, seq, n, -1)   # cells past the shared prefix
        return n

    def _store(self, seq: int, stream: _Stream) -> None:
        """Keep sequence ``seq``'s states of the tokens it fed (prompt + completion but its last sampled token)."""
        lib, ctx = self._llama_cpp, self._ctx.ctx
        size = lib.llama_state_seq_get_size(ctx, seq)
        if size > self.kv_cache.max_bytes:
            return
        state = (ctypes.c_uint8 * size)()
        if lib.llama_state_seq_get_data(ctx, state, size, seq) == size:
            self.kv_cache.put(None, (stream.prompt + stream.completion)[:stream.fed], state, nbytes=size)

    def _start(self, job: int, jobs: list[tuple[list[int], int]], params: SamplingParams, seq: int) -> _Stream:
        """A new stream for ``jobs[job]`` in empty sequence ``seq``, with its own sampler chain, seeded per sample.

        With ``reuse_cache`` the sequence starts from the stored states of its prompt's longest stored prefix.
        """
        prompt, seed = jobs[job]
        fed = self._restore(prompt, seq)
        sampler = self._sampler_chain()
        if params.temperature == 0:
            sampler.add_greedy()
        else:
            sampler.add_temp(params.temperature)     # temperature, then top-p: the HF policy's order
            sampler.add_top_p(params.top_p, 1)
            sampler.add_dist(seed)
        return _Stream(job=job, prompt=prompt, sampler=sampler, fed=fed)

    def _fill_batch(self, streams: list[_Stream]) -> None:
        """Put every stream's next tokens in the batch, in sequence order.

        Decoding streams get one token each; prefilling streams share the rest of the batch's
        ``n_batch`` tokens in equal chunks (:func:`equal_chunk`; a long prompt takes several steps).
        Logits are kept only where a token is to be sampled.

        Why equal chunks and sequence order: with one KV stream per sequence, llama.cpp splits a batch
        into micro-batches of consecutive sequence ids that each hold the SAME number of tokens of
        every sequence in it (``split_equal``), and each micro-batch is a pass over all the weights.
        Prompts fed whole, one after the other, made one micro-batch per distinct prompt length (a
        few tokens each, at the cost of a decode step); equal chunks make one (prefill only) or two
        (one token of every stream, then the rest of the prefilling ones, which
        :meth:`_admission_order` keeps consecutive).
        """
        batch = self._batch.batch
        batch.n_tokens = 0
        remaining = [len(s.prompt) - s.fed for s in streams if s.prefilling]
        budget = self._n_batch - (len(streams) - len(remaining))
        chunk = equal_chunk(remaining, budget) if remaining else 0
        for seq, stream in enumerate(streams):
            if stream.prefilling:
                take = min(len(stream.prompt) - stream.fed, chunk, budget)
                budget -= take
                tokens = stream.prompt[stream.fed:stream.fed + take]
                wants_logits = stream.fed + take == len(stream.prompt)
            else:
                tokens, wants_logits = stream.completion[-1:], True
            stream.output_row = -1
            for k, token in enumerate(tokens):
                j = batch.n_tokens
                batch.token[j] = token
                batch.pos[j] = stream.fed + k
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = seq
                batch.logits[j] = wants_logits and k == len(tokens) - 1
                batch.n_tokens += 1
            if wants_logits and tokens:
                stream.output_row = batch.n_tokens - 1
            stream.fed += len(tokens)

    def _release(self, streams: list[_Stream], seq: int, queue: deque, jobs: list[tuple[list[int], int]],
                 params: SamplingParams) -> None:
        """Free finished sequence ``seq`` and keep the live sequence ids dense.

        A waiting job takes over the slot; otherwise the last stream moves into it (its KV cells
        are copied, which costs far less than decoding a scattered set of sequences as several
        micro-batches). Call for finished sequences in decreasing ``seq`` order.
        """
        lib = self._llama_cpp
        streams[seq].sampler.close()
        lib.llama_memory_seq_rm(self._memory, seq, -1, -1)
        last = len(streams) - 1
        if queue:
            streams[seq] = self._start(queue.popleft(), jobs, params, seq)
        elif seq == last:
            streams.pop()
        else:
            lib.llama_memory_seq_cp(self._memory, last, seq, -1, -1)
            lib.llama_memory_seq_rm(self._memory, last, -1, -1)
            streams[seq] = streams.pop()

    def _generation(self, stream: _Stream, finish_reason: str) -> Generation:
        text = self._model.detokenize(stream.completion).decode("utf-8", errors="replace")
        return Generation(text=text, prompt_ids=list(stream.prompt), completion_ids=list(stream.completion),
                          logprobs=None, finish_reason=finish_reason)


def equal_chunk(remaining: Sequence[int], budget: int) -> int:
    """The largest ``c`` with ``sum(min(r, c) for r in remaining) <= budget`` (at least 1).

    Each prefilling stream then takes ``min(r, c)`` tokens of its ``r`` left: one chunk size for all but
    those that finish, and as much of the budget as equal chunks can use.
    """
    ordered = sorted(remaining)
    used = 0
    for i, r in enumerate(ordered):
        c = (budget - used) // (len(ordered) - i)     # the rest shared equally by streams i.. (each has >= r left)
        if c < r:
            return max(1, c)
        used += r
    return max(1, ordered[-1]) if ordered else 1
