"""Data-parallel training on accelerate: one full replica of the team per process, per-agent gradient all-reduce.

Launch any training script with accelerate (torchrun underneath); the trainers pick the process
group up from the environment — NCCL between GPUs, gloo between CPU processes::

    accelerate launch --multi_gpu --num_processes 4 train.py     # 4 GPUs (or 4 CPU processes on a CPU-only box)

How one training step is split over N processes (both trainers use this module):

1. **Tasks.** Every process draws the step's GLOBAL task list from the same seeded generator
   (MAGRPO: ``prompts_per_step`` tree roots; MAPPO: ``episodes_per_step`` episodes) and keeps its
   contiguous :meth:`DataParallel.shard`. N processes together do the one-process step, each with
   1/N of the rollouts; batch sizes in the configs are GLOBAL, so the learning dynamics do not
   depend on N. Sampling noise differs per process (torch seed + process index).
2. **Loss normalisation.** A process divides its partial loss by GLOBAL counts (samples or tokens
   summed over processes by one small all-reduce), so the sum over processes of the partial
   gradients is exactly the gradient of the whole-batch loss.
3. **Gradients.** After an agent's local backward passes, :meth:`DataParallel.optimizer_step` SUMS that
   agent's trainable gradients over processes (``accelerate.utils.reduce``), then clips and steps
   its optimizer. Every replica applies the same update to the same weights, so the replicas stay
   identical (the trainable weights are broadcast from the main process once, at start-up).
4. **Outputs.** Only the main process logs and writes checkpoints; a checkpoint carries every
   process's RNG state, so a run resumed under the same launch continues exactly.

Why an explicit all-reduce rather than wrapping the models in DDP:

- every agent has its own optimizer and steps at its own time (MAGRPO: once per turn per agent),
  and agents sharing one PEFT base train different adapters of the same module, toggled by
  ``set_adapter`` (which also flips ``requires_grad``, after DDP would have registered its hooks);
- the processes do UNEQUAL work: trees end early, zero-advantage samples are skipped, a MAPPO
  minibatch holds different agents on different processes. DDP reduces inside ``backward`` and
  hangs unless every process runs the same sequence of forward/backward calls. An all-reduce per
  optimizer step only needs the same sequence of optimizer steps, which both trainers guarantee
  (global turn count, global minibatches);
- the arithmetic is DDP's (a sum of gradients; DDP then divides by N, we divide the loss by the
  global count instead), at the cost of one flattened all-reduce per agent update.

Sharding (FSDP2, ``fsdp=True`` or an ``accelerate launch --use_fsdp --fsdp_version 2`` launch):
each policy's decoder layers and the model around them are wrapped with
torch's ``fully_shard``, so every process holds 1/N of the weights, gradients and AdamW states of
the team. What that changes, all of it in this module and the policy, none of it in the loop:

- **rollouts** run inside :meth:`DataParallel.full_weights`: the weights are gathered once (one
  collective on every process), sampling runs without collectives, so processes may generate
  different numbers of tokens, and the weights are freed after;
- **losses** run in lockstep: every process runs the same number of micro-batch forward/backward
  passes (:meth:`DataParallel.lockstep`; a process short of rows runs a zero-weighted one), each
  with the same forward calls (``HFPolicy.lockstep``), and FSDP reduce-scatters the gradients
  (summed, as here);
- **checkpoints** gather the full tensors on every process; the main process writes the same
  files as an unsharded run, and loading shards them again.

Each agent keeps its own optimizer over its own (sharded) parameters, so per-agent updates stay
exactly as without sharding. DeepSpeed (its engine owns one optimizer per model and steps all its
parameters at once) and FSDP1 are refused with an error naming the supported launches.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import socket
import sys
from typing import Any, Iterable, Mapping, Sequence, TypeVar

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, broadcast, gather_object, reduce
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from .checkpoint import rng_state, training_tensors
from .config import ScalingConfig, parse_device
from llm_marl.backends.hf import HFPolicy
from llm_marl.sharding import full_state, full_tensor
from llm_marl.team import Team

T = TypeVar("T")

SHARDING_ENGINES = (DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM)   # refused; FSDP2 is supported
BUCKET_NUMEL = 25_000_000     # gradients are all-reduced in flat buckets of at most this many elements


def build_accelerator(config: ScalingConfig, accelerator: Accelerator | None = None) -> Accelerator:
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
        raise ValueError(f"the accelerator given uses mixed_precision={accelerator.mixed_precision!r} but the config says "
                         f"{config.mixed_precision!r}; make them agree")
    return accelerator


class DataParallel:
    """The distributed operations a trainer needs, over one ``Accelerator`` (see the module docstring).

    With one process every operation is a no-op (or the identity), so single-process training runs
    the same code and the same arithmetic.
    """

    def __init__(self, accelerator: Accelerator, fsdp: bool = False) -> None:
        self.accelerator = accelerator
        if accelerator.distributed_type in SHARDING_ENGINES:
            raise ValueError(f"accelerate was launched with {accelerator.distributed_type.value}, whose engine owns one "
                             f"optimizer per model and steps all of its parameters at once; these trainers step each "
                             f"agent's optimizer on its own (trainers/common/distributed.py). Launch with --multi_gpu "
                             f"(one replica per process), or shard with FSDP2: --use_fsdp --fsdp_version 2 "
                             f"(examples/accelerate/fsdp2.yaml) or fsdp=True in the config")
        if accelerator.distributed_type == DistributedType.FSDP:
            plugin = accelerator.state.fsdp_plugin
            if getattr(plugin, "fsdp_version", 1) != 2:
                raise ValueError("accelerate was launched with FSDP version 1; the trainers shard with FSDP2 "
                                 "(torch fully_shard, per-parameter sharding that keeps each agent's optimizer): "
                                 "launch with --fsdp_version 2 (examples/accelerate/fsdp2.yaml)")
            fsdp = True
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched != accelerator.num_processes:
            raise ValueError(f"{launched} processes were launched (WORLD_SIZE) but the accelerator joined "
                             f"{accelerator.num_processes}; on a machine without GPUs build it with Accelerator(cpu=True) "
                             f"(the trainers do when no accelerator is passed)")
        if accelerator.gradient_accumulation_steps != 1:
            raise ValueError(f"the accelerator has gradient_accumulation_steps={accelerator.gradient_accumulation_steps}; "
                             f"the trainers accumulate micro-batches themselves: build it with the default 1")
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
    def merge_metrics(self, metrics: Mapping[str, Any], sums: Sequence[str] = (), maxima: Sequence[str] = ()) -> dict[str, Any]:
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


def release_free_memory() -> None:
    """Give the heap memory that was freed back to the OS (glibc ``malloc_trim``; elsewhere nothing).

    Sharded training on a CPU frees whole gathered layers at every step, and glibc keeps such
    blocks in its heap. Measured on SmolLM2-135M (2 agents, full fine-tune, 2 processes), resident
    memory after the first step went from 3746 to 2570 MiB when trimmed.
    """
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM = None


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


def merge_reports(reports: Sequence[Mapping[str, Any]], sums: Sequence[str] = (), maxima: Sequence[str] = ()) -> dict[str, Any]:
    """Merge per-process metric dicts (see :meth:`DataParallel.merge_metrics`)."""
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


# ---------------------------------------------------------------------------------- devices
def place_team(team: Team, agents: Sequence[str], agent_devices: Mapping[str, str] | None, default: torch.device,
               num_processes: int = 1) -> dict[str, torch.device]:
    """Move every trainable policy of ``team`` to its device; returns ``{agent: device}``.

    Agents listed in ``agent_devices`` go there, the others to ``default`` (the process's device).
    Agents that share a policy (``Team.shared_lora``: one base, one adapter each) share its device.
    """
    agent_devices = dict(agent_devices or {})
    unknown = sorted(set(agent_devices) - set(agents))
    if unknown:
        raise ValueError(f"agent_devices names unknown agent(s) {unknown}; the env's agents are {list(agents)}")
    if agent_devices and num_processes > 1:
        raise ValueError(f"agent_devices places agents on devices inside one process, but {num_processes} processes were "
                         f"launched and would all claim the same devices; launch one process, or drop agent_devices "
                         f"and let each process hold the team on its own GPU")
    wanted: dict[int, dict[str, str]] = {}
    for agent in agents:
        device = agent_devices.get(agent, str(default))
        wanted.setdefault(id(team.policy(agent)), {})[agent] = device
    for by_agent in wanted.values():
        if len(set(by_agent.values())) > 1:
            raise ValueError(f"agents {sorted(by_agent)} share one base model (Team.shared_lora: one frozen base, one LoRA "
                             f"adapter each), so they live on one device, but agent_devices asks for "
                             f"{dict(sorted(by_agent.items()))}; give them the same device, or build the team with "
                             f"Team.separate (one model per agent) to spread agents over devices")
    for device in {d for by_agent in wanted.values() for d in by_agent.values()}:
        _check_available(device)
    placed = {}
    for agent in agents:
        policy = team.policy(agent)
        device = torch.device(wanted[id(policy)][agent])
        if isinstance(policy, HFPolicy) and policy.device != device:
            policy.model.to(device)
        placed[agent] = device
    return placed


def prepare_training(config: ScalingConfig, team: Team, agents: Sequence[str], batch_size: int, batch_field: str,
                     accelerator: Accelerator | None = None,
                     extra_parameters: Sequence[torch.nn.Parameter] = ()) -> DataParallel:
    """The scale-out set-up both trainers share: accelerator, process group, device placement, checkpointing,
    identical replicas, then (``fsdp``) sharding.

    ``batch_size`` is the trainer's global batch (``batch_field`` names its config field); it must
    give every launched process at least one item. ``extra_parameters``: other trainable weights
    (e.g. a critic adapter on the team's base) to synchronise with the agents' before sharding.
    """
    dp = DataParallel(build_accelerator(config, accelerator), fsdp=config.fsdp)
    if batch_size < dp.num_processes:
        raise ValueError(f"{batch_field}={batch_size} is global (split over the processes) and must be >= the "
                         f"{dp.num_processes} processes launched; raise {batch_field} or launch fewer processes")
    if dp.sharded and config.agent_devices:
        raise ValueError("fsdp shards each model over the processes; agent_devices places whole models in one process: "
                         "use one or the other")
    place_team(team, agents, config.agent_devices, dp.device, dp.num_processes)
    if config.gradient_checkpointing:
        for policy in team.policies():
            policy.enable_gradient_checkpointing()
    # the replicas start identical (LoRA initialisation is random per process), then are sharded
    dp.broadcast_parameters([p for agent in agents for p in team.policy(agent).trainable_parameters(team.adapter(agent))]
                            + list(extra_parameters))
    dp.shard_team(team)
    return dp


def local_launch_command(num_processes: int, script: str, *script_args: str) -> list[str]:
    """``accelerate launch`` of ``script`` on ``num_processes`` processes of this machine, as an argv list.

    Uses ``--multi_gpu`` (torchrun) even without GPUs: the trainers' ``Accelerator(cpu=True)`` then
    joins the processes with gloo, whereas accelerate's ``--cpu`` multi-process mode needs MPI and
    silently runs one process without it. The rendezvous port is a free local one.
    """
    multi = ["--multi_gpu"] if num_processes > 1 else []
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return [sys.executable, "-m", "accelerate.commands.launch", *multi, "--num_processes", str(num_processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(port), script, *script_args]


def _check_available(device: str) -> None:
    parsed = torch.device(parse_device(device))
    if parsed.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for (agent_devices) but this machine has no CUDA GPU; "
                         f"use 'cpu' or drop agent_devices")
    if parsed.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r} was asked for but this machine has {torch.cuda.device_count()} CUDA "
                         f"GPU(s) (cuda:0 .. cuda:{torch.cuda.device_count() - 1})")


# ---------------------------------------------------------------------------------- helpers
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


__all__ = ["DataParallel", "build_accelerator", "place_team", "prepare_training", "local_launch_command", "shard",
           "merge_reports", "clip_gradients", "SHARDING_ENGINES"]
