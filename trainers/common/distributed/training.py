"""`DistributedTraining`: what a trainer runs over one ``Accelerator`` (see :mod:`trainers.common.distributed`).

Tasks sharded per process, gradients summed per agent in flat buckets, metrics merged, RNG states
gathered, and under FSDP2 the team sharded and gathered for rollouts and checkpoints.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, broadcast, gather_object, reduce
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from llm_marl.backends.hf import HFPolicy, set_weight_layout
from llm_marl.sharding import full_state, full_tensor
from llm_marl.team import Team

from ..checkpoint import rng_state, training_tensors
from ..config import TrainerConfig
from .memory import release_free_memory

T = TypeVar("T")

SHARDING_ENGINES = (DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM)   # refused; FSDP2 is supported
BUCKET_NUMEL = 25_000_000     # gradients are all-reduced in flat buckets of at most this many elements


def build_accelerator(config: TrainerConfig, accelerator: Accelerator | None = None) -> Accelerator:
    """The trainer's ``Accelerator`` (or a check of the one given): the config's mixed precision, CPU when no GPU.

    The config decides the precision; ``accelerate launch`` passes ``no`` unless told otherwise, and a
    launch that asks for another precision than the config's is refused rather than silently ignored.
    """
    launched = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if launched != "no" and launched != config.mixed_precision:
        raise ValueError(f"accelerate was launched with --mixed_precision {launched} but the config says "
                         f"mixed_precision={config.mixed_precision!r}; set mixed_precision={launched!r} in the config "
                         f"or launch with --mixed_precision {config.mixed_precision}")
    if config.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise ValueError("mixed_precision='fp16' needs a CUDA GPU (fp16 autocast and loss scaling); "
                         "on a CPU use mixed_precision='bf16' or 'no'")
    if accelerator is None:
        # cpu=True on a GPU-less machine: without it accelerate leaves launched CPU processes unconnected.
        return Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=config.mixed_precision)
    if accelerator.mixed_precision != config.mixed_precision:
        raise ValueError(
            f"the accelerator given uses mixed_precision={accelerator.mixed_precision!r} but the config says "
            f"{config.mixed_precision!r}; make them agree"
        )
    return accelerator


class DistributedTraining:
    """Everything a trainer runs across processes, over one ``Accelerator`` (see the module docstring): task
    sharding, gradient all-reduce and optimizer steps, FSDP2 sharding of the team (and gathering it for rollouts),
    checkpoint gathering, RNG states and metric merging.

    With one process every operation is a no-op (or the identity), so single-process training runs
    the same code and the same arithmetic.
    """

    def __init__(self, accelerator: Accelerator, fsdp: bool = False) -> None:
        self.accelerator = accelerator
        if accelerator.distributed_type in SHARDING_ENGINES:
            raise ValueError(
                f"accelerate was launched with {accelerator.distributed_type.value}, whose engine owns one "
                f"optimizer per model and steps all of its parameters at once; these trainers step each "
                f"agent's optimizer on its own (trainers.common.distributed). Launch with --multi_gpu "
                f"(one replica per process), or shard with FSDP2: --use_fsdp --fsdp_version 2 "
                f"(examples/accelerate/fsdp2.yaml) or fsdp=True in the config"
            )
        if accelerator.distributed_type == DistributedType.FSDP:
            plugin = accelerator.state.fsdp_plugin
            if getattr(plugin, "fsdp_version", 1) != 2:
                raise ValueError("accelerate was launched with FSDP version 1; the trainers shard with FSDP2 "
                                 "(torch fully_shard, per-parameter sharding that keeps each agent's optimizer): "
                                 "launch with --fsdp_version 2 (examples/accelerate/fsdp2.yaml)")
            fsdp = True
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched != accelerator.num_processes:
            raise ValueError(
                f"{launched} processes were launched (WORLD_SIZE) but the accelerator joined "
                f"{accelerator.num_processes}; on a machine without GPUs build it with Accelerator(cpu=True) "
                f"(the trainers do when no accelerator is passed)"
            )
        if accelerator.gradient_accumulation_steps != 1:
            raise ValueError(
                f"the accelerator has gradient_accumulation_steps={accelerator.gradient_accumulation_steps}; "
                f"the trainers accumulate micro-batches themselves: build it with the default 1"
            )
        self.sharded = fsdp and accelerator.num_processes > 1   # one process holds everything: nothing to shard
        self._sharded_roots: list[torch.nn.Module] = []

    # ------------------------------------------------------------------ who am I
    @property
    def rank(self) -> int:
        """This process's index (0 = main)."""
        return self.accelerator.process_index

    @property
    def num_processes(self) -> int:
        """Processes taking part in training."""
        return self.accelerator.num_processes

    @property
    def is_main(self) -> bool:
        """Whether this process logs and writes checkpoints."""
        return self.accelerator.is_main_process

    @property
    def device(self) -> torch.device:
        """The device of this process (where its replica lives unless ``agent_devices`` says otherwise)."""
        return self.accelerator.device

    # ------------------------------------------------------------------ work split
    def shard(self, items: Sequence[T]) -> list[T]:
        """This process's contiguous share of a global list (see :func:`shard`)."""
        return shard(items, self.rank, self.num_processes)

    def gather(self, obj: T) -> list[T]:
        """``obj`` of every process, in process order, on every process."""
        if self.num_processes == 1:
            return [obj]
        return gather_object([obj])

    def unshard(self, local: Sequence[T]) -> list[T]:
        """Inverse of :meth:`shard`: the concatenation of every process's list, on every process."""
        return [item for part in self.gather(list(local)) for item in part]

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum of ``values`` over processes."""
        if self.num_processes == 1:
            return [float(v) for v in values]
        return reduce(torch.tensor(values, dtype=torch.float64, device=self.device), "sum").tolist()

    def sum_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise sum of a tensor over processes (same shape everywhere); differentiable inputs are detached."""
        if self.num_processes == 1:
            return tensor
        return reduce(tensor.detach().to(self.device), "sum").to(tensor.device)

    def max(self, value: int) -> int:
        """The largest ``value`` over processes."""
        if self.num_processes == 1:
            return int(value)
        return int(reduce(torch.tensor([value], dtype=torch.int64, device=self.device), "max").item())

    def barrier(self) -> None:
        """Wait until every process gets here."""
        self.accelerator.wait_for_everyone()

    def lockstep(self, count: int, most: int | None = None) -> int:
        """How many forward/backward passes to run when this process has ``count``: the most any process has when
        the weights are sharded (every pass is a collective then), ``count`` otherwise. ``most``: that maximum,
        when the caller already knows it (no communication then)."""
        if not self.sharded:
            return int(count)
        return int(most) if most is not None else self.max(count)

    # ------------------------------------------------------------------ FSDP2
    def shard_team(self, team: Team) -> None:
        """Wrap each trainable policy with FSDP2 (``fully_shard`` per decoder layer, then the whole model).

        Call after the replicas were made identical (each process keeps its 1/N of its own copy) and
        before optimizers are built (they must hold the sharded parameters).
        """
        if not self.sharded:
            return
        for policy in team.policies():
            if not isinstance(policy, HFPolicy):
                continue
            model = policy.model.get_base_model() if policy.is_peft else policy.model
            layer_types = set(getattr(model, "_no_split_modules", None) or ())
            layers = [m for m in model.modules() if type(m).__name__ in layer_types]
            if not layers:
                raise ValueError(f"cannot shard {type(model).__name__}: it names no decoder-layer class "
                                 f"(_no_split_modules); train it with fsdp=False")
            set_weight_layout(model, input_major=False)   # FSDP2 shards each weight along its dim 0
            for layer in layers:
                fully_shard(layer)
            fully_shard(model)
            for unit in [*layers, model]:     # per unit: a plain SUM over processes (losses use global counts)
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)   # gloo has no pre-multiplied sum
            policy.lockstep = True
            self._sharded_roots.append(model)

    @contextlib.contextmanager
    def full_weights(self):
        """Context with every sharded model's full weights on each process and forwards free of collectives.

        Sampling runs in it: processes may then make different numbers of forward calls (episodes end
        early, answers differ in length). Gathering is one collective, so every process must enter.
        Without sharding it does nothing.
        """
        if not self._sharded_roots:
            yield
            return
        units = [m for root in self._sharded_roots for m in root.modules() if isinstance(m, FSDPModule)]
        for root in self._sharded_roots:
            root.set_reshard_after_forward(False)
        for unit in units:                       # unshard() and reshard() act on one unit, not its children
            unit.unshard()
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()
            for root in self._sharded_roots:
                root.set_reshard_after_forward(True)
                root.set_reshard_after_forward(False, recurse=False)   # FSDP's default for the root
            if self.device.type == "cpu":
                release_free_memory()

    # ------------------------------------------------------------------ parameters and gradients
    def broadcast_parameters(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Copy the main process's values of ``params`` to every process (replicas start identical)."""
        params = [p for p in params if not isinstance(p, DTensor)]   # a sharded parameter has one copy, not replicas
        if self.num_processes == 1 or not params:
            return
        with torch.no_grad():
            for bucket in _buckets(params):
                flat = broadcast(torch.cat([p.detach().reshape(-1) for p in bucket]).to(self.device), from_process=0)
                for p, value in zip(bucket, _split(flat, bucket)):
                    p.copy_(value)

    def all_reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum the gradients of ``params`` over processes, in place.

        A process without a gradient for a parameter contributes zeros; a parameter no process has a
        gradient for keeps ``None`` (so AdamW skips it, exactly as in a single-process run).
        """
        params = [p for p in params if not isinstance(p, DTensor)]   # FSDP reduce-scattered those in backward
        if self.num_processes == 1 or not params:
            return
        present = self.sum_tensor(torch.tensor([float(p.grad is not None) for p in params], device=self.device))
        for bucket in _buckets(params):
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket])
            flat = reduce(flat.to(self.device), "sum")
            for p, value in zip(bucket, _split(flat, bucket)):
                p.grad = value.to(p.device)
        for p, count in zip(params, present.tolist()):
            if count == 0:
                p.grad = None

    def optimizer_step(self, steps: Sequence[tuple[torch.optim.Optimizer, Sequence[torch.nn.Parameter]]],
                       max_grad_norm: float | None) -> list[float]:
        """All-reduce, unscale (fp16), clip and step each ``(optimizer, its parameters)``; returns gradient norms.

        Every process must call this with the same optimizers in the same order. An optimizer none of
        whose parameters got a gradient on any process gets a plain ``step()`` (norm 0.0), which skips
        parameters without gradients — a no-op, as in one process (and no loss-scaler bookkeeping).
        """
        scaler = self.accelerator.scaler
        norms = []
        for optimizer, params in steps:
            params = list(params)
            self.all_reduce_gradients(params)
            grads = [p for p in params if p.grad is not None]
            if not grads:
                optimizer.step()
                norms.append(0.0)
                continue
            if scaler is not None:
                scaler.unscale_(optimizer)
            norms.append(clip_gradients([p.grad for p in grads], max_grad_norm))
            if scaler is not None:
                scaler.step(optimizer)
            else:
                optimizer.step()
        if scaler is not None:
            scaler.update()
        if self.sharded and self.device.type == "cpu":
            release_free_memory()
        return norms

    def fingerprint(self, tensors: Iterable[torch.Tensor]) -> str:
        """SHA-256 of the tensors' bytes (equal on every process iff the replicas hold identical weights)."""
        digest = hashlib.sha256()
        for tensor in tensors:
            tensor = full_tensor(tensor)
            digest.update(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    # ------------------------------------------------------------------ logging and checkpoints
    def merge_metrics(
        self, metrics: Mapping[str, Any], sums: Sequence[str] = (), maxima: Sequence[str] = ()
    ) -> dict[str, Any]:
        """One metrics dict for the whole step, identical on every process.

        Keys ending in one of ``sums`` are summed over processes (partial losses normalised by global
        counts, throughputs), keys ending in ``maxima`` take the maximum (wall times), every other
        number is the mean over the processes that report it; non-numbers come from the main process.
        """
        if self.num_processes == 1:
            return dict(metrics)
        return merge_reports(self.gather(dict(metrics)), sums, maxima)

    def rng_states(self) -> list[dict[str, Any]]:
        """Every process's RNG states, in process order (what a checkpoint needs to resume each one)."""
        return self.gather(rng_state())

    def checkpoint_tensors(self, team: Team, optimizers: Mapping[str, torch.optim.Optimizer],
                           extra: Mapping[str, Any] | None = None) -> tuple[dict, dict, dict] | None:
        """``(weights, optimizer states, extra)`` with whole tensors, on the main process (the others get ``None``).

        Weights are every agent's trainable state dict, optimizer states every optimizer's state dict;
        ``extra`` is any other state (e.g. a critic's), gathered the same way. Every process must call
        it: sharded tensors are gathered one at a time, and a process that does not write drops each
        one at once, so it never holds the whole team.
        """
        if not (self.sharded or self.is_main):
            return None
        weights, states = training_tensors(team, optimizers, whole=False)
        return full_state((weights, states, dict(extra or {})), keep=self.is_main)


def clip_gradients(grads: Sequence[torch.Tensor], max_norm: float | None) -> float:
    """Scale ``grads`` in place so their global L2 norm is at most ``max_norm`` (if given); returns the norm before.

    As ``torch.nn.utils.clip_grad_norm_``, but the gradients may mix sharded ``DTensor``s (whose norm
    is over the whole tensors) and plain tensors (e.g. MAPPO's critic adapter and value head).
    """
    squares = 0.0
    for group in ([g for g in grads if isinstance(g, DTensor)], [g for g in grads if not isinstance(g, DTensor)]):
        if group:
            squares += float(full_tensor(torch.nn.utils.get_total_norm(group))) ** 2
    norm = squares ** 0.5
    scale = 1.0 if max_norm is None else max_norm / (norm + 1e-6)
    if scale < 1.0:
        for g in grads:
            g.mul_(scale)
    return norm


def shard(items: Sequence[T], rank: int, num_processes: int) -> list[T]:
    """Process ``rank``'s contiguous share of ``items``: sizes differ by at most one (the first ``len % N`` get one
    more), and the shares of processes ``0 .. N-1`` concatenated are ``items``."""
    if not 0 <= rank < num_processes:
        raise ValueError(f"rank must be in [0, {num_processes}), got {rank}")
    size, extra = divmod(len(items), num_processes)
    start = rank * size + min(rank, extra)
    return list(items[start:start + size + (rank < extra)])


def merge_reports(
    reports: Sequence[Mapping[str, Any]], sums: Sequence[str] = (), maxima: Sequence[str] = ()
) -> dict[str, Any]:
    """Merge per-process metric dicts (see :meth:`DistributedTraining.merge_metrics`)."""
    merged: dict[str, Any] = {}
    for key in dict.fromkeys(k for report in reports for k in report):
        values = [r[key] for r in reports if key in r]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            merged[key] = values[0]
        elif key.endswith(tuple(sums)):
            merged[key] = float(sum(values))
        elif key.endswith(tuple(maxima)):
            merged[key] = float(max(values))
        else:
            merged[key] = float(sum(values) / len(values))
    return merged


def _buckets(params: Sequence[torch.Tensor], limit: int = BUCKET_NUMEL) -> list[list[torch.Tensor]]:
    """Consecutive groups of same-dtype tensors holding at most ``limit`` elements each (one tensor may exceed it)."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for p in params:
        if buckets and buckets[-1][0].dtype == p.dtype and size + p.numel() <= limit:
            buckets[-1].append(p)
            size += p.numel()
        else:
            buckets.append([p])
            size = p.numel()
    return buckets


def _split(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flat`` shaped like each tensor of ``like``, in order."""
    return [chunk.view_as(t) for chunk, t in zip(torch.split(flat, [t.numel() for t in like]), like)]
