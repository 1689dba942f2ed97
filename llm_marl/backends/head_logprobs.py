"""Log-probs of chosen tokens straight from hidden states: the output layer, softmax and gather as one autograd node.

The plain way — ``logits = head(hidden)``, ``logits / T``, ``log_softmax``/``logsumexp``, ``gather`` — leaves
autograd holding several ``[tokens, vocab]`` tensors and makes its backward write a few more (the softmax,
the scattered one-hot, their sum). With SmolLM2's 49k-word vocabulary that is ~200 KB per token for each.
:func:`head_logprobs` keeps ONE such buffer: the scaled logits, which its backward turns in place into the
gradient ``(onehot(y) - softmax(z)) * g / T`` before the two matrix products back to the hidden states and
the weight. The values equal the plain computation's (same products, same order of scaling).
"""
from __future__ import annotations

import torch


class _HeadLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float) -> torch.Tensor:
        logits = torch.nn.functional.linear(hidden, weight, bias)
        if logits.dtype in (torch.float16, torch.bfloat16):      # under autocast: score in float32
            logits = logits.float()
        if temperature > 0:
            logits.div_(temperature)
        lse = torch.logsumexp(logits, dim=-1)
        chosen = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(hidden, weight, targets, lse)
            ctx.buffer = logits                # overwritten by backward: not saved through save_for_backward
            ctx.scale = 1.0 / temperature if temperature > 0 else 1.0
            ctx.has_bias = bias is not None
            ctx.bias_dtype = bias.dtype if bias is not None else None
        return chosen

    @staticmethod
    def backward(ctx, grad_chosen: torch.Tensor):
        hidden, weight, targets, lse = ctx.saved_tensors
        grad = ctx.buffer
        if grad is None:
            raise RuntimeError("head_logprobs: backward ran twice through the same graph (its buffer is consumed by "
                               "the first backward; recompute the log-probs instead of retain_graph=True)")
        ctx.buffer = None
        scaled = grad_chosen.to(grad.dtype) * ctx.scale                    # d/dlogits of log_softmax(z / T)[y]
        grad.sub_(lse[:, None]).exp_().mul_(-scaled[:, None])              # -softmax(z) * g / T
        grad.scatter_add_(-1, targets[:, None], scaled[:, None])           # + onehot(y) * g / T
        grad_hidden = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_hidden = (grad @ weight.to(grad.dtype)).to(hidden.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = (grad.t() @ hidden.to(grad.dtype)).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0).to(ctx.bias_dtype)
        return grad_hidden, grad_weight, grad_bias, None, None


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                  temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(linear(hidden, weight, bias) / T)[i, targets[i]]`` per row, ``[N]`` (float32 for half inputs).

    ``hidden`` is ``[N, d]``, ``weight`` ``[V, d]`` (an output layer's), ``targets`` ``[N]`` token ids;
    ``temperature`` 0 means unscaled. Differentiable in ``hidden``, ``weight`` and ``bias`` with one
    ``[N, V]`` buffer alive (see the module docstring); its backward may run once.
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"head_logprobs needs hidden [N, d] and targets [N]; got {tuple(hidden.shape)} and "
                         f"{tuple(targets.shape)}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0: unscaled), got {temperature}")
    return _HeadLogProbs.apply(hidden, weight, bias, targets, float(temperature))


__all__ = ["head_logprobs"]
