"""The reward server under load and under malformed input, as any HTTP client would meet it (loopback only).

Clients here are raw ``http.client`` connections or sockets with no retries, so a reset or a dropped
reply fails the test instead of being hidden by :class:`RewardClient`'s retries.
"""
from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

import pytest

from verifiers import Verdict
from verifiers.reward_server import RewardClient, RewardServer

READ_TIMEOUT_S = 0.5


def echo_scorer(pairs: Sequence[tuple[str, str]]) -> list[Verdict]:
    """A verdict that names the item it scores, so a reply can be matched to its request."""
    return [Verdict(float(len(a)), None, {"question": q, "answer": a}) for q, a in pairs]


def address(server: RewardServer) -> tuple[str, int]:
    parts = urlsplit(server.url)
    return parts.hostname, parts.port


def post_score(server: RewardServer, items: list[dict]) -> tuple[int, dict]:
    """One POST /score on a fresh connection, no retries."""
    connection = http.client.HTTPConnection(*address(server), timeout=30)
    try:
        connection.request("POST", "/score", json.dumps({"items": items}), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


# ------------------------------------------------------------------ load
def test_64_concurrent_clients_each_get_their_own_verdicts_in_order():
    clients, requests_each = 64, 4
    replies: dict[tuple[int, int], tuple[int, dict]] = {}
    failures: list[str] = []
    start = threading.Barrier(clients)

    def client(c: int) -> None:
        start.wait()                                        # every client connects at the same moment
        for r in range(requests_each):
            items = [{"question": f"c{c} r{r} i{i}", "answer": "x" * (c + r + i)} for i in range(1 + (c + r) % 3)]
            try:
                replies[(c, r)] = post_score(server, items)
            except Exception as error:                      # a reset or a dropped reply is the failure under test
                failures.append(f"client {c} request {r}: {type(error).__name__}: {error}")

    with RewardServer(echo_scorer, max_batch_size=32, max_wait_ms=2) as server:
        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads), "a client hung"
        assert failures == []
        assert len(replies) == clients * requests_each                              # none lost
        for (c, r), (status, reply) in replies.items():
            assert status == 200, reply
            expected = [(f"c{c} r{r} i{i}", "x" * (c + r + i)) for i in range(1 + (c + r) % 3)]
            got = [(v["details"]["question"], v["details"]["answer"]) for v in reply["verdicts"]]
            assert got == expected                                                  # its own verdicts, in order
            assert [v["score"] for v in reply["verdicts"]] == [float(len(a)) for _, a in expected]
        assert server.num_requests == clients * requests_each
        assert server.num_overloaded == 0 and server.num_connection_errors == 0
        assert server.num_batches < clients * requests_each                         # concurrent requests batched


def test_a_full_queue_answers_503_with_retry_after_and_recovers():
    release = threading.Event()

    def slow_scorer(pairs):
        release.wait(30)
        return echo_scorer(pairs)

    with RewardServer(slow_scorer, max_pending_requests=2, max_wait_ms=0, retry_after_s=0) as server:
        held = [threading.Thread(target=post_score, args=(server, [{"question": f"q{i}", "answer": "a"}]))
                for i in range(2)]
        for thread in held:
            thread.start()
        deadline = time.monotonic() + 10
        while server.num_batches < 1 and time.monotonic() < deadline:           # both slots taken
            time.sleep(0.01)
        time.sleep(0.1)
        connection = http.client.HTTPConnection(*address(server), timeout=10)
        connection.request("POST", "/score", json.dumps({"items": [{"question": "q", "answer": "a"}]}))
        response = connection.getresponse()
        assert response.status == 503 and response.getheader("Retry-After") == "0"
        assert "busy" in json.loads(response.read())["error"]
        connection.close()
        release.set()
        for thread in held:
            thread.join(timeout=10)
        assert RewardClient(server.url, retries=3, backoff_s=0.05).score("q", "abc").score == 3.0
        assert server.num_overloaded == 1 and server.num_requests == 3


# ------------------------------------------------------------------ malformed requests
def raw_exchange(server: RewardServer, head: bytes, body: bytes = b"", *, trickle_s: float | None = None,
                 keep_open: bool = True) -> tuple[int, dict]:
    """Send ``head`` + ``body`` on a raw socket (optionally a byte at a time, ``trickle_s`` apart), read the reply."""
    sock = socket.create_connection(address(server), timeout=10)
    try:
        sock.sendall(head)
        if trickle_s is None:
            sock.sendall(body)
        else:
            for byte in body:
                try:
                    sock.sendall(bytes([byte]))
                except OSError:       # the server answered and closed: stop sending
                    break
                time.sleep(trickle_s)
        if not keep_open:
            sock.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read())
    finally:
        sock.close()


def request_head(length: int | str | None, method: str = "POST", path: str = "/score", extra: str = "") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n" + extra
    if length is not None:
        head += f"Content-Length: {length}\r\n"
    return (head + "\r\n").encode("latin-1")


def sized(body: bytes) -> tuple[bytes, bytes]:
    return request_head(len(body)), body


