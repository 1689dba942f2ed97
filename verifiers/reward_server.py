"""Serve a learned verifier over HTTP on the loopback interface, and a client for it.

MAPoRL ran its reward model as a separate server so the trainer's process need not hold it.
:class:`RewardServer` wraps any batch scorer (``list[(question, answer)] -> list[Verdict]``, e.g.
:meth:`verifiers.reward_model.RewardModel.score_batch`) in a stdlib ``ThreadingHTTPServer``:

====================  =============================================================================
``GET /health``       ``{"status": "ok", "name": ..., "max_batch_size": ..., "requests": n, "batches": m}``
``POST /score``       body ``{"items": [{"question": str, "answer": str}, ...]}`` ->
                      ``{"verdicts": [{"score": float, "correct": bool|null, "details": {...}}, ...]}``
====================  =============================================================================

Batching: concurrent requests are queued and one worker thread scores them together, up to
``max_batch_size`` items, waiting at most ``max_wait_ms`` for a batch to fill.

Load and bad input. The listen backlog holds ``backlog`` connections (default 1024), so a burst
of clients is queued by the kernel, not reset. At most ``max_pending_requests`` requests are
being read or scored at once; one more gets ``503`` with ``Retry-After`` (the client should
come back), never a dropped connection. A body must arrive within ``read_timeout_s`` in total
(a slow or truncated body gets ``408``), and idle keep-alive connections close after the same
time. Every bad request gets a 4xx JSON ``{"error": "..."}`` and the server keeps serving: 400
(not UTF-8, not JSON, nested too deep, missing or mistyped fields, empty ``items``, a bad or
repeated ``Content-Length``, a body shorter than announced), 404 (unknown path), 405 (other
methods), 408 (body too slow), 411 (no ``Content-Length``), 413 (body or item count too large),
and the stdlib's own 400/414/431/505 for malformed request lines and headers, also as JSON. A
scorer failure is a 500 with the exception text. The server binds to loopback only (no auth).

:class:`RewardClient` times out every request, retries connection failures, timeouts and 5xx
answers with exponential backoff (at least the server's ``Retry-After``), and raises
:class:`RewardServerError` (never returns a default score) when the server cannot answer or
refuses the request.

Command line: ``python -m verifiers.reward_server --model DIR [--port 8008]``.
"""
from __future__ import annotations

import argparse
import json
import queue
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import Verdict

BatchScorer = Callable[[Sequence[tuple[str, str]]], list[Verdict]]
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class RewardServerError(RuntimeError):
    """The reward server could not be reached, timed out, or rejected the request."""


