"""Whole tensors from sharded ones and back: what checkpoints and fingerprints of an FSDP2-sharded team need.

Under FSDP2 sharding (the trainers' ``fsdp`` option) parameters, gradients and AdamW states are
``DTensor``s of which each process holds one shard. Checkpoints store whole tensors, the same
files an unsharded run writes, so a run may be resumed with or without sharding and on another
number of processes. Gathering is a collective: every process calls these functions in the
same order. Without sharding they return their input.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, distribute_tensor


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a ``DTensor`` (a collective), any other tensor as it is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_state(state: Any, keep: bool = True) -> Any:
    """``state`` (nested dicts, lists and tuples) with every ``DTensor`` replaced by its whole tensor.

    ``keep=False``: take part in the gathering (a process that will not write) but drop each whole
    tensor at once, so only one is held at a time; returns ``None``.
    """
    if isinstance(state, DTensor):
        whole = state.full_tensor()
        return whole if keep else None
    if isinstance(state, dict):
        gathered = {k: full_state(v, keep) for k, v in state.items()}
    elif isinstance(state, (list, tuple)):
        gathered = type(state)(full_state(v, keep) for v in state)
    else:
        gathered = state
    return gathered if keep else None


def shard_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value``, a whole tensor every process holds, laid out like ``like``: this process's shard when ``like`` is a
    ``DTensor`` (cut locally, no communication), else ``value`` itself."""
    if not isinstance(like, DTensor):
        return value
    return distribute_tensor(value.to(like.device, like.dtype), like.device_mesh, like.placements, src_data_rank=None)


def shard_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict of whole tensors (see :func:`full_state`) cut like ``optimizer``'s parameters.

    Per-parameter tensors shaped like their parameter (AdamW's moments) become its shards;
    scalars such as ``step`` stay as they are.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not any(isinstance(p, DTensor) for p in params):
        return state
    per_param = {}
    for index, values in state["state"].items():
        param = params[int(index)]
        per_param[index] = {k: shard_like(v, param) if torch.is_tensor(v) and v.shape == param.shape else v
                            for k, v in values.items()}
    return {**state, "state": per_param}


__all__ = ["full_tensor", "full_state", "shard_like", "shard_optimizer_state"]
