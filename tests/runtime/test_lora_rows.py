"""Mixed-adapter batches through `AdapterRows` (stacked adapters) give PEFT's `adapter_names` outputs within float
rounding, base rows exactly the base's, and HFPolicy samples the same tokens and log-probs either way (greedy and
seeded), without going through PEFT's per-forward path."""
import pytest
import torch

from llm_marl.backends.hf import HFPolicy
from llm_marl.backends.lora_rows import BASE_ADAPTER, AdapterRows
from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.team import default_lora_config, with_adapters

AGENTS = ["agent_0", "agent_1", "agent_2"]


def lora_model(config=None):
    """A tiny model with three LoRA adapters whose B matrices are random (so each adapter changes the outputs)."""
    model, tokenizer = tiny_model(seed=0)
    model = with_adapters(model, AGENTS, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name or "lora_magnitude" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    model.eval()
    return model, tokenizer


@pytest.fixture()
def model(one_torch_thread):
    return lora_model()


ROWS = ["agent_1", None, "agent_0", "agent_1", "agent_2", "agent_0", None]     # interleaved, with base rows


@torch.no_grad()
def test_stacked_forward_equals_peft_mixed_batch(model):
    model, _ = model
    ids = torch.randint(0, 1000, (len(ROWS), 9), generator=torch.Generator().manual_seed(1))
    peft_logits = model(input_ids=ids, adapter_names=[BASE_ADAPTER if a is None else a for a in ROWS]).logits
    rows = AdapterRows(model)
    assert rows.supports() and rows.layers
    with rows.rows(ROWS, ids.device):
        grouped = model(input_ids=ids).logits
        rows.set_rows(["agent_2"] * len(ROWS), ids.device)          # one adapter for every row: no index at all
        single = model(input_ids=ids).logits
        rows.set_rows([None] * len(ROWS), ids.device)
        base = model(input_ids=ids).logits
    torch.testing.assert_close(grouped, peft_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(single, model(input_ids=ids, adapter_names=["agent_2"] * len(ROWS)).logits,
                               rtol=1e-5, atol=1e-5)
    with model.disable_adapter():
        assert torch.equal(base, model(input_ids=ids).logits)         # base rows add exact zeros
    assert (grouped[0] - grouped[2]).abs().max() > 1e-2              # the adapters do differ
    assert (grouped[1] - peft_logits[1]).abs().max() == 0             # a base row inside a mixed batch: exact
    assert all("forward" not in layer.__dict__ for layer in rows.layers)   # PEFT's forward is back


@torch.no_grad()
def test_stacked_forward_accumulates_the_lora_product_in_place(model):
    """The ``B`` product is added into the base output (``addmm_``), not made as a fresh ``[tokens, out]`` tensor:
    on a prefill that tensor cost more in page faults than its FLOPs (module docstring of ``lora_rows``)."""
    from torch.profiler import ProfilerActivity, profile

    model, _ = model
    ids = torch.randint(0, 1000, (len(ROWS), 9), generator=torch.Generator().manual_seed(1))
    rows = AdapterRows(model)
    ranks = {sum(layer.lora_A[n].weight.shape[0] for n in layer.lora_A) for layer in rows.layers}   # stacked widths
    with rows.rows(ROWS, ids.device), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as trace:
        logits = model(input_ids=ids).logits
    events = trace.events()
    fresh_b_products = [e for e in events if e.name in ("aten::mm", "aten::linear") and len(e.input_shapes) >= 2
                        and e.input_shapes[0] and e.input_shapes[0][-1] in ranks]
    assert not fresh_b_products, [(e.name, e.input_shapes) for e in fresh_b_products[:3]]
    assert sum(e.name == "aten::addmm_" for e in events) >= len(rows.layers)
    torch.testing.assert_close(logits, model(input_ids=ids, adapter_names=[BASE_ADAPTER if a is None else a
                                                                          for a in ROWS]).logits, rtol=1e-5, atol=1e-5)


def test_policy_hands_the_output_layer_contiguous_rows(model):
    """``logits_to_keep=1`` slices ``hidden[:, -1:, :]``; on a strided ``[B, 1, d]`` view torch's ``linear`` runs
    a batched product against the head expanded B times (468 ms instead of 34 for 64 rows of SmolLM2-135M)."""
    model, tokenizer = model
    policy = HFPolicy(model, tokenizer, reuse_cache=False)
    seen = []
    model.get_output_embeddings().register_forward_pre_hook(lambda module, args: seen.append(
        (tuple(args[0].shape), args[0].is_contiguous())))
    policy.generate(CONVERSATIONS[:3], SamplingParams(max_new_tokens=3, temperature=0), adapters=ROWS[:3])
    assert seen and seen[0][0][:2] == (3, 1)          # the prefill's last position of each of the 3 rows
    assert all(contiguous for _, contiguous in seen), seen
    HFPolicy(model, tokenizer)                        # a second policy on the same model adds no second hook
    assert len(model.get_output_embeddings()._forward_pre_hooks) == 2


def refuse_peft_mixed_batch(monkeypatch):
    from peft.tuners.lora.layer import Linear

    def refuse(*args, **kwargs):
        raise AssertionError("the stacked path must not call PEFT's mixed-batch forward")

    monkeypatch.setattr(Linear, "_mixed_batch_forward", refuse)


CONVERSATIONS = [[{"role": "user", "content": f"What is {i} + {2 * i}?"}] for i in range(len(ROWS))]


def test_policy_samples_the_same_greedy_tokens_with_and_without_stacking(model, monkeypatch):
    model, tokenizer = model
    params = SamplingParams(max_new_tokens=8, temperature=0)

    def run(grouped: bool):
        policy = HFPolicy(model, tokenizer, grouped_lora=grouped, reuse_cache=False)
        out = policy.generate(CONVERSATIONS, params, adapters=ROWS, num_samples=2)
        return [(g.completion_ids, g.logprobs) for group in out for g in group]

    peft_out = run(False)
    refuse_peft_mixed_batch(monkeypatch)
    stacked_out = run(True)
    assert [ids for ids, _ in stacked_out] == [ids for ids, _ in peft_out]
    for (_, stacked), (_, peft) in zip(stacked_out, peft_out):
        assert stacked == pytest.approx(peft, abs=1e-4)


def test_seeded_samples_carry_the_logprobs_each_adapter_gives_them(model, monkeypatch):
    """Sampling ties are broken by float rounding, so seeded draws are compared with scoring, not with PEFT's draws."""
    model, tokenizer = model
    refuse_peft_mixed_batch(monkeypatch)
    policy = HFPolicy(model, tokenizer, reuse_cache=False)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3)
    first = policy.generate(CONVERSATIONS, params, adapters=ROWS)
    assert [g.completion_ids for g, in first] == [g.completion_ids for g, in policy.generate(CONVERSATIONS, params,
                                                                                               adapters=ROWS)]
    for adapter, (generation,) in zip(ROWS, first):
        scored, mask = policy.token_logprobs([generation.prompt_ids], [generation.completion_ids], adapter=adapter,
                                             temperature=1.0, reference=adapter is None)
        assert scored[mask].tolist() == pytest.approx(generation.logprobs, abs=1e-4)


def test_active_lora_dropout_keeps_peft_path(one_torch_thread):
    config = default_lora_config()
    config.lora_dropout = 0.05
    model, _ = lora_model(config)
    model.train()                                     # dropout is active in training mode only
    config_dropout = [d for layer in AdapterRows(model).layers for d in layer.lora_dropout.values()]
    assert any(getattr(d, "p", 0) for d in config_dropout)
    assert not AdapterRows(model).supports()
    model.eval()
    assert AdapterRows(model).supports()


def test_adapters_it_does_not_cover_keep_peft_path(one_torch_thread):
    config = default_lora_config()
    config.use_dora = True
    model, tokenizer = lora_model(config)
    assert not AdapterRows(model).supports()          # DoRA is not computed here: PEFT decides (and refuses)
    policy = HFPolicy(model, tokenizer, reuse_cache=False)
    with pytest.raises(ValueError, match="DoRA"):
        policy.generate([[{"role": "user", "content": "Hi"}]] * 3, SamplingParams(max_new_tokens=2, temperature=0),
                        adapters=AGENTS)
