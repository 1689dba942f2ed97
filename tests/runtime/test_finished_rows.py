"""Rows that finished leave the decode batch: the others sample exactly what they would have with every row kept,
and the finished rows' KV caches are still stored for the next turn."""
import pytest
import torch

import llm_marl.backends.hf.decode_loop as decode_loop
from llm_marl.backends.hf import HFPolicy, rows_to_keep
from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.team import with_adapters

CONVERSATIONS = [[{"role": "user", "content": f"Count to {i} and stop."}] for i in range(12)]
ADAPTERS = ["one", "two"] * 6


def test_rows_to_keep_waits_for_a_quarter_and_keeps_a_minimum():
    flags = lambda *bits: torch.tensor(bits, dtype=torch.bool)             # noqa: E731
    assert rows_to_keep(flags(1, 0, 0, 0, 0, 0, 0, 0)) is None                # 1 of 8 finished: not worth a copy
    assert rows_to_keep(flags(1, 0, 0, 1, 0, 0, 0, 0)).tolist() == [1, 2, 4, 5, 6, 7]
    assert rows_to_keep(flags(1, 1, 1, 0, 1, 1, 1, 1)).tolist() == [0, 1, 2, 3]   # at least 4 rows
    assert rows_to_keep(flags(1, 1, 0)) is None


@pytest.fixture()
def policy(one_torch_thread):
    model, tokenizer = tiny_model(seed=0)
    model = with_adapters(model, ["one", "two"])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    policy = HFPolicy(model, tokenizer, reuse_cache=False)
    params = SamplingParams(max_new_tokens=12, temperature=0)
    first = policy.generate(CONVERSATIONS, params, adapters=ADAPTERS)
    # stop on tokens the random model says at different steps, so rows finish at different times
    policy.stop_ids = sorted({g[0].completion_ids[k] for k, g in zip([2, 5, 8, 3, 6, 9], first)})
    return policy


def turns(policy, params, monkeypatch, compact: bool, reuse: bool):
    """Two turns (the second extends each first answer): ids, log-probs, and how many compactions ran."""
    compactions = []

    def counting(done, min_rows=decode_loop.MIN_DECODE_ROWS):
        keep = original(done, min_rows) if compact else None
        compactions.append(keep is not None)
        return keep

    original = rows_to_keep
    monkeypatch.setattr(decode_loop, "rows_to_keep", counting)
    policy.reuse_cache = reuse
    policy.clear_cache()
    first = policy.generate(CONVERSATIONS, params, adapters=ADAPTERS)
    follow = [c + [{"role": "assistant", "content": g[0].text}, {"role": "user", "content": "Again."}]
              for c, g in zip(CONVERSATIONS, first)]
    second = policy.generate(follow, params, adapters=ADAPTERS)
    out = [(g[0].completion_ids, g[0].logprobs, g[0].finish_reason) for g in first + second]
    return out, sum(compactions)


@pytest.mark.parametrize("reuse", [False, True])
def test_dropping_finished_rows_changes_no_greedy_token(policy, monkeypatch, reuse):
    params = SamplingParams(max_new_tokens=12, temperature=0)
    kept, _ = turns(policy, params, monkeypatch, compact=False, reuse=reuse)
    dropped, compactions = turns(policy, params, monkeypatch, compact=True, reuse=reuse)
    assert compactions >= 2
    assert {len(ids) for ids, _, _ in kept} != {12}                           # some rows did finish early
    assert [ids for ids, _, _ in dropped] == [ids for ids, _, _ in kept]
    assert [r for _, _, r in dropped] == [r for _, _, r in kept]
    for (_, a, _), (_, b, _) in zip(dropped, kept):
        assert a == pytest.approx(b, abs=1e-5)
    if reuse:
        assert policy.cache_stats.hits > 0                                     # dropped rows were stored too


def test_seeded_sampling_with_finished_rows_is_reproducible(policy, monkeypatch):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5)
    sampled = policy.generate(CONVERSATIONS, params, adapters=ADAPTERS)
    policy.stop_ids = sorted({g[0].completion_ids[k] for k, g in zip([2, 5, 8, 3, 6, 9], sampled)})
    a, compactions = turns(policy, params, monkeypatch, compact=True, reuse=True)
    b, _ = turns(policy, params, monkeypatch, compact=True, reuse=True)
    assert a == b and compactions >= 1
