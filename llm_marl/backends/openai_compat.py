"""Any OpenAI-compatible ``/v1/chat/completions`` server (vLLM, ollama, ``python -m llama_cpp.server``).

:class:`OpenAIPolicy` sends each (conversation, sample) as its own request from a bounded thread
pool. Every attempt has one deadline, ``timeout_s``, for the whole exchange (connect, request,
headers and body): a server that stalls, or trickles bytes, is cut off at it. Failures that may
pass are retried with exponential backoff, at most ``max_retries`` times: a refused or dropped
connection, a timeout, HTTP 429 and 5xx, a body that is not JSON or is cut short, and a reply that
is not one chat completion of at most ``max_tokens`` tokens. Other 4xx answers are not retried.
When the retries run out the error names the server URL and the last failure:
:class:`ServerUnreachableError` when the server could not be reached or answered an error,
:class:`ServerReplyError` when it answered something that is not a usable completion. A failed
request fails its whole ``generate`` call (requests not yet sent are cancelled), so a caller
never gets a partial batch: the benchmark writes an episode only after all its generations arrived.

Multi-turn prompts extend earlier ones, and a server that keeps KV caches per slot can then prefill
only the new tokens: every request carries ``cache_prompt: true`` (llama.cpp's server keeps the slot's
cache for the next request and picks the slot whose cached prompt shares the longest prefix; other
servers ignore the field or cache by prefix on their own), and messages are sent as the env gave
them (the agent's own earlier answer exactly as the server returned it), serialised the same way
every turn, so turn t+1's request begins with the bytes of turn t's. ``cache_prompt=False`` leaves the
field out, for a server that rejects unknown fields. No slot is pinned (``id_slot``): the server's
own prefix matching finds the right one, and a pinned slot would serialise concurrent conversations.

Proxies: requests go through the HTTP proxy that ``http_proxy`` / ``https_proxy`` (either case) name
for the URL's scheme, except for hosts ``no_proxy`` lists and loopback addresses; an ``https`` URL is
tunnelled with ``CONNECT``. Credentials in the proxy URL (``http://user:pass@proxy:3128``) are sent as
``Proxy-Authorization: Basic``.
"""
from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from ..policy import Conversation, Generation, SamplingParams
from .base import CountedGeneration, InferenceBackend, SeedSource


class ServerUnreachableError(ConnectionError):
    """The OpenAI-compatible server could not be reached (or kept failing) after all retries."""


class ServerReplyError(ValueError):
    """The OpenAI-compatible server kept answering something that is not one usable chat completion."""


class Proxy(NamedTuple):
    """An HTTP proxy: where it listens and the headers it needs (``Proxy-Authorization``)."""

    host: str
    port: int
    headers: dict[str, str]


