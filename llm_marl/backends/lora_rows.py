"""`AdapterRows`: mixed-adapter LoRA forwards whose per-adapter row groups are built once per batch.

PEFT runs a batch that mixes adapters (``adapter_names=[...]``) by registering a pre-forward hook on
every LoRA layer at every forward call, and each layer then rebuilds, from the Python list of names,
the list of rows of each adapter, gathers those rows with a list index and scatters the LoRA output
back with another. In a decode loop that is ~200 layers x (hooks + list scans + index conversions)
per generated token, whatever the batch size.

Here the groups are index tensors built once per batch (:meth:`AdapterRows.rows`), and each LoRA
layer computes what PEFT's ``_mixed_batch_forward`` computes for vanilla LoRA, in the same order
of operations: ``base(x)``, then for each adapter ``B(A(dropout(x[rows]))) * scaling`` added to
its rows. PEFT still owns the adapters and their weights; layers it would run through a variant
(DoRA and the like) or that are merged make :meth:`AdapterRows.supports` false, and the caller
keeps PEFT's own path.
"""
from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch

BASE_ADAPTER = "__base__"   # PEFT's name for "no adapter" inside a mixed-adapter batch


class AdapterRows:
    """Installs, for the duration of :meth:`rows`, a grouped mixed-adapter forward on every LoRA linear layer."""

    def __init__(self, model) -> None:
        from peft.tuners.lora.layer import LoraLayer
        from peft.tuners.lora.layer import Linear as LoraLinear

        lora = [m for m in model.modules() if isinstance(m, LoraLayer)]
        self.layers = [m for m in lora if type(m) is LoraLinear]
        self._all_linear = len(self.layers) == len(lora)
        self.groups: list[tuple[str, torch.Tensor | None]] = []

    def supports(self) -> bool:
        """Whether every LoRA layer is a plain linear one, unmerged, with vanilla adapters only (else use PEFT's path)."""
        return self._all_linear and all(not layer.merged and not layer.lora_variant for layer in self.layers)

    def set_rows(self, adapters: Sequence[str | None], device: torch.device) -> None:
        """Group the batch's rows by adapter (``None``: the base, no LoRA); a group holding every row has index ``None``."""
        rows: dict[str, list[int]] = {}
        for row, adapter in enumerate(adapters):
            if adapter is not None and adapter != BASE_ADAPTER:
                rows.setdefault(adapter, []).append(row)
        self.groups = [(name, None if len(index) == len(adapters) else torch.tensor(index, dtype=torch.long, device=device))
                       for name, index in rows.items()]

    @contextlib.contextmanager
    def rows(self, adapters: Sequence[str | None], device: torch.device):
        """Context in which forwards of the model run row ``i`` under ``adapters[i]`` (change them with :meth:`set_rows`)."""
        self.set_rows(adapters, device)
        for layer in self.layers:
            layer.forward = _GroupedForward(layer, self)      # an instance attribute shadows the class's forward
        try:
            yield self
        finally:
            for layer in self.layers:
                del layer.forward
            self.groups = []


class _GroupedForward:
    """PEFT's vanilla-LoRA ``_mixed_batch_forward`` for one layer, with the row groups of its :class:`AdapterRows`."""

    def __init__(self, layer, owner: AdapterRows) -> None:
        self.layer, self.owner = layer, owner

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        layer = self.layer
        result = layer.base_layer(x, *args, **kwargs)
        if layer.disable_adapters:
            return result
        dtype = result.dtype
        for name, index in self.owner.groups:
            if name not in layer.lora_A:
                continue
            lora_A, lora_B = layer.lora_A[name], layer.lora_B[name]
            sub = x if index is None else x.index_select(0, index)
            out = lora_B(lora_A(layer.lora_dropout[name](sub.to(lora_A.weight.dtype)))) * layer.scaling[name]
            if index is None:
                result += out.to(dtype)
            else:
                result.index_add_(0, index, out.to(dtype))
        return result
