"""The OpenAI-compatible backend against a real local server that misbehaves (stdlib http.server on loopback).

Each fault is played by the server itself, over real sockets: stalls, a dropped or reset connection,
5xx and 429, a body that is not JSON or is cut short, and replies that are JSON but not one usable
completion. Transient faults are retried through; persistent ones end in a bounded time with an
error naming the server URL and the failure; a benchmark run that meets one keeps only whole episodes.
"""
from __future__ import annotations

import base64
import http.client
import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

import llm_marl_envs
from llm_marl.backends.openai_compat import OpenAIPolicy, ServerReplyError, ServerUnreachableError, proxy_for
from llm_marl.benchmark import BenchConfig, read_episodes, run_benchmark
from llm_marl.policy import SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.team import Team

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]
TIMEOUT_S = 0.5


def completion(body: dict, **changes) -> dict:
    """A well-formed reply whose text depends only on the request (seed and last message)."""
    text = f"seed {body['seed'] % 97} says {len(body['messages'][-1]['content'])}. The answer is {body['seed'] % 7}."
    reply = {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
             "usage": {"completion_tokens": min(5, body["max_tokens"])}}
    reply.update(changes)
    return reply


class MisbehavingServer:
    """A chat-completions server that plays ``plan(request_number)`` for each request it receives."""

    def __init__(self, plan: Callable[[int], str]) -> None:
        self.plan, self.count, self.lock = plan, 0, threading.Lock()
        self.bodies: list[bytes] = []         # every request body, as received
        self.released = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)
                with server.lock:
                    number, server.count = server.count, server.count + 1
                    server.bodies.append(raw)
                getattr(self, "play_" + server.plan(number))(body)

            def send(self, status: int, payload: bytes, length: int | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload) if length is None else length))
                self.end_headers()
                self.wfile.write(payload)

            def play_ok(self, body):
                self.send(200, json.dumps(completion(body)).encode())

            def play_stall(self, body):                       # reads the request, never answers
                server.released.wait(60)
                self.close_connection = True

            def play_stall_body(self, body):                  # headers and a few bytes, then nothing
                self.send(200, b'{"choices": [', length=500)
                server.released.wait(60)
                self.close_connection = True

            def play_drop(self, body):                        # closes without a reply
                self.close_connection = True

            def play_reset(self, body):                       # RST instead of a reply
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True

            def play_http500(self, body):
                self.send(500, b'{"error": "CUDA out of memory"}')

            def play_http503(self, body):
                self.send(503, b'{"error": "loading model"}')

            def play_http429(self, body):
                self.send(429, b'{"error": "rate limited"}')

            def play_http400(self, body):
                self.send(400, b'{"error": "unknown model"}')

            def play_bad_json(self, body):
                self.send(200, b'{"choices": [{"message": {"content": "4"')

            def play_html(self, body):
                self.send(200, b"<html><body>502 Bad Gateway</body></html>")

            def play_truncated(self, body):                   # Content-Length promises more than arrives
                self.send(200, json.dumps(completion(body)).encode()[:20], length=400)
                self.close_connection = True

            def play_no_choices(self, body):
                self.send(200, json.dumps(completion(body, choices=[])).encode())

            def play_two_choices(self, body):
                reply = completion(body)
                self.send(200, json.dumps(completion(body, choices=reply["choices"] * 2)).encode())

            def play_content_not_text(self, body):
                reply = completion(body)
                reply["choices"][0]["message"]["content"] = {"text": "4"}
                self.send(200, json.dumps(reply).encode())

            def play_too_long(self, body):                    # ignores max_tokens
                usage = {"completion_tokens": body["max_tokens"] + 50}
                self.send(200, json.dumps(completion(body, usage=usage)).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> MisbehavingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


# fault: (error class when it persists, words the error must contain)
FAULTS = {
    "stall": (ServerUnreachableError, "TimeoutError: no complete answer within timeout_s=0.5"),
    "stall_body": (ServerUnreachableError, "TimeoutError: no complete answer within timeout_s=0.5"),
    "drop": (ServerUnreachableError, "RemoteDisconnected"),
    "reset": (ServerUnreachableError, "ConnectionResetError|RemoteDisconnected"),
    "http500": (ServerUnreachableError, "HTTP 500: .*CUDA out of memory"),
    "http503": (ServerUnreachableError, "HTTP 503: .*loading model"),
    "http429": (ServerUnreachableError, "HTTP 429: .*rate limited"),
    "bad_json": (ServerReplyError, "body is not JSON"),
    "html": (ServerReplyError, "body is not JSON.*Bad Gateway"),
    "truncated": (ServerUnreachableError, "IncompleteRead"),
    "no_choices": (ServerReplyError, "expected 1 choice .*got 0"),
    "two_choices": (ServerReplyError, "expected 1 choice .*got 2"),
    "content_not_text": (ServerReplyError, "content is not a string"),
    "too_long": (ServerReplyError, "completion_tokens=58 is not a count within max_tokens=8"),
}


def policy_for(server: MisbehavingServer, retries: int) -> OpenAIPolicy:
    return OpenAIPolicy(server.url, "served", max_retries=retries, backoff_s=0.01, timeout_s=TIMEOUT_S)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_passing_fault_is_retried_through(fault):
    with MisbehavingServer(lambda n: fault if n == 0 else "ok") as server:
        out = policy_for(server, retries=2).generate([QUESTION], SamplingParams(max_new_tokens=8, seed=1))
        assert server.count == 2
    assert "says 14. The answer is" in out[0][0].text                   # the good reply, whole
    assert out[0][0].num_tokens == 5 and out[0][0].finish_reason == "stop"


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_persistent_fault_fails_in_bounded_time_naming_the_server_and_the_failure(fault):
    error_class, words = FAULTS[fault]
    with MisbehavingServer(lambda n: fault) as server:
        started = time.monotonic()
        with pytest.raises(error_class, match=words) as info:
            policy_for(server, retries=1).generate([QUESTION], SamplingParams(max_new_tokens=8, seed=1))
        elapsed = time.monotonic() - started
        assert server.count == 2                                           # one try and one retry, no more
    assert server.url + "/chat/completions" in str(info.value) and "2 attempt(s)" in str(info.value)
    assert elapsed < 20.0            # each attempt was cut at timeout_s: a stalled reply would have taken 60 s


def test_a_refused_request_is_not_retried():
    with MisbehavingServer(lambda n: "http400") as server:
        with pytest.raises(ValueError, match="refused the request with HTTP 400: .*unknown model") as info:
            policy_for(server, retries=3).generate([QUESTION], SamplingParams(max_new_tokens=8))
        assert server.count == 1
    assert server.url in str(info.value) and "'served'" in str(info.value)


def test_one_failed_request_fails_the_whole_call_and_cancels_the_rest():
    with MisbehavingServer(lambda n: "http500" if n == 0 else "ok") as server:
        policy = OpenAIPolicy(server.url, "served", max_retries=0, max_concurrency=1, timeout_s=TIMEOUT_S)
        conversations = [[{"role": "user", "content": f"q{i}"}] for i in range(6)]
        with pytest.raises(ServerUnreachableError, match="HTTP 500"):
            policy.generate(conversations, SamplingParams(max_new_tokens=8, seed=2))
        assert server.count < 6                                            # queued requests were not sent


def test_requests_ask_for_prompt_caching_and_each_turn_extends_the_last_bytes():
    with MisbehavingServer(lambda n: "ok") as server:
        env = llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=3)
        policy = policy_for(server, retries=0)
        team = Team.from_policies({"agent_0": policy, "agent_1": policy})
        RolloutEngine(env, team, SamplingParams(max_new_tokens=8, seed=1), progress=False).collect(task_indices=[0])
        OpenAIPolicy(server.url, "served", cache_prompt=False).generate([QUESTION], SamplingParams(max_new_tokens=8))
    bodies = [json.loads(raw) for raw in server.bodies]
    assert len(bodies) == 3 * 2 + 1
    assert all(b["cache_prompt"] is True for b in bodies[:-1]) and "cache_prompt" not in bodies[-1]
    for agent in ("Agent 0", "Agent 1"):                         # one conversation per agent, turn by turn
        turns = sorted((raw for raw, b in zip(server.bodies, bodies[:-1]) if agent in b["messages"][0]["content"]),
                       key=len)
        assert len(turns) == 3
        for before, after in zip(turns, turns[1:]):              # the earlier messages, byte for byte
            assert messages_bytes(after).startswith(messages_bytes(before))
            assert len(json.loads(after)["messages"]) == len(json.loads(before)["messages"]) + 2


