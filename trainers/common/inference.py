"""Inference-only backends of the :class:`~trainers.common.policy.Policy` protocol, and a factory.

* :class:`LlamaCppPolicy` — llama-cpp-python on a GGUF file (the default for the embedded
  SmolLM2-135M: ~6× HF's single-stream speed on a small CPU, but only about on par with HF
  batched across episodes — see ``benchmarks/bench_backends.py``). Single stream: a batch is a loop.
* :class:`OpenAIPolicy` — any OpenAI-compatible ``/v1/chat/completions`` server (vLLM, ollama,
  ``python -m llama_cpp.server``): bounded concurrency, timeouts, retries with exponential
  backoff, and an error naming the URL and the fix when the server cannot be reached.
* :func:`load_policy` — ``"hf" | "llamacpp" | "openai"`` + a model name -> a ready policy.

Neither inference backend can score tokens, so ``Generation.logprobs`` stays ``None`` (use the HF
policy for training). Both report token counts: llama.cpp returns the real ids, a server its
``usage.completion_tokens`` (:class:`CountedGeneration`).

Sampling seeds: with ``SamplingParams.seed`` set, sample ``j`` of conversation ``i`` in a call uses
a seed derived from ``(seed, i, j)`` — identical prompts in one call (e.g. every debater's first
turn) still get independent samples, and a call is reproducible on its own. Without it, seeds are
drawn from the policy's own generator (seeded by the constructor's ``seed``).
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .policy import Conversation, Generation, Policy, SamplingParams

BACKENDS = ("hf", "llamacpp", "openai")


@dataclass
class CountedGeneration(Generation):
    """A generation from a backend that reports a token count but not the token ids."""

    reported_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        """Completion length in tokens, as reported by the backend."""
        return self.reported_tokens


class _SeedSource:
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


class _InferenceBackend:
    """The shared front of the inference-only backends: argument checks and per-sample seeds."""

    backend: str
    _seeds: _SeedSource

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
        for i, conversation in enumerate(conversations):
            if not conversation or not all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in conversation):
                raise ValueError(f"conversation {i} must be a non-empty list of {{'role', 'content'}} messages, "
                                 f"got {conversation!r:.200}")
        return self._sample_all(conversations, params, self._seeds.seeds(params, len(conversations), num_samples))

    def _sample_all(self, conversations: Sequence[Conversation], params: SamplingParams,
                    seeds: list[list[int]]) -> list[list[Generation]]:
        raise NotImplementedError


# ---------------------------------------------------------------------------------- llama.cpp
def free_cores() -> int:
    """CPU cores not busy with other processes (cores minus the 1-minute load average), at least 1.

    llama.cpp's worker threads spin at barriers: with more threads than free cores, generation
    slows down by an order of magnitude (measured here on 2 cores at load ~6: 7.6 tok/s with 1
    thread vs 1.5 tok/s with 2; with ``OMP_WAIT_POLICY=PASSIVE`` 19.9 vs 17.2), so the default
    uses the free cores, not all of them.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        busy = os.getloadavg()[0]
    except OSError:
        busy = 0.0
    return max(1, min(cores, int(cores - busy + 0.5)))


def _close_llama(llm_ref: "weakref.ref[Any]") -> None:
    llm = llm_ref()
    if llm is not None:
        llm.close()


