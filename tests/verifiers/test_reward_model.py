"""Learned verifier: class balancing, training on a learnable signal, save/load, and the real HTTP server."""
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest

from llm_marl.models import tiny_model
from verifiers import Verdict
from verifiers.reward_model import (
    RewardExample,
    RewardModel,
    balance_examples,
    load_examples,
    reward_accuracy,
    save_examples,
    train_reward_model,
)
from verifiers.reward_server import RewardClient, RewardServer, RewardServerError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def reward_model():
    model, tokenizer = tiny_model(seed=0)
    return RewardModel.from_causal_lm(model, tokenizer, seed=0, max_length=64)


def test_balance_examples_per_question_then_overall():
    def ex(q, c, n):
        return [RewardExample(q, f"{q}-{c}-{k}", c) for k in range(n)]

    data = ex("q1", True, 3) + ex("q1", False, 1) + ex("q2", False, 2) + ex("q3", True, 1)
    balanced = balance_examples(data, seed=0)
    per_question = Counter((e.question, e.correct) for e in balanced)
    assert per_question[("q1", True)] == per_question[("q1", False)] == 1     # min(3, 1) of each
    # q2 (wrong only) and q3 (right only) fill the overall balance: one of each
    assert per_question[("q3", True)] == 1 and per_question[("q2", False)] == 1
    assert sum(e.correct for e in balanced) == sum(not e.correct for e in balanced) == 2
    assert balance_examples(data, seed=0) == balanced                          # seeded


def test_examples_jsonl_round_trip_and_bad_records(tmp_path):
    path = tmp_path / "rm.jsonl"
    examples = [RewardExample("q", "a", True), RewardExample("q", "b", False)]
    save_examples(examples, path)
    assert load_examples(path) == examples
    path.write_text('{"question": "q", "answer": "a"}\n')
    with pytest.raises(ValueError, match="rm.jsonl:1: .*missing field"):
        load_examples(path)


def synthetic_examples(questions):
    """Label is readable from the answer's last word: a signal a tiny model can learn."""
    data = []
    for q in questions:
        data.append(RewardExample(f"What is {q} plus one?", "I computed it. Verdict: yes", True))
        data.append(RewardExample(f"What is {q} plus one?", "I computed it. Verdict: no", False))
    return data


def test_training_learns_a_learnable_signal_and_save_load(reward_model, tmp_path):
    train, held_out = synthetic_examples(range(12)), synthetic_examples(range(100, 106))
    stats = train_reward_model(reward_model, train, epochs=6, learning_rate=3e-3, batch_size=8, seed=0)
    assert stats["num_examples"] == 24 and stats["num_right"] == 12
    assert stats["last_epoch_loss"] < stats["first_loss"]
    assert reward_accuracy(reward_model, held_out) == 1.0
    verdict = reward_model.score("What is 7 plus one?", "I computed it. Verdict: yes")
    assert isinstance(verdict, Verdict) and verdict.correct and 0.5 <= verdict.score <= 1.0
    reward_model.save(tmp_path / "rm")
    reloaded = RewardModel.from_pretrained(tmp_path / "rm", max_length=64)
    before = [v.score for v in reward_model.score_batch([(e.question, e.answer) for e in held_out])]
    after = [v.score for v in reloaded.score_batch([(e.question, e.answer) for e in held_out])]
    assert after == pytest.approx(before, abs=1e-5)


def test_training_refuses_single_class_data(reward_model):
    with pytest.raises(ValueError, match="need both right and wrong"):
        train_reward_model(reward_model, [RewardExample("q", "a", True)])


# ---------------------------------------------------------------- the real server
def post(url, body: bytes, headers=None):
    request = urllib.request.Request(
        url, data=body, method="POST", headers=headers or {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_server_scores_like_the_model_and_batches_concurrent_requests(reward_model):
    pairs = [(f"What is {k} plus one?", "Verdict: yes" if k % 2 else "Verdict: no") for k in range(6)]
    direct = reward_model.score_batch(pairs)
    with RewardServer(reward_model.score_batch, max_batch_size=16, max_wait_ms=300) as server:
        client = RewardClient(server.url, timeout_s=30, retries=0)
        assert client.health()["status"] == "ok"
        served = client.score_batch(pairs)
        assert [v.score for v in served] == pytest.approx([v.score for v in direct], abs=1e-5)
        assert [v.correct for v in served] == [v.correct for v in direct]
        # four concurrent single-item requests within the 300 ms window are scored in fewer batches
        results, batches_before = [None] * 4, server.num_batches
        threads = [
            threading.Thread(target=lambda i=i: results.__setitem__(i, client.score(*pairs[i]))) for i in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [r.score for r in results] == pytest.approx([v.score for v in direct[:4]], abs=1e-5)
        assert server.num_batches - batches_before < 4


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("/score", b"not json", 400, "not valid JSON"),
        ("/score", b'{"pairs": []}', 400, "items"),
        ("/score", b'{"items": []}', 400, "empty"),
        ("/score", b'{"items": [{"question": "q", "answer": 3}]}', 400, "items\\[0\\]"),
        (
            "/score",
            json.dumps({"items": [{"question": "q", "answer": "a"}] * 5}).encode(),
            413,
            "max_items_per_request",
        ),
        ("/nowhere", b"{}", 404, "unknown path"),
    ],
)
def test_server_bad_requests_get_clear_4xx(path, body, status, message):
    with RewardServer(lambda pairs: [Verdict(1.0, True)] * len(pairs), max_items_per_request=4) as server:
        code, reply = post(server.url + path, body)
    assert code == status
    assert re.search(message, reply["error"])


def test_client_fails_loudly():
    calls = []

    def broken_scorer(pairs):
        calls.append(len(pairs))
        raise RuntimeError("model exploded")

    with RewardServer(broken_scorer, max_wait_ms=0) as server:
        with pytest.raises(RewardServerError, match="model exploded"):
            RewardClient(server.url, timeout_s=5, retries=1, backoff_s=0.01).score("q", "a")
        assert len(calls) == 2                                                 # a 5xx is retried
        with pytest.raises(RewardServerError, match="refused POST /score with 400"):
            RewardClient(server.url, retries=3).score_batch([])                # a 4xx is not retried
        assert len(calls) == 2
    with pytest.raises(ValueError, match="loopback"):
        RewardServer(broken_scorer, host="0.0.0.0")


def test_client_times_out_on_a_silent_server():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)                         # accepts connections (backlog) but never answers
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        start = time.monotonic()
        with pytest.raises(RewardServerError, match="did not answer .* after 2 attempt"):
            RewardClient(url, timeout_s=0.3, retries=1, backoff_s=0.05).health()
        assert time.monotonic() - start < 5
    finally:
        silent.close()
    with pytest.raises(RewardServerError, match="Is the server running"):
        RewardClient(url, timeout_s=0.3, retries=1, backoff_s=0.01).health()    # now nothing listens at all