def proxy_for(url: str) -> Proxy | None:
    """The proxy the environment names for ``url`` (``http_proxy``/``https_proxy``, ``no_proxy``), or ``None``.

    Loopback hosts never go through a proxy. A proxy URL without a scheme is read as ``http://``;
    other proxy schemes (``socks5://``) raise ``ValueError``.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    proxy_url = urllib.request.getproxies().get(parts.scheme)
    if not proxy_url or _is_loopback(host) or urllib.request.proxy_bypass(host):
        return None
    if "://" not in proxy_url:
        proxy_url = "http://" + proxy_url
    proxy = urlsplit(proxy_url)
    if proxy.scheme != "http" or not proxy.hostname:
        raise ValueError(f"the {parts.scheme}_proxy setting {proxy_url!r} is not an http:// proxy URL; the openai "
                         f"backend speaks HTTP to its proxy (unset it, or list {host!r} in no_proxy)")
    headers = {}
    if proxy.username is not None:
        credentials = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
        headers["Proxy-Authorization"] = "Basic " + base64.b64encode(credentials).decode("ascii")
    return Proxy(proxy.hostname, proxy.port or 80, headers)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Refused(Exception):
    """A 4xx answer other than 429: the request itself is wrong, retrying cannot help."""


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
        cache_prompt: bool = True,
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
        self.cache_prompt = cache_prompt

    def _attempt(self, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """One POST, ``(status, body)``, within ``timeout_s`` in total: a watchdog shuts the socket at the deadline."""
        parts = urlsplit(self.url)
        connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        proxy, target = proxy_for(self.url), parts.path
        if proxy is None:
            connection = connection_class(parts.hostname, parts.port, timeout=self.timeout_s)
        elif parts.scheme == "https":                       # TLS to the server through a CONNECT tunnel
            connection = connection_class(proxy.host, proxy.port, timeout=self.timeout_s)
            connection.set_tunnel(parts.hostname, parts.port, headers=proxy.headers)
        else:                                               # plain HTTP: the proxy gets the absolute URL
            connection = connection_class(proxy.host, proxy.port, timeout=self.timeout_s)
            target, headers = self.url, {**headers, **proxy.headers}
        expired = threading.Event()

        def cut_off() -> None:
            expired.set()
            if connection.sock is not None:
                try:
                    connection.sock.shutdown(socket.SHUT_RDWR)     # wakes a recv() blocked on a stalled server
                except OSError:
                    pass

        watchdog = threading.Timer(self.timeout_s, cut_off)
        watchdog.daemon = True
        watchdog.start()
        try:
            connection.request("POST", target, body=data, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as err:
            if expired.is_set() or isinstance(err, TimeoutError):    # the watchdog, or the socket's own timeout first
                raise TimeoutError(f"no complete answer within timeout_s={self.timeout_s:g} s") from err
            raise
        finally:
            watchdog.cancel()
            connection.close()

    def _post(self, body: dict[str, Any]) -> CountedGeneration:
        """POST ``body`` to the chat endpoint; its completion, retrying failures that may pass (module docstring)."""
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last_error: Exception | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                status, payload = self._attempt(data, headers)
                detail = payload[:500].decode("utf-8", errors="replace")
                if status != 200 and status != 429 and status < 500:
                    raise _Refused(f"HTTP {status}: {detail}")
                if status != 200:
                    raise ConnectionError(f"HTTP {status}: {detail}")
                return _chat_completion(payload, body["max_tokens"])
            except _Refused as err:
                raise ValueError(f"{self.url} refused the request with {err}; check the model name ({self.model!r}) "
                                 f"and the sampling parameters") from None
            except (OSError, http.client.HTTPException, ServerReplyError) as err:
                last_error = err
        attempts = f"{self.max_retries + 1} attempt(s) of at most {self.timeout_s:g} s each"
        if isinstance(last_error, ServerReplyError):
            raise ServerReplyError(f"OpenAI-compatible server at {self.url} sent no usable chat completion in "
                                   f"{attempts}; last reply: {last_error}") from last_error
        raise ServerUnreachableError(
            f"OpenAI-compatible server at {self.url} failed after {attempts}: {_describe(last_error)}. "
            f"Start a server there (e.g. `python -m llama_cpp.server --model <file.gguf> --port 8000`) "
            f"or pass the right --base-url.") from last_error

    def _complete(self, conversation: Conversation, params: SamplingParams, seed: int) -> Generation:
        body = {"model": self.model, "messages": list(conversation), "max_tokens": params.max_new_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "seed": seed, "n": 1}
        if self.cache_prompt:
            body["cache_prompt"] = True        # llama.cpp server: keep this slot's KV cache for the next turn
        return self._post(body)

    def _sample_all(self, conversations: Sequence[Conversation], params: SamplingParams,
                    seeds: list[list[int]]) -> list[list[Generation]]:
        """Every (conversation, sample) as its own request, at most ``max_concurrency`` at once."""
        jobs = [(conversation, s) for conversation, row in zip(conversations, seeds) for s in row]
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(jobs))))
        try:
            futures = [pool.submit(self._complete, conversation, params, seed) for conversation, seed in jobs]
            flat = iter([future.result() for future in futures])
        finally:
            pool.shutdown(wait=True, cancel_futures=True)      # after a failure: the requests not yet sent are dropped
        return [[next(flat) for _ in row] for row in seeds]


def _chat_completion(payload: bytes, max_tokens: int) -> CountedGeneration:
    """The one completion of an HTTP 200 body, or :class:`ServerReplyError` saying what is wrong with it."""
    try:
        reply = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ServerReplyError(f"body is not JSON ({type(err).__name__}: {err}): {payload[:200]!r}") from None
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or len(choices) != 1:
        count = len(choices) if isinstance(choices, list) else "no"
        raise ServerReplyError(f"expected 1 choice (n=1), got {count}: {json.dumps(reply)[:300]}")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    text = message.get("content", "") if isinstance(message, dict) else None
    if not isinstance(text, str) and not (text is None and isinstance(message, dict)):   # null content: empty answer
        raise ServerReplyError(f"choices[0].message.content is not a string: {json.dumps(choice)[:300]}")
    usage = reply.get("usage") or {}
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    counted = isinstance(tokens, int) and not isinstance(tokens, bool)
    if tokens is not None and (not counted or not 0 <= tokens <= max_tokens):
        raise ServerReplyError(f"usage.completion_tokens={tokens!r} is not a count within max_tokens={max_tokens}: "
                               f"{json.dumps(reply)[:300]}")
    finish_reason = "length" if choice.get("finish_reason") == "length" else "stop"
    return CountedGeneration(text=text or "", finish_reason=finish_reason, reported_tokens=int(tokens or 0))


def _describe(error: Exception | None) -> str:
    """The failure in words: its type (a timeout, a reset, a dropped connection) and message."""
    if error is None:
        return "no attempt was made"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