class LlamaCppPolicy(_InferenceBackend):
    """llama-cpp-python on a GGUF file, prompts formatted with the GGUF's own chat template."""

    backend = "llamacpp"

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        seed: int | None = 0,
        name: str | None = None,
    ) -> None:
        """Load ``model_path``; ``n_threads`` defaults to the free cores (:func:`free_cores`)."""
        # ggml's OpenMP workers spin-wait by default: on a busy CPU that costs 10x (see free_cores).
        # Effective only if no OpenMP runtime started yet in this process (the CLI sets it first).
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        except ImportError as err:  # pragma: no cover - depends on the install
            raise ImportError("the 'llamacpp' backend needs llama-cpp-python: pip install llama-cpp-python") from err
        path = Path(model_path)
        if not path.is_file():
            raise ValueError(f"GGUF file {str(path)!r} does not exist; pass the path of a .gguf model file")
        self.name = name or path.stem
        self.model_path = str(path)
        self.n_threads = n_threads or free_cores()
        self._llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=self.n_threads,
                          seed=0 if seed is None else seed, verbose=False)
        atexit.register(_close_llama, weakref.ref(self._llm))  # before interpreter teardown breaks its destructor
        metadata = self._llm.metadata
        template = metadata.get("tokenizer.chat_template")
        if not template:
            raise ValueError(f"{path.name} has no tokenizer.chat_template in its GGUF metadata; "
                             "use a chat model or format prompts yourself")
        eos_id = self._llm.token_eos()
        bos_id = self._llm.token_bos()
        self._eos_text = self._token_text(eos_id)
        self._formatter = Jinja2ChatFormatter(template=template, eos_token=self._eos_text,
                                              bos_token=self._token_text(bos_id) if bos_id >= 0 else "")
        self._stop_ids = {eos_id, *(self._special_id(t) for t in ("<|im_end|>", "<|eot_id|>", "<|end|>"))} - {None}
        self._seeds = _SeedSource(seed)
        self._lock = threading.Lock()  # one llama context: calls from several threads are serialised

    def _token_text(self, token_id: int) -> str:
        return self._llm.detokenize([token_id], special=True).decode("utf-8", errors="replace")

    def _special_id(self, text: str) -> int | None:
        ids = self._llm.tokenize(text.encode(), add_bos=False, special=True)
        return ids[0] if len(ids) == 1 else None

    def prompt_ids(self, conversation: Conversation) -> list[int]:
        """Token ids of ``conversation`` rendered with the chat template, ready for the assistant turn."""
        prompt = self._formatter(messages=list(conversation)).prompt
        return self._llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)

    def _sample(self, prompt_ids: list[int], params: SamplingParams, seed: int) -> Generation:
        if len(prompt_ids) + params.max_new_tokens > self._llm.n_ctx():
            raise ValueError(f"prompt of {len(prompt_ids)} tokens + max_new_tokens={params.max_new_tokens} exceeds "
                             f"the context of {self._llm.n_ctx()}; raise n_ctx or shorten the episode")
        self._llm.set_seed(seed)
        completion: list[int] = []
        finish_reason = "length"
        for token in self._llm.generate(prompt_ids, temp=params.temperature, top_p=params.top_p,
                                        top_k=0, min_p=0.0, repeat_penalty=1.0, reset=True):
            if token in self._stop_ids:
                finish_reason = "stop"
                break
            completion.append(token)
            if len(completion) >= params.max_new_tokens:
                break
        text = self._llm.detokenize(completion).decode("utf-8", errors="replace")
        return Generation(text=text, prompt_ids=list(prompt_ids), completion_ids=completion,
                          logprobs=None, finish_reason=finish_reason)

    def _sample_all(self, conversations: Sequence[Conversation], params: SamplingParams,
                    seeds: list[list[int]]) -> list[list[Generation]]:
        """One stream after another (llama.cpp is single-stream; the KV cache keeps shared prefixes)."""
        with self._lock:
            return [[self._sample(ids, params, s) for s in row]
                    for ids, row in ((self.prompt_ids(c), row) for c, row in zip(conversations, seeds))]


# ---------------------------------------------------------------------------------- OpenAI API
class ServerUnreachableError(ConnectionError):
    """The OpenAI-compatible server could not be reached (or kept failing) after all retries."""


