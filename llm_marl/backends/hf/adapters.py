"""`AdapterAccess`: the LoRA adapters of an :class:`~llm_marl.backends.hf.HFPolicy`'s model, their weights and
checkpoint tensors, and forwards whose batch rows run under different adapters; :func:`rename_adapter` gives one
adapter's tensors another adapter's names."""
from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ...sharding import full_tensor, shard_like
from ..lora_rows import BASE_ADAPTER, AdapterRows
from .weights import check_state_fits


class AdapterAccess:
    """Adapter methods of :class:`~llm_marl.backends.hf.HFPolicy` (a mixin: the policy holds ``model``, ``name``,
    ``device`` and ``grouped_lora``)."""

    model: Any
    name: str
    grouped_lora: bool

    @property
    def is_peft(self) -> bool:
        """Whether the model is a PEFT model (carries named adapters)."""
        return hasattr(self.model, "peft_config")

    @property
    def adapter_names(self) -> list[str]:
        """Names of the LoRA adapters on this model (empty for a plain model)."""
        return list(self.model.peft_config) if self.is_peft else []

    def _check_adapter(self, adapter: str | None) -> None:
        if adapter is not None and adapter not in self.adapter_names:
            raise ValueError(f"unknown adapter {adapter!r} for policy {self.name!r}; adapters: {self.adapter_names} "
                             f"(None = the base model)")

    @contextlib.contextmanager
    def using(self, adapter: str | None):
        """Context in which forward passes use ``adapter`` only (``None``: the base, adapters disabled)."""
        self._check_adapter(adapter)
        if not self.is_peft:
            yield
        elif adapter is None:
            with self.model.disable_adapter():
                yield
        else:
            self.model.set_adapter(adapter)   # also makes exactly this adapter trainable
            yield

    def trainable_parameters(self, adapter: str | None) -> list[torch.nn.Parameter]:
        """The parameters an update of ``adapter`` changes (its LoRA weights; all weights of a plain model)."""
        self._check_adapter(adapter)
        if adapter is None:
            if self.is_peft:
                raise ValueError(
                    f"policy {self.name!r} is a LoRA model: name the adapter to train ({self.adapter_names})"
                )
            return [p for p in self.model.parameters()]
        return [p for n, p in self.model.named_parameters() if f".{adapter}." in n]

    def trainable_state_dict(self, adapter: str | None, whole: bool = True) -> dict[str, torch.Tensor]:
        """Tensors a checkpoint must hold for ``adapter`` (or the whole plain model), as copies.

        Sharded weights (FSDP) are gathered whole, a collective that every process must join;
        ``whole=False`` leaves them as this process's shards, uncopied (for callers that gather
        themselves, see ``DistributedTraining.checkpoint_tensors``).
        """
        def take(t: torch.Tensor) -> torch.Tensor:
            if isinstance(t, DTensor) and not whole:
                return t.detach()
            # a contiguous copy: tied weights must not share memory in a file, and safetensors takes no strides
            return full_tensor(t.detach()).clone(memory_format=torch.contiguous_format)

        if adapter is None:
            return {k: take(v) for k, v in self.model.state_dict().items()}
        self._check_adapter(adapter)
        return {n: take(p) for n, p in self.model.named_parameters() if f".{adapter}." in n}

    def copy_adapter(self, source: str, target: str) -> None:
        """Give adapter ``target`` the weights of adapter ``source`` (both on this model, same LoRA shape)."""
        self.load_trainable_state_dict(target, rename_adapter(self.trainable_state_dict(source), source, target))

    def load_trainable_state_dict(self, adapter: str | None, state: dict[str, torch.Tensor]) -> None:
        """Inverse of :meth:`trainable_state_dict` (each process keeps its shard of sharded weights).

        Tensors that this model lacks, lacks room for (another shape) or that are missing raise ``ValueError``
        naming the tensor and both shapes, before anything is copied.
        """
        if adapter is None:
            current = self.model.state_dict()
            check_state_fits(state, {k: v.shape for k, v in current.items()}, f"model {self.name!r}")
            self.model.load_state_dict({k: shard_like(v, current[k]) if k in current else v for k, v in state.items()})
            return
        self._check_adapter(adapter)
        params = dict(self.model.named_parameters())
        check_state_fits(state, {n: p.shape for n, p in params.items() if f".{adapter}." in n},
                         f"adapter {adapter!r} of model {self.name!r}")
        with torch.no_grad():
            for n, value in state.items():
                params[n].copy_(shard_like(value, params[n]))

    def peft_state_dict(self, adapter: str, state: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """``adapter``'s tensors under PEFT's saved names (``adapter_model.safetensors``: the adapter name removed).

        ``state``: the adapter's tensors as :meth:`trainable_state_dict` names them (e.g. gathered whole
        from shards); default: :meth:`trainable_state_dict` of ``adapter``.
        """
        state = self.trainable_state_dict(adapter) if state is None else state
        names = self._peft_names(adapter)
        missing = sorted(set(names.values()) - set(state))
        if missing:
            raise ValueError(f"the state of adapter {adapter!r} lacks {len(missing)} of its tensors, e.g. {missing[0]}")
        return {saved: state[name] for saved, name in names.items()}

    def load_peft_state_dict(self, adapter: str, state: Mapping[str, torch.Tensor]) -> None:
        """Inverse of :meth:`peft_state_dict`: load tensors saved under PEFT's names into ``adapter``
        (a ``ValueError`` names missing, foreign or misshapen tensors, before anything is copied)."""
        names = self._peft_names(adapter)
        self.load_trainable_state_dict(adapter, {names.get(saved, saved): value for saved, value in state.items()})

    def _peft_names(self, adapter: str) -> dict[str, str]:
        """``{PEFT's saved name: parameter name}`` of ``adapter``'s tensors, as PEFT's own
        ``get_peft_model_state_dict`` names them."""
        from peft import get_peft_model_state_dict

        self._check_adapter(adapter)
        if adapter is None:
            raise ValueError(f"policy {self.name!r} has no adapter None: a PEFT state names one adapter "
                             f"({self.adapter_names})")
        params = {n: p for n, p in self.model.named_parameters() if f".{adapter}." in n}
        saved = get_peft_model_state_dict(self.model, state_dict=params, adapter_name=adapter,
                                          save_embedding_layers=False)
        by_tensor = {id(p): n for n, p in params.items()}
        names = {key: by_tensor[id(value)] for key, value in saved.items() if id(value) in by_tensor}
        if len(names) != len(params) or len(set(names.values())) != len(params):
            raise ValueError(f"PEFT saves {len(names)} tensors of adapter {adapter!r}, which has {len(params)} "
                             f"trainable tensors: this adapter type is not supported")
        return names

    def _adapter_kwargs(self, adapters: Sequence[str | None]) -> dict[str, Any]:
        """``adapter_names=`` of a mixed-adapter batch (PEFT models only)."""
        return {"adapter_names": [BASE_ADAPTER if a is None else a for a in adapters]} if self.is_peft else {}

    @contextlib.contextmanager
    def _mixed_batch(self):
        """Context yielding ``select(adapters) -> forward kwargs``, called before each forward of a mixed-adapter batch.

        With ``grouped_lora`` (and adapters :class:`AdapterRows` covers) ``select`` regroups the rows and the kwargs
        are empty; otherwise they are PEFT's ``adapter_names=``.
        """
        rows = AdapterRows(self.model) if self.is_peft and self.grouped_lora else None
        if rows is None or not rows.supports():
            yield self._adapter_kwargs
            return
        device = self.device
        with rows.rows([], device):
            def select(adapters: Sequence[str | None]) -> dict[str, Any]:
                rows.set_rows(adapters, device)
                return {}
            yield select


def rename_adapter(state: dict[str, Any], source: str, target: str) -> dict[str, Any]:
    """Adapter ``source``'s tensors (as ``trainable_state_dict`` names them) renamed for adapter ``target``.

    PEFT names a LoRA tensor ``...<module>.lora_A.<adapter>.weight``; a state with a name that does not hold
    ``.<source>.`` (or an empty one) is a ``ValueError``.
    """
    renamed = {name.replace(f".{source}.", f".{target}."): value for name, value in state.items()}
    if not state or len(renamed) != len(state) or any(f".{source}." not in name for name in state):
        raise ValueError(f"the state does not look like adapter {source!r}'s tensors; got names such as "
                         f"{list(state)[:2]}")
    return renamed
