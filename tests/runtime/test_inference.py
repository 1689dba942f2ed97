"""Inference backends: the OpenAI-compatible client against real local HTTP servers, llama.cpp, the factory."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llm_marl.backends import LlamaCppPolicy, OpenAIPolicy, ServerUnreachableError, load_policy
from llm_marl.hardware import free_cores
from llm_marl.policy import Policy, SamplingParams

QUESTION = [{"role": "user", "content": "What is 2 + 3? Answer with a number."}]


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FlakyServer:
    """A tiny chat-completions server that answers HTTP 500 to its first ``failures`` requests, then 200."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "body": body})
                if len(server.requests) <= server.failures:
                    self.send_response(500)
                    self.end_headers()
                    self.wfile.write(b"temporarily broken")
                    return
                reply = {
                    "choices": [
                        {
                            "message": {"role": "assistant", "content": f"echo {body['messages'][-1]['content']}"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"completion_tokens": min(7, body["max_tokens"])},
                }   # a server honours max_tokens
                payload = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FlakyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_openai_policy_retries_server_errors_then_succeeds():
    with FlakyServer(failures=2) as server:
        policy = OpenAIPolicy(server.url, "served-model", max_retries=3, backoff_s=0.01)
        out = policy.generate([QUESTION], SamplingParams(max_new_tokens=8, seed=1))
    assert [len(row) for row in out] == [1]
    assert out[0][0].text == "echo " + QUESTION[0]["content"]
    assert out[0][0].num_tokens == 7 and out[0][0].finish_reason == "stop"
    assert len(server.requests) == 3  # two 500s, then the answer
    assert {r["path"] for r in server.requests} == {"/v1/chat/completions"}
    assert server.requests[-1]["body"]["model"] == "served-model"
    assert server.requests[-1]["body"]["max_tokens"] == 8


def test_openai_policy_gives_up_after_retries_naming_the_url():
    with FlakyServer(failures=100) as server:
        policy = OpenAIPolicy(server.url, "m", max_retries=2, backoff_s=0.01)
        with pytest.raises(ServerUnreachableError, match="HTTP 500") as info:
            policy.generate([QUESTION], SamplingParams(max_new_tokens=4))
    assert server.url in str(info.value)
    assert len(server.requests) == 3


def test_openai_policy_unreachable_server_error_names_url_and_fix():
    url = f"http://127.0.0.1:{free_port()}/v1"
    policy = OpenAIPolicy(url, "m", max_retries=1, backoff_s=0.01, timeout_s=2)
    start = time.monotonic()
    with pytest.raises(ServerUnreachableError) as info:
        policy.generate([QUESTION], SamplingParams(max_new_tokens=4))
    message = str(info.value)
    assert url + "/chat/completions" in message and "--base-url" in message and "llama_cpp.server" in message
    assert time.monotonic() - start < 10


def test_openai_policy_bounded_concurrency_keeps_order():
    with FlakyServer(failures=0) as server:
        policy = OpenAIPolicy(server.url, "m", max_concurrency=3)
        conversations = [[{"role": "user", "content": f"q{i}"}] for i in range(7)]
        out = policy.generate(conversations, SamplingParams(max_new_tokens=4, seed=3), num_samples=2)
    assert [[g.text for g in row] for row in out] == [[f"echo q{i}"] * 2 for i in range(7)]
    seeds = [r["body"]["seed"] for r in server.requests]
    assert len(set(seeds)) == 14  # every (conversation, sample) gets its own seed


@pytest.mark.parametrize("kwargs, match", [
    ({"base_url": "localhost:8000", "model": "m"}, "http"),
    ({"base_url": "http://x/v1", "model": "m", "max_concurrency": 0}, "max_concurrency"),
])
def test_openai_policy_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OpenAIPolicy(**kwargs)


def test_load_policy_rejects_bad_backend_and_missing_url():
    with pytest.raises(ValueError, match="unknown backend 'vllm'"):
        load_policy("vllm", "m")
    with pytest.raises(ValueError, match="needs base_url"):
        load_policy("openai", "m")
    with FlakyServer(failures=0) as server:
        policy = load_policy("openai", "m", base_url=server.url)
        assert isinstance(policy, Policy)
        with pytest.raises(ValueError, match="no LoRA adapters"):
            policy.generate([QUESTION], SamplingParams(), adapters=["a"])


# ------------------------------------------------------------------ real model (SmolLM2 GGUF)
def smollm2_gguf() -> Path:
    from llm_marl.models import gguf_path
    return Path(gguf_path("smollm2-135m"))


@pytest.mark.slow
@pytest.mark.ci_slow
@pytest.mark.native
def test_llamacpp_policy_generates_seeded_samples():
    policy = load_policy("llamacpp", "smollm2-135m", seed=0)
    params = SamplingParams(max_new_tokens=16, temperature=0.8, seed=5)
    first = policy.generate([QUESTION, QUESTION], params, num_samples=2)
    again = policy.generate([QUESTION, QUESTION], params, num_samples=2)
    texts = [[g.text for g in row] for row in first]
    assert texts == [[g.text for g in row] for row in again]  # seeded: reproducible
    assert len({t for row in texts for t in row}) > 1          # yet every sample differs
    for g in (g for row in first for g in row):
        assert 0 < g.num_tokens <= 16 and g.prompt_ids and g.finish_reason in ("stop", "length")
    greedy = policy.generate([QUESTION], SamplingParams(max_new_tokens=16, temperature=0.0))
    assert greedy[0][0].text.strip()


CONVERSATIONS = [
    QUESTION,
    [{"role": "user", "content": "Name a colour."}],
    [{"role": "system", "content": "You are Agent 1. Be concise."},
     {"role": "user", "content": "A shop sells 3 pens for 2 dollars. How much do 12 pens cost? Answer in \\boxed{}."}],
    [{"role": "user", "content": "Write one sentence about the sea."}],
    [{"role": "user", "content": "What is the capital of France?"}],
]


def check_generations(policy: LlamaCppPolicy, conversations, out, params: SamplingParams, num_samples: int) -> None:
    """Shape, prompt ids, and the stop / length bookkeeping of every generation."""
    assert [len(row) for row in out] == [num_samples] * len(conversations)
    for conversation, row in zip(conversations, out):
        for g in row:
            assert g.prompt_ids == policy.prompt_ids(conversation)
            assert g.logprobs is None and not set(g.completion_ids) & policy._stop_ids
            assert 0 <= g.num_tokens <= params.max_new_tokens
            # "length" exactly when the budget ran out; "stop" = an end-of-turn token came first
            assert (g.finish_reason == "length") == (g.num_tokens == params.max_new_tokens)
            assert g.text == policy._model.detokenize(g.completion_ids).decode("utf-8", errors="replace")


class PeakBatch:
    """Wraps a policy's batch builder to record the most sequences ever decoded together."""

    def __init__(self, policy: LlamaCppPolicy) -> None:
        self.peak = 0
        fill = policy._fill_batch

        def recording(streams):
            self.peak = max(self.peak, len(streams))
            return fill(streams)

        policy._fill_batch = recording


# Batched and one-at-a-time decoding agree up to float rounding: llama.cpp computes a one-token
# micro-batch with other kernels than a multi-token one, which can flip a near-tie in the logits.
# These prompts have none within the tested lengths, so the tokens must be equal.
@pytest.mark.slow
@pytest.mark.ci_slow
@pytest.mark.native
def test_llamacpp_batched_greedy_equals_single_sequences_and_splits_big_calls():
    policy = LlamaCppPolicy(smollm2_gguf(), n_ctx=1024, max_batch=4)
    peak = PeakBatch(policy)
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    conversations = CONVERSATIONS[:3]
    batched = policy.generate(conversations, params, num_samples=2)   # 6 sequences > max_batch=4
    assert peak.peak == 4
    check_generations(policy, conversations, batched, params, 2)
    for conversation, row in zip(conversations, batched):
        alone = policy.generate([conversation], params)[0][0]
        assert [g.completion_ids for g in row] == [alone.completion_ids] * 2
        assert {g.finish_reason for g in row} == {alone.finish_reason}


def test_equal_chunk_shares_the_prefill_budget_equally():
    from llm_marl.backends.llamacpp import equal_chunk

    assert equal_chunk([600] * 32, 512) == 16                  # 32 long prompts: 16 tokens each, one micro-batch
    assert equal_chunk([600] * 32, 500) == 15                  # 12 streams decoding took 12 of the 512
    assert equal_chunk([3, 300, 400], 512) == 254              # the short one finishes; the others share the rest
    assert equal_chunk([10, 20], 512) == 20                    # everything fits: each takes all it has left
    assert 3 + 2 * equal_chunk([3, 300, 400], 512) <= 512 < 3 + 2 * (equal_chunk([3, 300, 400], 512) + 1)
    assert equal_chunk([5, 5], 1) == 1                         # never 0: every prefilling stream moves on


# llama.cpp splits a batch of several KV streams into micro-batches that hold the same number of tokens
# of every sequence in them (split_equal), each a pass over all the weights: prompts fed whole one
# after the other made one micro-batch per distinct length.
@pytest.mark.slow
@pytest.mark.ci_slow
@pytest.mark.native
def test_llamacpp_prefills_in_equal_chunks_on_consecutive_sequences():
    policy = LlamaCppPolicy(smollm2_gguf(), n_ctx=1024, max_batch=8, n_threads=1)
    fill, steps = policy._fill_batch, []

    def recording(streams):
        before = [(s.prefilling, len(s.prompt) - s.fed) for s in streams]
        fill(streams)
        batch = policy._batch.batch
        taken = [0] * len(streams)
        for j in range(batch.n_tokens):
            taken[batch.seq_id[j][0]] += 1
        steps.append([(prefilling, left, took) for (prefilling, left), took in zip(before, taken)])

    policy._fill_batch = recording
    counts = [40, 90, 150, 60, 120, 200]                       # ~1,000 prompt tokens: several steps of 512
    conversations = [[{"role": "user", "content": "Count on: " + " ".join(map(str, range(n)))}] for n in counts]
    out = policy.generate(conversations, SamplingParams(max_new_tokens=4, temperature=0))
    assert [len(row) for row in out] == [1] * len(counts)
    prefill_steps = [step for step in steps if any(prefilling for prefilling, _, _ in step)]
    assert len(prefill_steps) >= 2
    for step in prefill_steps:
        prefilling = [seq for seq, (p, _, _) in enumerate(step) if p]
        assert prefilling == list(range(prefilling[0], prefilling[-1] + 1))      # one run of consecutive ids
        unfinished = {took for p, left, took in step if p and took < left}
        assert len(unfinished) <= 1                                   # every stream that goes on takes one chunk size
        assert all(took <= max(unfinished, default=took) for p, left, took in step if p)
        assert all(took == 1 for p, _, took in step if not p)         # decoding streams: one token each


@pytest.mark.slow
@pytest.mark.native
def test_llamacpp_batched_sampling_is_valid_and_seeded_independently_of_batching():
    params = SamplingParams(max_new_tokens=40, temperature=0.8, top_p=0.9, seed=11)
    # no KV reuse: a repeated prompt would restore the first call's states, which may round otherwise
    wide = LlamaCppPolicy(smollm2_gguf(), n_ctx=1024, max_batch=8, reuse_cache=False)
    out = wide.generate(CONVERSATIONS, params, num_samples=2)
    check_generations(wide, CONVERSATIONS, out, params, 2)
    assert {g.finish_reason for row in out for g in row} == {"stop", "length"}   # both endings occur in one batch
    ids = [[g.completion_ids for g in row] for row in out]
    assert ids == [[g.completion_ids for g in row] for row in wide.generate(CONVERSATIONS, params, num_samples=2)]
    assert any(a != b for a, b in ids)                        # two samples of one prompt: two seeds
    wide.close()
    narrow = LlamaCppPolicy(smollm2_gguf(), n_ctx=1024, max_batch=3, reuse_cache=False)   # same seeds, other batches
    peak = PeakBatch(narrow)
    assert ids == [[g.completion_ids for g in row] for row in narrow.generate(CONVERSATIONS, params, num_samples=2)]
    assert peak.peak == 3


@pytest.mark.slow
@pytest.mark.native
def test_llamacpp_batched_greedy_matches_one_sequence_at_a_time():
    params = SamplingParams(max_new_tokens=48, temperature=0.0)
    batched = LlamaCppPolicy(smollm2_gguf(), n_ctx=1024, max_batch=8).generate(CONVERSATIONS, params)
    single = LlamaCppPolicy(smollm2_gguf(), n_ctx=1024, max_batch=1)
    peak = PeakBatch(single)
    assert [[g.completion_ids for g in row] for row in batched] == \
        [[g.completion_ids for g in row] for row in single.generate(CONVERSATIONS, params)]
    assert peak.peak == 1


@pytest.mark.slow
@pytest.mark.native
def test_llamacpp_policy_rejects_bad_input_and_stays_usable():
    policy = LlamaCppPolicy(smollm2_gguf(), n_ctx=64, max_batch=2)
    assert policy.n_ctx >= 64
    long_question = [{"role": "user", "content": "Count: " + " ".join(str(i) for i in range(200))}]
    with pytest.raises(ValueError, match=r"prompt 1 of \d+ tokens \+ max_new_tokens=8 exceeds the context"):
        policy.generate([QUESTION, long_question], SamplingParams(max_new_tokens=8))
    with pytest.raises(ValueError, match="no LoRA adapters"):
        policy.generate([QUESTION], SamplingParams(), adapters=["a"])
    with pytest.raises(ValueError, match="num_samples must be >= 1"):
        policy.generate([QUESTION], SamplingParams(), num_samples=0)
    with pytest.raises(ValueError, match="conversation 1 must be a non-empty list"):
        policy.generate([QUESTION, []], SamplingParams())
    assert policy.generate([], SamplingParams()) == []
    out = policy.generate([QUESTION], SamplingParams(max_new_tokens=8, temperature=0.0))
    assert 0 < out[0][0].num_tokens <= 8
    policy.close()
    with pytest.raises(RuntimeError, match="was closed"):
        policy.generate([QUESTION], SamplingParams(max_new_tokens=8))


@pytest.mark.parametrize("kwargs, match", [
    ({"max_batch": 0}, "max_batch must be an int in"),
    ({"max_batch": 2.5}, "max_batch must be an int in"),
    ({"n_ctx": 8}, "n_ctx must be an int >= 16"),
])
def test_llamacpp_policy_rejects_bad_arguments_before_loading(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LlamaCppPolicy(smollm2_gguf(), **kwargs)
    with pytest.raises(ValueError, match="does not exist"):
        LlamaCppPolicy("/nonexistent/model.gguf")


@pytest.mark.slow
@pytest.mark.ci_slow
def test_openai_policy_against_real_llama_cpp_server(tmp_path):
    pytest.importorskip("uvicorn", reason="needs llama-cpp-python[server]: pip install 'llm-marl-envs[server]'")
    port = free_port()
    log = open(tmp_path / "server.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf()), "--host", "127.0.0.1",
         "--port", str(port), "--model_alias", "smollm2-135m", "--n_ctx", "2048",
         "--n_threads", str(free_cores())],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(base_url + "/models", timeout=2).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"llama_cpp.server did not start: {(tmp_path / 'server.log').read_text()[-2000:]}")
                time.sleep(0.5)
        policy = load_policy("openai", "smollm2-135m", base_url=base_url, max_concurrency=2)
        conversations = [QUESTION, [{"role": "user", "content": "Name a colour."}]]
        out = policy.generate(conversations, SamplingParams(max_new_tokens=12, temperature=0.7, seed=0))
        assert [len(row) for row in out] == [1, 1]
        for row in out:
            assert row[0].text.strip() and 0 < row[0].num_tokens <= 12
        # the benchmark harness through the served model: token counts survive the rollout engine
        from llm_marl.benchmark import BenchConfig, run_benchmark
        config = BenchConfig(env_id="gsm_symbolic_debate-v0", models=["smollm2-135m"], backend="openai",
                             base_url=base_url, num_agents=2, num_turns=1, episodes=1, max_new_tokens=16,
                             env_kwargs={"num_tasks": 5})
        summary = run_benchmark(config, tmp_path / "run", progress=False)
        assert summary["num_episodes"] == 1 and 0 < summary["tokens_total"] <= 2 * 16
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
