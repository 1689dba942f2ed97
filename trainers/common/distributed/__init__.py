"""Distributed training on accelerate: a replica (or, with FSDP2, a shard) of the team per process, per-agent
gradient all-reduce, checkpoints gathered whole.

Launch any training script with accelerate (torchrun underneath); the trainers pick the process
group up from the environment — NCCL between GPUs, gloo between CPU processes::

    accelerate launch --multi_gpu --num_processes 4 train.py     # 4 GPUs (or 4 CPU processes on a CPU-only box)

How one training step is split over N processes (both trainers use this module):

1. **Tasks.** Every process draws the step's GLOBAL task list from the same seeded generator
   (MAGRPO: ``prompts_per_step`` tree roots; MAPPO: ``episodes_per_step`` episodes) and keeps its
   contiguous :meth:`DistributedTraining.shard`. N processes together do the one-process step, each with
   1/N of the rollouts; batch sizes in the configs are GLOBAL, so the learning dynamics do not
   depend on N. Sampling noise differs per process (torch seed + process index).
2. **Loss normalisation.** A process divides its partial loss by GLOBAL counts (samples or tokens
   summed over processes by one small all-reduce), so the sum over processes of the partial
   gradients is exactly the gradient of the whole-batch loss.
3. **Gradients.** After an agent's local backward passes, :meth:`DistributedTraining.optimizer_step` SUMS that
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

- **rollouts** run inside :meth:`DistributedTraining.full_weights`: the weights are gathered once (one
  collective on every process), sampling runs without collectives, so processes may generate
  different numbers of tokens, and the weights are freed after;
- **losses** run in lockstep: every process runs the same number of micro-batch forward/backward
  passes (:meth:`DistributedTraining.lockstep`; a process short of rows runs a zero-weighted one), each
  with the same forward calls (``HFPolicy.lockstep``), and FSDP reduce-scatters the gradients
  (summed, as here);
- **checkpoints** gather the full tensors on every process; the main process writes the same
  files as an unsharded run, and loading shards them again.

Each agent keeps its own optimizer over its own (sharded) parameters, so per-agent updates stay
exactly as without sharding. DeepSpeed (its engine owns one optimizer per model and steps all its
parameters at once) and FSDP1 are refused with an error naming the supported launches.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from accelerate import Accelerator

from llm_marl.team import Team

from ..config import TrainerConfig
from .launch import local_launch_command
from .memory import release_free_memory
from .placement import place_team
from .training import (
    BUCKET_NUMEL,
    SHARDING_ENGINES,
    DistributedTraining,
    build_accelerator,
    clip_gradients,
    merge_reports,
    shard,
)


def prepare_training(config: TrainerConfig, team: Team, agents: Sequence[str], batch_size: int, batch_field: str,
                     accelerator: Accelerator | None = None,
                     extra_parameters: Sequence[torch.nn.Parameter] = ()) -> DistributedTraining:
    """The scale-out set-up both trainers share: accelerator, process group, device placement, checkpointing,
    identical replicas, then (``fsdp``) sharding.

    ``batch_size`` is the trainer's global batch (``batch_field`` names its config field); it must
    give every launched process at least one item. ``extra_parameters``: other trainable weights
    (e.g. a critic adapter on the team's base) to synchronise with the agents' before sharding.
    """
    distributed = DistributedTraining(build_accelerator(config, accelerator), fsdp=config.fsdp)
    if batch_size < distributed.num_processes:
        raise ValueError(f"{batch_field}={batch_size} is global (split over the processes) and must be >= the "
                         f"{distributed.num_processes} processes launched; raise {batch_field} or launch fewer "
                         f"processes")
    if distributed.sharded and config.agent_devices:
        raise ValueError("fsdp shards each model over the processes; agent_devices places whole models in one process: "
                         "use one or the other")
    place_team(team, agents, config.agent_devices, distributed.device, distributed.num_processes)
    if config.gradient_checkpointing:
        for policy in team.policies():
            policy.enable_gradient_checkpointing()
    # the replicas start identical (LoRA initialisation is random per process), then are sharded
    distributed.broadcast_parameters(
        [p for agent in agents for p in team.policy(agent).trainable_parameters(team.adapter(agent))]
        + list(extra_parameters))
    distributed.shard_team(team)
    return distributed


__all__ = ["BUCKET_NUMEL", "DistributedTraining", "SHARDING_ENGINES", "build_accelerator", "clip_gradients",
           "local_launch_command", "merge_reports", "place_team", "prepare_training", "release_free_memory", "shard"]