def messages_bytes(raw: bytes) -> bytes:
    """The ``"messages": [...`` part of a raw request body, without its closing bracket."""
    start = raw.index(b'"messages": [')
    return raw[start:raw.index(b'], "max_tokens"', start)]


# ------------------------------------------------------------------ a benchmark run meets a failing server
def bench_config(url: str) -> BenchConfig:
    return BenchConfig(env_id="gsm_symbolic_debate-v0", models=["served"], backend="openai", base_url=url,
                       num_agents=2, num_turns=2, episodes=4, episodes_per_batch=2, seed=5, max_new_tokens=8,
                       env_kwargs={"num_tasks": 20})


def comparable(records: list[dict]) -> list[dict]:
    """Episode records without their wall times (the one field a rerun cannot reproduce)."""
    return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in sorted(records, key=lambda r: r["episode"])]


def test_a_benchmark_run_that_meets_a_failing_server_keeps_only_whole_episodes_and_resumes(tmp_path):
    persistent = ["stall", "drop", "http500", "bad_json", "too_long"]
    healthy = [True]
    per_batch = 2 * 2 * 2                 # episodes x agents x turns: the requests of one batch

    def plan(n: int) -> str:              # the first batch and half of the second go through, then faults
        return "ok" if healthy[0] or n < per_batch + per_batch // 2 else persistent[n % len(persistent)]

    with MisbehavingServer(plan) as server:
        reference = tmp_path / "reference"
        run_benchmark(bench_config(server.url), reference, policies={"served": policy_for(server, 4)}, progress=False)
        expected = comparable(read_episodes(reference / "episodes.jsonl"))
        assert [r["episode"] for r in expected] == [0, 1, 2, 3]

        healthy[0], server.count = False, 0
        broken = tmp_path / "broken"
        with pytest.raises((ServerUnreachableError, ServerReplyError), match=server.url):
            run_benchmark(bench_config(server.url), broken, policies={"served": policy_for(server, 4)},
                          progress=False)
        lines = (broken / "episodes.jsonl").read_text().splitlines()
        assert [json.loads(line)["episode"] for line in lines] == [0, 1]     # whole episodes only, nothing torn
        assert comparable([json.loads(line) for line in lines]) == expected[:2]

        healthy[0] = True
        run_benchmark(bench_config(server.url), broken, policies={"served": policy_for(server, 4)}, progress=False)
    assert comparable(read_episodes(broken / "episodes.jsonl")) == expected