ITEM = {"question": "q", "answer": "a"}
BAD_REQUESTS = {
    # name: (head, body, options, expected status, words in the error)
    "deep nesting (5000 [)": (*sized(b"[" * 5000), {}, 400, "nested too deeply"),
    "deep nesting inside items": (*sized(b'{"items": ' + b'{"a": ' * 3000 + b"1" + b"}" * 3000 + b"}"), {}, 400,
                                  "nested too deeply"),
    "invalid UTF-8": (*sized(b'{"items": [{"question": "\xff\xfe", "answer": "a"}]}'), {}, 400, "not UTF-8"),
    "UTF-16 with BOM": (*sized('{"items": []}'.encode("utf-16")), {}, 400, "not UTF-8"),
    "not JSON": (*sized(b"not json"), {}, 400, "not valid JSON"),
    "empty body": (*sized(b""), {}, 400, "not valid JSON"),
    "top-level list": (*sized(b"[1, 2]"), {}, 400, "must be a JSON object"),
    "items not a list": (*sized(b'{"items": "qa"}'), {}, 400, "must be a JSON object"),
    "item not an object": (*sized(b'{"items": [1]}'), {}, 400, r"items\[0\]"),
    "answer is a number": (*sized(b'{"items": [{"question": "q", "answer": 3}]}'), {}, 400, r"items\[0\]"),
    "question is null": (*sized(b'{"items": [{"question": null, "answer": "a"}]}'), {}, 400, r"items\[0\]"),
    "items empty": (*sized(b'{"items": []}'), {}, 400, "empty"),
    "too many items": (*sized(json.dumps({"items": [ITEM] * 9}).encode()), {}, 413, "max_items_per_request"),
    "oversized body": (*sized(b" " * 300_000), {}, 413, "max_body_bytes"),
    "no Content-Length": (request_head(None), b"", {}, 411, "Content-Length"),
    "chunked body": (request_head(None, extra="Transfer-Encoding: chunked\r\n"), b"0\r\n\r\n", {}, 411,
                     "chunked"),
    "negative Content-Length": (request_head(-5), b"", {}, 400, "non-negative integer"),
    "Content-Length not a number": (request_head("12abc"), b"", {}, 400, "non-negative integer"),
    "two different Content-Lengths": (request_head(2, extra="Content-Length: 3\r\n"), b"{}", {}, 400,
                                      "conflicting"),
    "truncated body (client closes)": (request_head(100), b'{"items": [', {"keep_open": False}, 400,
                                       "ended after 11 of the 100"),
    "stalled body": (request_head(100), b'{"items": [', {}, 408, "read_timeout_s"),
    "slow trickle past the deadline": (request_head(40), b'{"items": [{"question": "q", "answer": "a"}]}'[:40],
                                       {"trickle_s": 0.05}, 408, "read_timeout_s"),
    "unknown path": (request_head(2, path="/admin"), b"{}", {}, 404, "unknown path"),
    "PUT": (request_head(2, method="PUT"), b"{}", {}, 405, "not allowed"),
    "unknown method": (request_head(0, method="BREW"), b"", {}, 501, "Unsupported method"),
    "garbage request line": (b"HELLO THERE\r\n\r\n", b"", {}, 400, "Bad HTTP/0.9 request type"),
    "bad HTTP version": (b"POST /score HTTP/9.9\r\nContent-Length: 0\r\n\r\n", b"", {}, 505, "version"),
    "header line too long": (b"POST /score HTTP/1.1\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", b"", {}, 431,
                             "Line too long"),
}


@pytest.fixture(scope="module")
def strict_server():
    with RewardServer(echo_scorer, max_items_per_request=8, max_body_bytes=100_000, read_timeout_s=READ_TIMEOUT_S,
                      max_wait_ms=0) as server:
        yield server


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_every_malformed_request_gets_a_4xx_json_error_and_the_server_keeps_serving(strict_server, name):
    head, body, options, status, words = BAD_REQUESTS[name]
    code, reply = raw_exchange(strict_server, head, body, **options)
    assert code == status, reply
    assert isinstance(reply.get("error"), str)
    assert re.search(words, reply["error"]), reply["error"]
    assert post_score(strict_server, [ITEM]) == (200, {"verdicts": [{"score": 1.0, "correct": None,
                                                                       "details": {"question": "q", "answer": "a"}}]})


def test_malformed_requests_mixed_into_load_lose_no_good_request(strict_server):
    before = strict_server.num_requests
    results: list[tuple[str, int]] = []
    good: list[tuple[int, dict]] = []
    fast = [name for name, (_, _, options, _, _) in BAD_REQUESTS.items() if not options]

    def bad(name: str) -> None:
        head, body, _, status, _ = BAD_REQUESTS[name]
        results.append((name, raw_exchange(strict_server, head, body)[0] == status))

    def score(i: int) -> None:
        good.append((i, post_score(strict_server, [{"question": f"q{i}", "answer": "a" * i}])))

    threads = [threading.Thread(target=bad, args=(name,)) for name in fast]
    threads += [threading.Thread(target=score, args=(i,)) for i in range(32)]
    for thread in threads[::2] + threads[1::2]:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(results) == sorted((name, True) for name in fast)
    assert sorted(i for i, _ in good) == list(range(32))
    for i, (status, reply) in good:
        assert status == 200 and reply["verdicts"][0]["details"] == {"question": f"q{i}", "answer": "a" * i}
    assert strict_server.num_requests - before == 32


def test_server_arguments_are_checked():
    with pytest.raises(ValueError, match="max_pending_requests"):
        RewardServer(echo_scorer, max_pending_requests=0)
    with pytest.raises(ValueError, match="read_timeout_s"):
        RewardServer(echo_scorer, read_timeout_s=0)