class OpenAIPolicy(_InferenceBackend):
    """Any OpenAI-compatible ``/v1/chat/completions`` server, queried by a bounded thread pool."""

    backend = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        max_concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        seed: int | None = 0,
        name: str | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        base = base_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.url = self.base_url + "/chat/completions"
        self.model = model
        self.name = name or model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._seeds = _SeedSource(seed)

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to the chat endpoint, retrying 429/5xx/connection errors with exponential backoff."""
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last_error: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return json.loads(response.read().decode("utf-8"))
            except urllib.error.HTTPError as err:
                detail = err.read().decode("utf-8", errors="replace")[:500]
                if err.code != 429 and err.code < 500:
                    raise ValueError(f"{self.url} refused the request with HTTP {err.code}: {detail}; "
                                     f"check the model name ({self.model!r}) and the sampling parameters") from err
                last_error = RuntimeError(f"HTTP {err.code}: {detail}")
            except (urllib.error.URLError, socket.timeout, ConnectionError, TimeoutError) as err:
                last_error = err
        raise ServerUnreachableError(
            f"OpenAI-compatible server at {self.url} failed after {self.max_retries + 1} attempt(s): {last_error}. "
            f"Start a server there (e.g. `python -m llama_cpp.server --model <file.gguf> --port 8000`) "
            f"or pass the right --base-url.")

    def _complete(self, conversation: Conversation, params: SamplingParams, seed: int) -> Generation:
        body = {"model": self.model, "messages": list(conversation), "max_tokens": params.max_new_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "seed": seed, "n": 1}
        reply = self._post(body)
        try:
            choice = reply["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as err:
            raise ValueError(f"{self.url} returned no chat completion: {json.dumps(reply)[:300]}") from err
        finish_reason = "length" if choice.get("finish_reason") == "length" else "stop"
        tokens = int((reply.get("usage") or {}).get("completion_tokens") or 0)
        return CountedGeneration(text=text, finish_reason=finish_reason, reported_tokens=tokens)

    def _sample_all(self, conversations: Sequence[Conversation], params: SamplingParams,
                    seeds: list[list[int]]) -> list[list[Generation]]:
        """Every (conversation, sample) as its own request, at most ``max_concurrency`` at once."""
        jobs = [(conversation, s) for conversation, row in zip(conversations, seeds) for s in row]
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(jobs)))) as pool:
            flat = iter(list(pool.map(lambda job: self._complete(job[0], params, job[1]), jobs)))
        return [[next(flat) for _ in row] for row in seeds]


# ---------------------------------------------------------------------------------- factory
def load_policy(backend: str, model: str, base_url: str | None = None, *, seed: int | None = 0,
                **kwargs: Any) -> Policy:
    """A ready policy: ``backend`` in ``"hf" | "llamacpp" | "openai"``, ``model`` a name, path or served id.

    ``llamacpp`` accepts a ``.gguf`` path or a model name that :func:`llm_marl_envs.models.gguf_path`
    knows (e.g. ``"smollm2-135m"``); ``hf`` loads through :func:`llm_marl_envs.models.load`;
    ``openai`` needs ``base_url``. Extra keyword arguments go to the backend's constructor.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {list(BACKENDS)}")
    if backend == "openai":
        if not base_url:
            raise ValueError("the 'openai' backend needs base_url (e.g. --base-url http://127.0.0.1:8000/v1)")
        return OpenAIPolicy(base_url, model, seed=seed, **kwargs)
    if base_url:
        raise ValueError(f"base_url is only used by the 'openai' backend, got base_url={base_url!r} with {backend!r}")
    if backend == "llamacpp":
        if str(model).endswith(".gguf"):
            path = Path(model)
        else:
            from llm_marl_envs.models import gguf_path
            path = gguf_path(model)
        return LlamaCppPolicy(path, seed=seed, name=model, **kwargs)
    return _load_hf_policy(model, seed=seed, **kwargs)


def _load_hf_policy(model: str, *, seed: int | None, **kwargs: Any) -> Policy:
    """The transformers backend: :func:`llm_marl_envs.models.load` + ``HFPolicy``."""
    from llm_marl_envs.models import load
    from .policy import HFPolicy
    if seed is not None:
        import torch
        torch.manual_seed(seed)
    loaded_model, tokenizer = load(model)
    return HFPolicy(loaded_model, tokenizer, name=model, **kwargs)
