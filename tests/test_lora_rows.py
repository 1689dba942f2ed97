"""Mixed-adapter batches through `AdapterRows` give exactly PEFT's `adapter_names` outputs, and HFPolicy samples the
same tokens and log-probs either way (greedy and seeded), without going through PEFT's per-forward path."""
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
def test_grouped_forward_equals_peft_mixed_batch_bit_for_bit(model):
    model, _ = model
    ids = torch.randint(0, 1000, (len(ROWS), 9), generator=torch.Generator().manual_seed(1))
    peft_logits = model(input_ids=ids, adapter_names=[BASE_ADAPTER if a is None else a for a in ROWS]).logits
    rows = AdapterRows(model)
    assert rows.supports() and rows.layers
    with rows.rows(ROWS, ids.device):
        grouped = model(input_ids=ids).logits
        rows.set_rows(["agent_2"] * len(ROWS), ids.device)          # one adapter for every row: no index at all
        single = model(input_ids=ids).logits
    assert torch.equal(grouped, peft_logits)
    assert torch.equal(single, model(input_ids=ids, adapter_names=["agent_2"] * len(ROWS)).logits)
    assert not torch.equal(grouped[0], grouped[2])                   # the adapters do differ
    assert all("forward" not in layer.__dict__ for layer in rows.layers)   # PEFT's forward is back


@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=8, temperature=0),
                                    SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3)],
                         ids=["greedy", "seeded"])
def test_policy_samples_the_same_with_and_without_grouping(model, params, monkeypatch):
    model, tokenizer = model
    conversations = [[{"role": "user", "content": f"What is {i} + {2 * i}?"}] for i in range(len(ROWS))]

    def run(grouped: bool):
        policy = HFPolicy(model, tokenizer, grouped_lora=grouped, reuse_cache=False)
        out = policy.generate(conversations, params, adapters=ROWS, num_samples=2)
        return [(g.completion_ids, g.logprobs) for group in out for g in group]

    peft_out = run(False)
    from peft.tuners.lora.layer import Linear

    def refuse(*args, **kwargs):
        raise AssertionError("the grouped path must not call PEFT's mixed-batch forward")

    monkeypatch.setattr(Linear, "_mixed_batch_forward", refuse)
    assert run(True) == peft_out


def test_adapters_it_does_not_cover_keep_peft_path(one_torch_thread):
    config = default_lora_config()
    config.use_dora = True
    model, tokenizer = lora_model(config)
    assert not AdapterRows(model).supports()          # DoRA is not computed here: PEFT decides (and refuses)
    policy = HFPolicy(model, tokenizer, reuse_cache=False)
    with pytest.raises(ValueError, match="DoRA"):
        policy.generate([[{"role": "user", "content": "Hi"}]] * 3, SamplingParams(max_new_tokens=2, temperature=0),
                        adapters=AGENTS)
