"""Atomic training checkpoints: weights (adapter or full model) per agent, optimizers, schedulers, RNG states, step.

Layout of ``<output_dir>/checkpoints/step-000012/``::

    agents/<agent>/              the agent's trained weights: its LoRA adapter in PEFT's format
                                 (adapter_config.json + adapter_model.safetensors), or the whole model in
                                 transformers' (config.json + model.safetensors)
    optimizers.pt  schedulers.pt one state dict per agent
    trainer_state.pt             step, RNG states (python, numpy, torch, CUDA) of every process and trainer extras
    config.json                  the trainer config
    team.json                    base model(s), agents, their adapters and folders, env (see
                                 :mod:`llm_marl.team_checkpoint`, which also reads a checkpoint back as a team)

A checkpoint is written to a hidden temp dir and renamed into place, so a crash at any
moment leaves the previous checkpoint intact and never a half-written one (the next save
removes the temp dir a killed writer left). In a multi-process
run only the main process writes (the replicas' weights and optimizer states are identical;
sharded ones are gathered whole first, so the files are the same either way);
``rng`` holds the main process's RNG states and ``process_rng`` those of every process, so a
run resumed under the same launch gives every process its own sampling stream back.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llm_marl.files import replace_directory
from llm_marl.sharding import shard_optimizer_state
from llm_marl.team import Team
from llm_marl.team_checkpoint import (  # noqa: F401 (re-exported)
    PREFIX,
    agent_dir,
    checkpoint_dir,
    latest_checkpoint,
    read_agent,
    read_manifest,
    team_manifest,
    write_agent,
    write_manifest,
)


def rng_state() -> dict[str, Any]:
    """Python, numpy, torch (and CUDA, when present) RNG states of this process."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of :func:`rng_state` (CUDA states are restored when both sides have the same GPUs)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def resolve_checkpoint(resume: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """Turn ``resume_from_checkpoint`` (a path or ``"latest"``) into a checkpoint dir, or raise ``ValueError``."""
    path = latest_checkpoint(output_dir) if str(resume) == "latest" else Path(resume)
    if path is None:
        raise ValueError(f"resume_from_checkpoint='latest' but {Path(output_dir) / 'checkpoints'} holds no checkpoint; "
                         f"start without resume_from_checkpoint")
    if not (path / "trainer_state.pt").is_file():
        raise ValueError(f"{path} is not a checkpoint (no trainer_state.pt); pass a step-* dir or 'latest'")
    return path


def training_tensors(team: Team, optimizers: Mapping[str, Any], whole: bool = True) -> tuple[dict, dict]:
    """What a checkpoint holds of the training: ``(weights, optimizer states)``, one entry per agent of ``optimizers``.

    ``whole=False`` leaves sharded weights as this process's shards (see ``HFPolicy.trainable_state_dict``);
    optimizer states are the optimizers' own state dicts, sharded or not.
    """
    weights = {agent: team.policy(agent).trainable_state_dict(team.adapter(agent), whole=whole) for agent in optimizers}
    return weights, {agent: optimizer.state_dict() for agent, optimizer in optimizers.items()}


def save_checkpoint(output_dir: str | os.PathLike, step: int, team: Team, optimizers: Mapping[str, Any],
                    schedulers: Mapping[str, Any], config: Mapping[str, Any], extra: Mapping[str, Any] | None = None,
                    process_rng: Sequence[Mapping[str, Any]] | None = None,
                    tensors: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None, env: Any = None) -> Path:
    """Write checkpoint ``step`` atomically (temp dir + rename) and return its path.

    ``process_rng``: the RNG states of every process of a multi-process run, in process order
    (``DistributedTraining.rng_states()``); by default, this process's. ``tensors``: ``(weights per agent,
    optimizer state per agent)`` already gathered (``DistributedTraining.checkpoint_tensors``, needed when the
    weights are sharded); by default they are read from ``team`` and ``optimizers``. ``env``: the env
    trained on, whose id and shape ``team.json`` records.
    """
    weights, optimizer_states = tensors if tensors is not None else training_tensors(team, optimizers)
    target = checkpoint_dir(output_dir, step)
    target.parent.mkdir(parents=True, exist_ok=True)
    for orphan in [*target.parent.glob(".tmp-*"), *target.parent.glob(".stale-*")]:   # a writer killed mid-way
        shutil.rmtree(orphan, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}.", dir=target.parent))
    try:
        manifest = team_manifest(team, list(optimizers), env=env, step=step)
        for agent in optimizers:
            write_agent(agent_dir(tmp, manifest, agent), team.policy(agent), team.adapter(agent), weights[agent],
                        base_model=manifest["members"][agent]["base_model"])
        torch.save(dict(optimizer_states), tmp / "optimizers.pt")
        torch.save({a: s.state_dict() for a, s in schedulers.items()}, tmp / "schedulers.pt")
        process_rng = list(process_rng) if process_rng is not None else [rng_state()]
        torch.save({"step": step, "rng": process_rng[0], "process_rng": process_rng, "extra": dict(extra or {})},
                   tmp / "trainer_state.pt")
        (tmp / "config.json").write_text(json.dumps(dict(config), indent=2, default=str))
        write_manifest(tmp, manifest)
        with open(tmp / "trainer_state.pt", "rb") as handle:   # flush to disk before the rename publishes it
            os.fsync(handle.fileno())
        replace_directory(tmp, target)                        # re-saving a step swaps the old one out first
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def prune_checkpoints(output_dir: str | os.PathLike, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` (>= 1) complete checkpoints under ``output_dir/checkpoints``; those deleted.

    Each goes in one rename to a hidden ``.stale-*`` dir before it is removed (a crash leaves a complete
    checkpoint or none, and the next save clears the leftover); the newest is never touched.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(output_dir) / "checkpoints"
    complete = sorted(p for p in root.glob(f"{PREFIX}*") if p.is_dir() and (p / "trainer_state.pt").is_file())
    removed = complete[:-keep]
    for path in removed:
        stale = path.with_name(f".stale-{path.name}")
        os.rename(path, stale)
        shutil.rmtree(stale, ignore_errors=True)
    return removed


def load_checkpoint(path: str | os.PathLike, team: Team, optimizers: Mapping[str, Any],
                    schedulers: Mapping[str, Any], process_index: int = 0, num_processes: int = 1) -> dict[str, Any]:
    """Restore weights, optimizer/scheduler states and this process's RNG states; returns ``{"step", "extra"}``.

    Every process of a multi-process run calls it (all read the same files) with its own index.
    """
    path = Path(path)
    manifest = read_manifest(path)
    for agent in optimizers:
        read_agent(path, manifest, agent, team.policy(agent), team.adapter(agent))
    for name, objects in (("optimizers.pt", optimizers), ("schedulers.pt", schedulers)):
        states = torch.load(path / name, weights_only=False)
        for agent, obj in objects.items():
            obj.load_state_dict(shard_optimizer_state(obj, states[agent]) if name == "optimizers.pt" else states[agent])
    state = torch.load(path / "trainer_state.pt", weights_only=False)
    process_rng = state.get("process_rng", [state["rng"]])
    if len(process_rng) == num_processes:
        set_rng_state(process_rng[process_index])
    else:
        warnings.warn(f"checkpoint {path} was written by a run of {len(process_rng)} process(es), this one has "
                      f"{num_processes}: weights and optimizer states resume exactly, sampling noise does not")
        set_rng_state(process_rng[0])
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, ())) + process_index)   # distinct streams per process
    return {"step": state["step"], "extra": state["extra"]}
