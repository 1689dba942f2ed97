"""Scoring through the output layer as one autograd node: the same log-probs and gradients as the model's logits."""
import pytest
import torch

from llm_marl.backends.head_logprobs import head_logprobs
from llm_marl.backends.hf import HFPolicy
from llm_marl.models import tiny_model

GRADIENT_ROUNDING_UNITS = 256   # float32 gradients of two summation orders: |a - b| <= this * 2**-24 * max|g|
CONVERSATIONS = [[{"role": "user", "content": "say 3"}], [{"role": "user", "content": "write a longer line, please"}]]


def plain_logprobs(hidden, weight, bias, targets, temperature):
    logits = torch.nn.functional.linear(hidden, weight, bias)
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [0.7, 0.0])
@pytest.mark.parametrize("with_bias", [False, True])
def test_values_and_gradients_equal_log_softmax_of_the_head(temperature, with_bias):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 5, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(11, generator=g, dtype=torch.float64, requires_grad=True) if with_bias else None
    targets = torch.randint(0, 11, (7,), generator=g)
    torch.testing.assert_close(head_logprobs(hidden, weight, bias, targets, temperature),
                               plain_logprobs(hidden, weight, bias, targets, temperature))
    inputs = (hidden, weight) + ((bias,) if with_bias else ())
    for _ in range(3):                           # vector-Jacobian products for random cotangents, fresh graphs
        cotangent = torch.randn(7, generator=g, dtype=torch.float64)
        fused = torch.autograd.grad(head_logprobs(hidden, weight, bias, targets, temperature) @ cotangent, inputs)
        plain = torch.autograd.grad(plain_logprobs(hidden, weight, bias, targets, temperature) @ cotangent, inputs)
        for a, b in zip(fused, plain):
            torch.testing.assert_close(a, b)


def test_half_precision_logits_are_scored_in_float32():
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(3, 4, generator=g).bfloat16(), torch.randn(9, 4, generator=g).bfloat16()
    targets = torch.tensor([0, 4, 8])
    out = head_logprobs(hidden, weight, None, targets, 0.7)
    assert out.dtype == torch.float32
    logits = torch.nn.functional.linear(hidden, weight).float() / 0.7      # the bf16 product, softmax in float32
    torch.testing.assert_close(out, torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1))


def test_a_second_backward_through_the_same_graph_is_refused():
    hidden = torch.randn(3, 4, requires_grad=True)
    out = head_logprobs(hidden, torch.randn(9, 4), None, torch.tensor([1, 2, 3]), 1.0).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        out.backward()


def test_bad_shapes_and_temperature_are_refused():
    with pytest.raises(ValueError, match="targets"):
        head_logprobs(torch.randn(3, 4), torch.randn(9, 4), None, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="temperature"):
        head_logprobs(torch.randn(3, 4), torch.randn(9, 4), None, torch.tensor([1, 2, 3]), -1.0)


@pytest.fixture()
def policy(one_torch_thread):
    model, tokenizer = tiny_model(seed=0)          # a plain model with tied embeddings: every weight trains
    return HFPolicy(model, tokenizer)


def scored(policy, prompts, completions, fused):
    """Log-probs and every weight's gradient, through the fused head or the model's own logits."""
    if not fused:
        policy.plain_output_layer = lambda: None
    try:
        policy.model.zero_grad(set_to_none=True)
        logp, mask = policy.token_logprobs(prompts, completions, temperature=0.7)
        (logp.sum(-1) * torch.arange(1.0, len(prompts) + 1)).sum().backward()
    finally:
        policy.__dict__.pop("plain_output_layer", None)
    return logp.detach(), mask, {n: p.grad.clone() for n, p in policy.model.named_parameters()}


@pytest.mark.parametrize("shared", [True, False], ids=["shared-prompt", "one-forward"])
def test_scoring_matches_the_models_logits_with_gradients(policy, shared):
    short, long = (policy.encode(c) for c in CONVERSATIONS)
    prompts = [short, short, long, long] if shared else [short, long, short[1:], long[1:]]
    completions = [[18, 19, 20, 21], [22], [23, 24], []]
    assert policy.plain_output_layer() is policy.model.lm_head
    fused, mask, fused_grads = scored(policy, prompts, completions, fused=True)
    plain, plain_mask, plain_grads = scored(policy, prompts, completions, fused=False)
    assert mask.tolist() == plain_mask.tolist() and mask.sum(-1).tolist() == [4, 1, 2, 0]
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-5)
    assert fused_grads.keys() == plain_grads.keys()
    for name in plain_grads:
        # The two paths sum the same products in other orders (and other thread counts split them otherwise), so
        # they agree within float32 rounding, which scales with the tensor's largest gradient, not with each
        # element: a tied embedding's small elements carry the rounding of its large ones. Measured against a
        # float64 copy of the model, on 1 and 2 threads, both paths: every element within 102 * u * max|g| of
        # the float64 gradient (u = 2**-24, float32's unit roundoff; worst: the norm weights, summed over every
        # token), fused and plain within 77 of each other. Two paths each within 102 differ by at most 204 of those
        # units: the bound is 256 of them.
        bound = GRADIENT_ROUNDING_UNITS * 2.0**-24 * plain_grads[name].abs().max().item()
        torch.testing.assert_close(fused_grads[name], plain_grads[name], rtol=0, atol=bound, msg=name)


def test_the_shared_prompt_path_looks_up_embeddings_once(policy):
    """The prompt forward and the completion forward share one embedding lookup, so the tied embedding matrix
    gets one dense gradient per scoring call, not one per forward."""
    short = policy.encode(CONVERSATIONS[0])
    lookups = []
    handle = policy.model.get_input_embeddings().register_forward_hook(lambda m, args, out: lookups.append(out.shape))
    try:
        policy.token_logprobs([short, short], [[18, 19], [20, 21, 22]])
    finally:
        handle.remove()
    assert len(lookups) == 1 and lookups[0][0] == len(short) + 2 * 2   # the prompt once, 2 rows x (width - 1)


@pytest.mark.parametrize("field,value", [("final_logit_softcapping", 30.0), ("logit_scale", 0.5)])
def test_models_that_transform_their_logits_score_through_their_own_forward(policy, field, value):
    setattr(policy.model.config, field, value)
    assert policy.plain_output_layer() is None
    policy.lockstep = True
    setattr(policy.model.config, field, None)
    assert policy.plain_output_layer() is None       # sharded weights: the forward gathers them