class _BadRequest(Exception):
    """A request the server answers with ``status`` and a JSON error (``close``: the body was not read whole)."""

    def __init__(self, status: int, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.close = status, close


class _HTTPServer(ThreadingHTTPServer):
    """The stdlib threading server with a listen backlog set by the server and quiet connection errors."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], backlog: int,
                 reward_server: RewardServer) -> None:
        self.request_queue_size = backlog        # read by server_activate() inside __init__: listen(backlog)
        self.reward_server = reward_server
        self.num_connection_errors = 0
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that vanished mid-reply (reset, broken pipe) is counted, not printed."""
        self.num_connection_errors += 1


class RewardServer:
    """A batching HTTP front end for a batch scorer (see the module docstring)."""

    def __init__(
        self,
        scorer: BatchScorer,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "reward_model",
        max_batch_size: int = 16,
        max_wait_ms: float = 10.0,
        max_items_per_request: int = 256,
        max_body_bytes: int = 4_000_000,
        backlog: int = 1024,
        max_pending_requests: int = 256,
        read_timeout_s: float = 10.0,
        score_timeout_s: float = 300.0,
        retry_after_s: int = 1,
    ) -> None:
        if host not in LOOPBACK_HOSTS:
            raise ValueError(f"the reward server has no authentication and binds to loopback only; got host={host!r}, "
                             f"use one of {LOOPBACK_HOSTS}")
        if max_batch_size < 1 or max_items_per_request < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch_size and max_items_per_request must be >= 1 and max_wait_ms >= 0, got "
                             f"{max_batch_size}, {max_items_per_request}, {max_wait_ms}")
        if backlog < 1 or max_pending_requests < 1 or max_body_bytes < 1 or retry_after_s < 0:
            raise ValueError(f"backlog, max_pending_requests and max_body_bytes must be >= 1 and retry_after_s >= 0, "
                             f"got {backlog}, {max_pending_requests}, {max_body_bytes}, {retry_after_s}")
        if read_timeout_s <= 0 or score_timeout_s <= 0:
            raise ValueError(f"read_timeout_s and score_timeout_s must be > 0, got {read_timeout_s}, {score_timeout_s}")
        self.scorer, self.name = scorer, name
        self.max_batch_size, self.max_wait_s = max_batch_size, max_wait_ms / 1000.0
        self.max_items_per_request, self.max_body_bytes = max_items_per_request, max_body_bytes
        self.max_pending_requests, self.retry_after_s = max_pending_requests, retry_after_s
        self.read_timeout_s, self.score_timeout_s = read_timeout_s, score_timeout_s
        self.num_requests = 0           # /score requests answered 200
        self.num_batches = 0
        self.num_rejected = 0           # 4xx answers
        self.num_overloaded = 0         # 503 answers
        self._count_lock = threading.Lock()
        self._pending = threading.BoundedSemaphore(max_pending_requests)
        self._jobs: queue.Queue = queue.Queue()
        self._stopping = threading.Event()
        self._httpd = _HTTPServer((host, port), _ScoreRequestHandler, backlog, self)
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def num_connection_errors(self) -> int:
        """Connections that failed at the socket level (the client reset or left mid-reply)."""
        return self._httpd.num_connection_errors

    def start(self) -> RewardServer:
        """Serve in background threads (returns self; use as a context manager to stop)."""
        self._threads = [
            threading.Thread(target=self._httpd.serve_forever, name="reward-http", daemon=True),
            threading.Thread(target=self._batch_worker, name="reward-batcher", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> RewardServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _count(self, name: str) -> None:
        with self._count_lock:
            setattr(self, name, getattr(self, name) + 1)

    # ---------------------------------------------------------------- batching
    def submit(self, pairs: list[tuple[str, str]]) -> Future:
        """Queue pairs for the batch worker; the future resolves to their verdicts."""
        future: Future = Future()
        self._jobs.put((pairs, future))
        return future

    def _batch_worker(self) -> None:
        while not self._stopping.is_set():
            try:
                first = self._jobs.get(timeout=0.1)
            except queue.Empty:
                continue
            jobs, size = [first], len(first[0])
            deadline = time.monotonic() + self.max_wait_s
            while size < self.max_batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    job = self._jobs.get(timeout=remaining)
                except queue.Empty:
                    break
                jobs.append(job)
                size += len(job[0])
            self._score_jobs(jobs)

    def _score_jobs(self, jobs: list[tuple[list[tuple[str, str]], Future]]) -> None:
        pairs = [pair for job_pairs, _ in jobs for pair in job_pairs]
        self._count("num_batches")
        try:
            verdicts = self.scorer(pairs)
            if len(verdicts) != len(pairs):
                raise RuntimeError(f"scorer returned {len(verdicts)} verdicts for {len(pairs)} items")
        except Exception as error:  # delivered to every waiting request as a 500
            for _, future in jobs:
                future.set_exception(error)
            return
        start = 0
        for job_pairs, future in jobs:
            future.set_result(verdicts[start:start + len(job_pairs)])
            start += len(job_pairs)

    # ---------------------------------------------------------------- HTTP
    def _parse_items(self, body: bytes) -> list[tuple[str, str]]:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise _BadRequest(400, f"body is not UTF-8 text: {error}") from None
        try:
            payload = json.loads(text)
        except json.JSONDecodeError as error:
            raise _BadRequest(400, f"body is not valid JSON: {error}") from None
        except RecursionError:
            raise _BadRequest(400, "body is not valid JSON: nested too deeply to parse; send a flat "
                                   '{"items": [...]} object') from None
        if not isinstance(payload, dict) or not isinstance(payload.get("items"), list):
            raise _BadRequest(400, 'body must be a JSON object {"items": [{"question": str, "answer": str}, ...]}')
        items = payload["items"]
        if not items:
            raise _BadRequest(400, '"items" is empty; send at least one {"question", "answer"} object')
        if len(items) > self.max_items_per_request:
            raise _BadRequest(
                413, f'{len(items)} items exceed max_items_per_request={self.max_items_per_request}; split the request'
            )
        pairs = []
        for index, item in enumerate(items):
            if (
                not isinstance(item, dict)
                or not isinstance(item.get("question"), str)
                or not isinstance(item.get("answer"), str)
            ):
                raise _BadRequest(400, f'items[{index}] must be {{"question": str, "answer": str}}, got {item!r:.120}')
            pairs.append((item["question"], item["answer"]))
        return pairs

    def _body_length(self, headers: Any) -> int:
        """The announced body length, checked against the limits."""
        lengths = headers.get_all("Content-Length") or []
        if not lengths:
            raise _BadRequest(411, "Content-Length header is required (chunked bodies are not accepted)", close=True)
        if len(set(lengths)) > 1:
            raise _BadRequest(400, f"conflicting Content-Length headers {lengths}; send one", close=True)
        length = lengths[0].strip()
        if not length.isdigit():
            raise _BadRequest(400, f"Content-Length must be a non-negative integer, got {length!r:.40}", close=True)
        if int(length) > self.max_body_bytes:
            raise _BadRequest(413, f"body of {length} bytes exceeds max_body_bytes={self.max_body_bytes}", close=True)
        return int(length)


class _ScoreRequestHandler(BaseHTTPRequestHandler):
    """One connection to a :class:`RewardServer`: ``GET /health`` and ``POST /score``, every error as JSON."""

    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    @property
    def reward_server(self) -> RewardServer:
        """The :class:`RewardServer` this connection belongs to."""
        return self.server.reward_server

    def setup(self) -> None:
        self.timeout = self.reward_server.read_timeout_s   # per socket read; idle keep-alive connections close after it
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:   # quiet: tests and trainers log themselves
        pass

    def _reply(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib's errors (malformed request line or headers, unknown method) as JSON too."""
        self.close_connection = True
        self.request_version = "HTTP/1.1"   # an unparsed request line reads as HTTP/0.9: no status line
        text = message or self.responses.get(code, ("error",))[0]
        self.reward_server._count("num_rejected")
        self._reply(code, {"error": f"{text}: {explain}" if explain else text})

    def _read_body(self, length: int) -> bytes:
        """``length`` bytes within ``read_timeout_s`` in total, else 408 (slow) or 400 (cut short)."""
        deadline = time.monotonic() + self.reward_server.read_timeout_s
        chunks, got = [], 0
        try:
            while got < length:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.connection.settimeout(left)
                chunk = self.rfile.read1(min(1 << 16, length - got))
                if not chunk:
                    raise _BadRequest(400, f"body ended after {got} of the {length} bytes announced by "
                                           f"Content-Length", close=True)
                chunks.append(chunk)
                got += len(chunk)
        except TimeoutError:
            raise _BadRequest(408, f"body not received within read_timeout_s={self.reward_server.read_timeout_s:g} "
                                   f"({got} of {length} bytes arrived)", close=True) from None
        finally:
            self.connection.settimeout(self.reward_server.read_timeout_s)
        return b"".join(chunks)

    def _discard_body(self) -> None:
        """Read and drop what the client still sends (bounded by ``read_timeout_s``) before closing,
        so that closing with unread data does not reset the connection under the error reply."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + self.reward_server.read_timeout_s
            while (left := deadline - time.monotonic()) > 0:
                self.connection.settimeout(left)
                if not self.connection.recv(1 << 16):
                    break
        except OSError:
            pass

    def do_GET(self) -> None:
        if self.path != "/health":
            self.reward_server._count("num_rejected")
            self._reply(404, {"error": f"unknown path {self.path!r}; endpoints: GET /health, POST /score"})
            return
        server = self.reward_server
        self._reply(200, {"status": "ok", "name": server.name, "max_batch_size": server.max_batch_size,
                          "requests": server.num_requests, "batches": server.num_batches,
                          "rejected": server.num_rejected, "overloaded": server.num_overloaded})

    def _method_not_allowed(self) -> None:
        self.close_connection = True
        self.reward_server._count("num_rejected")
        self._reply(405, {"error": f"method {self.command} not allowed; endpoints: GET /health, POST /score"},
                    {"Allow": "GET, POST"})

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _method_not_allowed

    def do_POST(self) -> None:
        if not self.reward_server._pending.acquire(blocking=False):
            self._overloaded()
            return
        try:
            self._score()
        finally:
            self.reward_server._pending.release()

    def _overloaded(self) -> None:
        """503 + Retry-After, after reading the body (or its first read_timeout_s) so the reply arrives."""
        self.close_connection = True
        server = self.reward_server
        server._count("num_overloaded")
        self._reply(503, {"error": f"server busy: {server.max_pending_requests} requests pending; retry after "
                                   f"{server.retry_after_s} s"}, {"Retry-After": str(server.retry_after_s)})
        self._discard_body()

    def _score(self) -> None:
        try:
            if self.path != "/score":
                raise _BadRequest(404, f"unknown path {self.path!r}; endpoints: GET /health, POST /score",
                                  close=True)
            pairs = self.reward_server._parse_items(self._read_body(self.reward_server._body_length(self.headers)))
        except _BadRequest as error:
            self.reward_server._count("num_rejected")
            self.close_connection = self.close_connection or error.close
            self._reply(error.status, {"error": str(error)})
            if error.close:
                self._discard_body()
            return
        try:
            verdicts = self.reward_server.submit(pairs).result(timeout=self.reward_server.score_timeout_s)
        except FutureTimeout:
            self._reply(504, {"error": "scoring took longer than "
                                       f"score_timeout_s={self.reward_server.score_timeout_s:g}"})
            return
        except Exception as error:
            self._reply(500, {"error": f"scorer failed: {type(error).__name__}: {error}"})
            return
        self.reward_server._count("num_requests")
        self._reply(200, {"verdicts": [v.to_dict() for v in verdicts]})


class RewardClient:
    """Client of a :class:`RewardServer`: timeouts, retries with backoff, loud failures."""

    def __init__(self, url: str, timeout_s: float = 30.0, retries: int = 3, backoff_s: float = 0.5) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ValueError(
                f"timeout_s must be > 0, retries and backoff_s >= 0; got {timeout_s}, {retries}, {backoff_s}"
            )
        self.url, self.timeout_s, self.retries, self.backoff_s = url.rstrip("/"), timeout_s, retries, backoff_s

    def _request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(payload).encode() if payload is not None else None
        last_error: Exception | None = None
        retry_after = 0.0
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(max(self.backoff_s * 2 ** (attempt - 1), retry_after))
            request = urllib.request.Request(self.url + path, data=data, method=method,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as error:
                message = error.read().decode(errors="replace")
                if error.code < 500:  # the request itself is wrong: retrying cannot help
                    raise RewardServerError(
                        f"reward server {self.url} refused {method} {path} with {error.code}: {message}"
                    ) from error
                retry_after = _seconds(error.headers.get("Retry-After"), cap=self.timeout_s)
                last_error = RewardServerError(f"{error.code}: {message}")
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as error:
                last_error, retry_after = error, 0.0
        raise RewardServerError(
            f"reward server {self.url} did not answer {method} {path} after {self.retries + 1} attempt(s) "
            f"(timeout {self.timeout_s}s each); last error: {last_error}. Is the server running?"
        ) from last_error

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` answer."""
        return self._request("GET", "/health")

    def score_batch(self, pairs: Sequence[tuple[str, str]]) -> list[Verdict]:
        """Verdicts for ``(question, answer)`` pairs, in order."""
        reply = self._request("POST", "/score", {"items": [{"question": q, "answer": a} for q, a in pairs]})
        verdicts = reply.get("verdicts")
        if not isinstance(verdicts, list) or len(verdicts) != len(pairs):
            raise RewardServerError(
                f"reward server {self.url} sent a malformed reply for {len(pairs)} items: {reply!r:.200}"
            )
        return [Verdict(float(v["score"]), v["correct"], dict(v.get("details") or {})) for v in verdicts]

    def score(self, question: str, answer: str) -> Verdict:
        """The verdict on one answer."""
        return self.score_batch([(question, answer)])[0]


def _seconds(retry_after: str | None, cap: float) -> float:
    """A ``Retry-After`` header in seconds (0 when absent or a date), at most ``cap``."""
    try:
        return min(max(float(retry_after or 0), 0.0), cap)
    except ValueError:
        return 0.0


def main(argv: Sequence[str] | None = None) -> None:
    """Serve a saved reward model: ``python -m verifiers.reward_server --model DIR``."""
    parser = argparse.ArgumentParser(description="Serve a learned verifier on 127.0.0.1.")
    parser.add_argument("--model", required=True, help="reward model directory (RewardModel.save) or hub id")
    parser.add_argument("--port", type=int, default=8008, help="TCP port on 127.0.0.1 (0 = any free port)")
    parser.add_argument("--max-batch-size", type=int, default=16, help="items scored together at most")
    parser.add_argument("--max-wait-ms", type=float, default=10.0, help="how long a batch waits to fill")
    args = parser.parse_args(argv)
    from .reward_model import RewardModel

    model = RewardModel.from_pretrained(args.model)
    server = RewardServer(model.score_batch, port=args.port, name=str(args.model),
                          max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms).start()
    print(f"serving {args.model} at {server.url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()


__all__ = ["RewardServer", "RewardClient", "RewardServerError", "BatchScorer"]
