"""Any OpenAI-compatible ``/v1/chat/completions`` server (vLLM, ollama, ``python -m llama_cpp.server``).

:class:`OpenAIPolicy` sends each (conversation, sample) as its own request from a bounded thread
pool, with timeouts, retries with exponential backoff, and an error naming the URL and the fix
when the server cannot be reached.
"""
from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from ..policy import Conversation, Generation, SamplingParams
from .base import CountedGeneration, InferenceBackend, SeedSource


class ServerUnreachableError(ConnectionError):
    """The OpenAI-compatible server could not be reached (or kept failing) after all retries."""


class OpenAIPolicy(InferenceBackend):
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
        self._seeds = SeedSource(seed)

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
