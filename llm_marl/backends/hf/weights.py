"""The model's weights as the CPU reads them fastest, and how a policy notices that they changed.

:func:`set_weight_layout` stores linear weights input-major, :func:`contiguous_head_input` keeps the
output layer's input contiguous, :class:`OptimizerSteps` counts optimizer steps (a weight change that
fused optimizers do not show in tensor versions), and :func:`check_state_fits` checks a state dict
against the model before anything is loaded.
"""
from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_post_hook


class OptimizerSteps:
    """Counts optimizer steps taken in this process (any torch optimizer) once :meth:`start` hooked them."""

    count = 0
    hook = None

    @classmethod
    def start(cls) -> None:
        """Hook every torch optimizer's step (once per process)."""
        if cls.hook is None:
            cls.hook = register_optimizer_step_post_hook(cls._step)

    @classmethod
    def _step(cls, optimizer, args, kwargs) -> None:
        cls.count += 1


def weights_version(model) -> tuple[int, int]:
    """A value that changes whenever a weight of ``model`` may have: optimizer steps and in-place writes.

    In-place writes (a load, ``copy_``) bump a tensor's ``_version``; fused optimizers do not, so any
    optimizer step in the process counts as a change too (:meth:`OptimizerSteps.start` must have run).
    """
    return OptimizerSteps.count, sum(p._version for p in model.parameters())


def set_weight_layout(model, input_major: bool) -> int:
    """Store the weights of ``model``'s linear layers input-major (``input_major=True``) or row-major; returns
    how many weights moved.

    A weight keeps its ``[out, in]`` shape and values; input-major, its memory is that of the contiguous
    ``[in, out]`` transpose, so ``linear(x, w) = x @ w.T`` is a plain product of two row-major matrices.
    MKL's float32 product with a transposed right operand is slower at few rows (decode steps, small
    training batches) and as fast at thousands of rows, forward and backward (the Performance page has the
    figures). Only float32 weights on the CPU move (bfloat16's head product is slower input-major);
    LoRA adapters stay as they are (small, and stacked by :class:`~llm_marl.backends.lora_rows.AdapterRows`).
    A tied embedding moves with its output layer (one tensor); each looked-up row is then a strided
    gather, which prefill and the loss forward pay, and which the head's gain at few rows outweighs.
    Idempotent; ``input_major=False`` restores contiguous weights (FSDP2 shards along dim 0 before training).
    """
    moved = 0
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if (not isinstance(module, torch.nn.Linear) or "lora_" in name or not isinstance(weight, torch.nn.Parameter)
                or isinstance(weight, DTensor) or weight.dim() != 2):
            continue
        if input_major and (weight.device.type != "cpu" or weight.dtype != torch.float32):
            continue
        already = weight.t().is_contiguous() if input_major else weight.is_contiguous()
        if already:
            continue
        with torch.no_grad():
            weight.data = weight.data.t().contiguous().t() if input_major else weight.data.contiguous()
        moved += 1
    return moved


def contiguous_head_input(model) -> None:
    """Make the output layer's input contiguous (once per model; idempotent).

    ``logits_to_keep=1`` hands the head ``hidden[:, -1:, :]``, a strided ``[B, 1, d]`` view; torch's
    ``linear`` does not fold that into one matrix product but runs a batched product against the weight
    expanded ``B`` times, many times slower than one product of the same rows copied contiguous first (a
    150 KB copy at 64 rows of SmolLM2-135M). Every prefill pays it.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "_llm_marl_contiguous_input", False):
        return
    head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]) if args else None)
    head._llm_marl_contiguous_input = True


def check_state_fits(state: dict[str, torch.Tensor], expected: dict[str, torch.Size], target: str) -> None:
    """``ValueError`` unless ``state`` has exactly the tensors of ``expected`` with their shapes (``target`` names
    what is loaded into)."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [(k, tuple(state[k].shape), tuple(expected[k])) for k in expected if k in state
             and tuple(state[k].shape) != tuple(expected[k])]
    if wrong:
        name, saved, wanted = wrong[0]
        raise ValueError(f"{len(wrong)} saved tensor(s) do not fit {target}: e.g. {name} is {saved} in the checkpoint "
                         f"but {wanted} in the model (was it trained on another model?)")
    if missing or unexpected:
        detail = "; ".join(f"{what} {len(keys)}, e.g. {keys[0]}" for what, keys in
                           (("missing", missing), ("not in the model", unexpected)) if keys)
        raise ValueError(f"saved tensors do not match {target}: {detail} (was it trained on another model or "
                         f"with other LoRA settings?)")