# ----------------------------------------------------------------------------- proxies
class ForwardingProxy:
    """A plain HTTP proxy on loopback: forwards absolute-URL requests, resolving every host to 127.0.0.1."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str | None]] = []      # (request target, Proxy-Authorization)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                proxy.requests.append((self.path, self.headers.get("Proxy-Authorization")))
                target = urlsplit(self.path)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                upstream = http.client.HTTPConnection("127.0.0.1", target.port, timeout=5)
                upstream.request("POST", target.path, body=body, headers={"Content-Type": "application/json"})
                reply = upstream.getresponse()
                payload = reply.read()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                upstream.close()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ForwardingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_requests_go_through_the_proxy_that_http_proxy_names(monkeypatch):
    params = SamplingParams(max_new_tokens=8, seed=1)
    with MisbehavingServer(lambda n: "ok") as server, ForwardingProxy() as proxy:
        direct = policy_for(server, retries=0).generate([QUESTION], params)
        # a host only the proxy can reach: without the proxy the name does not even resolve
        remote = server.url.replace("127.0.0.1", "chat.invalid")
        monkeypatch.setenv("http_proxy", f"http://user:p%40ss@127.0.0.1:{proxy.port}")
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        policy = OpenAIPolicy(remote, "served", max_retries=0, timeout_s=5)
        assert policy.generate([QUESTION], params)[0][0].text == direct[0][0].text
        assert proxy.requests == [(remote + "/chat/completions", "Basic " + base64.b64encode(b"user:p@ss").decode())]
        monkeypatch.setenv("no_proxy", "chat.invalid")          # listed in no_proxy: straight to the host, which fails
        with pytest.raises(ServerUnreachableError):
            policy.generate([QUESTION], params)
        assert len(proxy.requests) == 1


def test_loopback_servers_bypass_the_proxy_and_a_socks_proxy_is_refused(monkeypatch):
    with MisbehavingServer(lambda n: "ok") as server:
        monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")          # nothing listens there
        assert proxy_for(server.url) is None
        policy_for(server, retries=0).generate([QUESTION], SamplingParams(max_new_tokens=8, seed=1))
        monkeypatch.setenv("https_proxy", "socks5://127.0.0.1:1080")
        with pytest.raises(ValueError, match=r"socks5://127.0.0.1:1080.*not an http:// proxy URL"):
            proxy_for("https://api.example.com/v1/chat/completions")
