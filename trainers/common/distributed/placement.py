"""Putting each agent's policy on its device (``agent_devices``), in one process."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from llm_marl.backends.hf import HFPolicy, set_weight_layout
from llm_marl.team import Team

from ..config import parse_device


def place_team(team: Team, agents: Sequence[str], agent_devices: Mapping[str, str] | None, default: torch.device,
               num_processes: int = 1) -> dict[str, torch.device]:
    """Move every trainable policy of ``team`` to its device; returns ``{agent: device}``.

    Agents listed in ``agent_devices`` go there, the others to ``default`` (the process's device).
    Agents that share a policy (``Team.adapter_per_agent``: one base, one adapter each) share its device.
    """
    agent_devices = dict(agent_devices or {})
    unknown = sorted(set(agent_devices) - set(agents))
    if unknown:
        raise ValueError(f"agent_devices names unknown agent(s) {unknown}; the env's agents are {list(agents)}")
    if agent_devices and num_processes > 1:
        raise ValueError(
            f"agent_devices places agents on devices inside one process, but {num_processes} processes were "
            f"launched and would all claim the same devices; launch one process, or drop agent_devices "
            f"and let each process hold the team on its own GPU"
        )
    wanted: dict[int, dict[str, str]] = {}
    for agent in agents:
        device = agent_devices.get(agent, str(default))
        wanted.setdefault(id(team.policy(agent)), {})[agent] = device
    for by_agent in wanted.values():
        if len(set(by_agent.values())) > 1:
            raise ValueError(
                f"agents {sorted(by_agent)} share one base model (Team.adapter_per_agent: one frozen base, one LoRA "
                f"adapter each), so they live on one device, but agent_devices asks for "
                f"{dict(sorted(by_agent.items()))}; give them the same device, or build the team with "
                f"Team.separate (one model per agent) to spread agents over devices"
            )
    for device in {d for by_agent in wanted.values() for d in by_agent.values()}:
        _check_available(device)
    placed = {}
    for agent in agents:
        policy = team.policy(agent)
        device = torch.device(wanted[id(policy)][agent])
        if isinstance(policy, HFPolicy) and policy.device != device:
            if device.type != "cpu":      # the input-major layout is for the CPU's kernels; .to() would keep it
                set_weight_layout(policy.model, input_major=False)
            policy.model.to(device)
        placed[agent] = device
    return placed


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
