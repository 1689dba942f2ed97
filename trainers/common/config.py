"""`ScalingConfig`: the config fields both trainers share for scaling out (precision, memory, devices).

``MAGRPOConfig`` and ``MAPPOConfig`` inherit it, so the fields, their help text and their
validation exist once. ``__post_init__`` checks the values themselves; whether the machine can
honour them (a CUDA device for ``agent_devices`` or ``fp16``) is checked when the trainer is built,
so a config can be written on one machine and used on another.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MIXED_PRECISION = ("no", "bf16", "fp16")
DEVICE_TYPES = ("cpu", "cuda")


@dataclass
class ScalingConfig:
    """Parameters that control precision, memory and device placement (shared by both trainers).

    Parameters:
        mixed_precision: "no", "bf16" or "fp16" — forward passes (rollouts and losses) run under
            accelerate's autocast; weights and optimizer states stay in their own dtype.
        gradient_checkpointing: recompute each decoder layer's activations in the backward pass
            instead of storing them (less memory, about one more forward of compute).
        agent_devices: ``{agent: device}`` to put agents on different devices in ONE process
            (e.g. ``{"agent_0": "cuda:0", "agent_1": "cuda:1"}``); needs one model per agent
            (``Team.separate``). Agents not listed use the process's device.
        fsdp: shard every policy's weights, gradients and optimizer states over the launched
            processes with torch FSDP2 (each process holds 1/N); implied by an
            ``accelerate launch --use_fsdp --fsdp_version 2``.
    """

    mixed_precision: str = field(default="no", metadata={
        "help": f"Autocast precision of forward passes, one of {MIXED_PRECISION}; bf16 runs on CPUs with bf16 units "
                "and recent GPUs, fp16 needs a CUDA GPU (losses are scaled). Must match `accelerate launch "
                "--mixed_precision` when that is given."})
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "Recompute decoder-layer activations during the backward pass (less memory, ~30% more compute)."})
    agent_devices: dict[str, str] | None = field(default=None, metadata={
        "help": "Place agents on devices in one process, e.g. {agent_0: cuda:0, agent_1: cuda:1}; needs one model per "
                "agent (Team.separate): agents sharing a base (Team.shared_lora) must share its device. Unlisted agents "
                "use the process's device. Not combinable with several processes per machine."})

    fsdp: bool = field(default=False, metadata={
        "help": "Shard weights, gradients and AdamW states over the launched processes with FSDP2 (torch fully_shard); "
                "rollouts gather the full weights once per step. Needs >= 2 processes to do anything."})

    def __post_init__(self) -> None:
        if self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION}, got {self.mixed_precision!r}")
        for name in ("gradient_checkpointing", "fsdp"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.agent_devices is not None:
            if not isinstance(self.agent_devices, dict) or not self.agent_devices:
                raise ValueError(f"agent_devices must be a non-empty mapping {{agent: device}} (or None), "
                                 f"got {self.agent_devices!r}")
            self.agent_devices = {str(agent): parse_device(device, agent) for agent, device in self.agent_devices.items()}


def parse_device(device: object, agent: str = "") -> str:
    """Canonical device string (``"cpu"``, ``"cuda:1"``) or ``ValueError`` naming the agent and the accepted forms."""
    import torch

    where = f"agent_devices[{agent!r}]" if agent else "device"
    try:
        parsed = torch.device(str(device))
    except (RuntimeError, TypeError):
        raise ValueError(f"{where} = {device!r} is not a device; use 'cpu', 'cuda' or 'cuda:N'") from None
    if parsed.type not in DEVICE_TYPES:
        raise ValueError(f"{where} = {device!r}: device type {parsed.type!r} is not supported; use 'cpu' or 'cuda:N'")
    if parsed.type == "cuda" and parsed.index is None:
        parsed = torch.device("cuda", 0)
    return str(parsed)


__all__ = ["ScalingConfig", "MIXED_PRECISION", "parse_device"]
