"""`AdapterRows`: mixed-adapter LoRA forwards in which every adapter of a layer runs in two matrix products.

PEFT runs a batch that mixes adapters (``adapter_names=[...]``) by registering a pre-forward hook on
every LoRA layer at every forward call; each layer then rebuilds, from the Python list of names,
the rows of each adapter, gathers them with a list index, runs that adapter's ``A`` and ``B`` on
them and scatters the result back. In a decode loop that is, per generated token, ~200 layers x
(hooks + list scans + 2 gathers + 2 scatters + 2 small products per adapter): at 16 rows it doubled
the cost of a decode step of SmolLM2-135M.

Here, while :meth:`AdapterRows.rows` is active, each LoRA layer stacks its adapters (the multi-LoRA
batching of Punica and S-LoRA): ``A`` holds every adapter's ``A`` one above the other
(``[sum of ranks, in]``) and ``B`` every adapter's ``B * scaling`` side by side (``[out, sum of
ranks]``), built once per :meth:`rows` call. A row's LoRA output is then
``((x @ A.T) * mask[row]) @ B.T``, where ``mask[row]`` is 1 on the columns of the row's adapter and 0
elsewhere (all 0 for the base): two products and one multiply per layer for the whole batch,
whatever the adapters. The second product is accumulated into the base layer's output
(``addmm_``) instead of making a fresh ``[tokens, out]`` tensor to add: in a 64-row prefill of
SmolLM2-135M (6208 tokens) that tensor is 38 MB per MLP layer, and allocating it costs more than its
FLOPs. The result is PEFT's ``base(x) + B_a(A_a(x)) * scaling_a`` summed in another
order, so it equals PEFT's output within float rounding, not bit for bit.

PEFT still owns the adapters and their weights; layers it would run through a variant (DoRA and the
like), merged layers, or active LoRA dropout (training mode) make :meth:`AdapterRows.supports` false,
and the caller keeps PEFT's own path.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

BASE_ADAPTER = "__base__"   # PEFT's name for "no adapter" inside a mixed-adapter batch


class AdapterRows:
    """Installs, for the duration of :meth:`rows`, a stacked mixed-adapter forward on every LoRA linear layer."""

    def __init__(self, model) -> None:
        from peft.tuners.lora.layer import Linear as LoraLinear
        from peft.tuners.lora.layer import LoraLayer

        lora = [m for m in model.modules() if isinstance(m, LoraLayer)]
        self.layers = [m for m in lora if type(m) is LoraLinear]
        self._all_linear = len(self.layers) == len(lora)
        self.adapters: list[str | None] = []
        self._device = torch.device("cpu")
        self._masks: dict[tuple, torch.Tensor] = {}

    def supports(self) -> bool:
        """Whether every LoRA layer is a plain linear one, unmerged, with vanilla adapters and no active dropout."""
        def dropout_off(layer) -> bool:
            return all(isinstance(d, torch.nn.Identity) or not d.training or not getattr(d, "p", 0)
                       for d in layer.lora_dropout.values())

        return self._all_linear and all(not layer.merged and not layer.lora_variant and dropout_off(layer)
                                        for layer in self.layers)

    def set_rows(self, adapters: Sequence[str | None], device: torch.device) -> None:
        """Row ``i`` of the next forwards runs under ``adapters[i]`` (``None`` or ``BASE_ADAPTER``: the base)."""
        self.adapters = [None if a == BASE_ADAPTER else a for a in adapters]
        self._device = torch.device(device)
        self._masks = {}

    def mask(self, layout: tuple[tuple[str, int], ...], dtype: torch.dtype) -> torch.Tensor:
        """``[rows, sum of ranks]``: 1 where a column belongs to the row's adapter.

        ``layout`` is the stacked adapters and their ranks.
        """
        key = (layout, dtype)
        mask = self._masks.get(key)
        if mask is None:
            columns, start = {}, 0
            for name, rank in layout:
                columns[name] = (start, start + rank)
                start += rank
            mask = torch.zeros((len(self.adapters), start), dtype=dtype)
            for row, adapter in enumerate(self.adapters):
                if adapter in columns:
                    mask[row, slice(*columns[adapter])] = 1
            mask = self._masks[key] = mask.to(self._device)
        return mask

    @contextlib.contextmanager
    def rows(self, adapters: Sequence[str | None], device: torch.device):
        """Context in which forwards of the model run row ``i`` under ``adapters[i]`` (changed by :meth:`set_rows`).

        The adapters' weights are stacked on entry: change no weight inside the context.
        """
        self.set_rows(adapters, device)
        for layer in self.layers:
            layer.forward = _StackedForward(layer, self)      # an instance attribute shadows the class's forward
        try:
            yield self
        finally:
            for layer in self.layers:
                del layer.forward
            self.adapters, self._masks = [], {}


class _StackedForward:
    """One layer's mixed-adapter forward: ``base(x) + ((x @ A.T) * mask) @ B.T`` over its stacked adapters."""

    def __init__(self, layer, owner: AdapterRows) -> None:
        self.layer, self.owner = layer, owner
        names = list(layer.lora_A)
        with torch.no_grad():
            self.a = torch.cat([layer.lora_A[n].weight for n in names], dim=0) if names else None
            self.b = torch.cat([layer.lora_B[n].weight * layer.scaling[n] for n in names], dim=1) if names else None
        self.layout = tuple((n, layer.lora_A[n].weight.shape[0]) for n in names)

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        layer = self.layer
        result = layer.base_layer(x, *args, **kwargs)
        if layer.disable_adapters or self.a is None:
            return result
        mask = self.owner.mask(self.layout, self.a.dtype)
        if x.dim() == 3:
            mask = mask[:, None, :]
        hidden = torch.nn.functional.linear(x.to(self.a.dtype), self.a).mul_(mask)
        if result.dtype == self.b.dtype and result.is_contiguous():
            # accumulate in place: a fresh [tokens, out] product costs more in page faults than in FLOPs
            result.view(-1, result.shape[-1]).addmm_(hidden.view(-1, hidden.shape[-1]), self.b.t())
            return result
        return result.add_(torch.nn.functional.linear(hidden, self.b).to(result.dtype))
