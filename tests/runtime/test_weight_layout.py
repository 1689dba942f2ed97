"""HF policies store float32 CPU linear weights input-major: same shapes, values, outputs and training."""
import torch
from safetensors.torch import load_file, save_file

from llm_marl.backends.hf import HFPolicy, set_weight_layout
from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.team import Team

CONVERSATIONS = [[{"role": "user", "content": "Add 2 and 3."}],
                 [{"role": "user", "content": "What is 7 times 6? Answer with a number."}]]


def linear_weights(model, lora: bool = False) -> dict[str, torch.Tensor]:
    return {name: module.weight for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and ("lora_" in name) == lora}


def input_major(weight: torch.Tensor) -> bool:
    return weight.t().is_contiguous() and not weight.is_contiguous()


def test_a_cpu_float32_policy_stores_its_linear_weights_input_major(one_torch_thread):
    model, tokenizer = tiny_model(seed=0)
    before = {name: w.detach().clone() for name, w in linear_weights(model).items()}
    embedding = model.get_input_embeddings().weight
    policy = HFPolicy(model, tokenizer)
    after = linear_weights(policy.model)
    assert after.keys() == before.keys() and "lm_head" in after and len(after) == 2 * 7 + 1
    for name, weight in after.items():
        assert input_major(weight), name
        assert weight.shape == before[name].shape and torch.equal(weight, before[name]), name
    # the tied embedding is still the output layer's tensor, and still looks rows up
    assert model.get_input_embeddings().weight is embedding is model.lm_head.weight
    ids = torch.tensor([[5, 9, 200]])
    torch.testing.assert_close(model.get_input_embeddings()(ids)[0], before["lm_head"][ids[0]], rtol=0, atol=0)


def test_lora_adapters_stay_row_major_and_the_bases_move(one_torch_thread):
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, 2)
    peft_model = team.policies()[0].model
    bases, adapters = linear_weights(peft_model), linear_weights(peft_model, lora=True)
    assert bases and adapters
    assert all(input_major(w) for w in bases.values())
    assert all(w.is_contiguous() for w in adapters.values())


def test_outputs_log_probs_and_gradients_do_not_depend_on_the_layout(one_torch_thread):
    policies = {}
    for layout in (False, True):
        model, tokenizer = tiny_model(seed=0)
        policies[layout] = HFPolicy(model, tokenizer, input_major_weights=layout)
    assert not any(input_major(w) for w in linear_weights(policies[False].model).values())
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    tokens = {
        layout: [g[0].completion_ids for g in p.generate(CONVERSATIONS, params)] for layout, p in policies.items()
    }
    assert tokens[True] == tokens[False] and all(tokens[True])
    scored = {}
    for layout, policy in policies.items():
        prompts = [policy.encode(c) for c in CONVERSATIONS]
        logp, _ = policy.token_logprobs(prompts, tokens[layout], temperature=0.7)
        logp.sum().backward()
        scored[layout] = logp.detach(), {n: p.grad for n, p in policy.model.named_parameters()}
    torch.testing.assert_close(scored[True][0], scored[False][0], rtol=0, atol=1e-5)
    for name, grad in scored[False][1].items():
        torch.testing.assert_close(scored[True][1][name], grad, rtol=1e-4, atol=1e-5, msg=name)   # float32 rounding


def test_an_optimizer_step_keeps_the_layout_and_checkpoints_round_trip(one_torch_thread, tmp_path):
    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    prompt = policy.encode(CONVERSATIONS[0])
    before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    logp, _ = policy.token_logprobs([prompt], [[18, 19, 20]], temperature=1.0)
    (-logp.sum()).backward()
    optimizer.step()
    weight = model.model.layers[0].mlp.up_proj.weight
    assert not torch.equal(weight, before) and input_major(weight)
    state = policy.trainable_state_dict(None)
    save_file(state, str(tmp_path / "agent.safetensors"))   # safetensors refuses strided tensors
    fresh_model, _ = tiny_model(seed=1)
    fresh = HFPolicy(fresh_model, tokenizer)
    fresh.load_trainable_state_dict(None, load_file(str(tmp_path / "agent.safetensors")))
    for name, value in fresh.trainable_state_dict(None).items():
        torch.testing.assert_close(value, state[name], rtol=0, atol=0, msg=name)
    assert input_major(fresh_model.model.layers[0].mlp.up_proj.weight)


def test_other_dtypes_are_left_alone_and_row_major_can_be_restored():
    model, _ = tiny_model(seed=0)
    half = model.to(torch.bfloat16)
    assert set_weight_layout(half, input_major=True) == 0
    model, _ = tiny_model(seed=0)
    values = {name: w.detach().clone() for name, w in linear_weights(model).items()}
    assert set_weight_layout(model, input_major=True) == len(values)
    assert set_weight_layout(model, input_major=True) == 0          # idempotent
    assert set_weight_layout(model, input_major=False) == len(values)
    for name, weight in linear_weights(model).items():
        assert weight.is_contiguous() and torch.equal(weight, values[name]), name
