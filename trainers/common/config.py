"""`TrainerConfig`: the config fields every trainer has (run, generation, evaluation, logging, scaling).

``MAGRPOConfig`` and ``MAPPOConfig`` inherit it and add only their algorithm's fields, so each
shared field, its help text and its validation exist once. Where a trainer wants another default
for a shared field it redeclares just that field with :func:`trainer_default`, which keeps the
help text of this class.

``__post_init__`` checks the values themselves; whether the machine can honour them (a CUDA
device for ``agent_devices`` or ``fp16``) is checked when the trainer is built, so a config can be
written on one machine and used on another.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

MIXED_PRECISION = ("no", "bf16", "fp16")
DEVICE_TYPES = ("cpu", "cuda")
REPORT_TO = ("jsonl", "tensorboard", "wandb", "trackio")
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k3")   # trainers.common.losses.kl_per_token


@dataclass
class TrainerConfig:
    """Parameters every trainer shares.

    Parameters that control generation during training:
        max_new_tokens, temperature, top_p.
    Parameters that control training:
        learning_rate, weight_decay, max_grad_norm, kl_coef, max_steps, seed.
    Parameters that control evaluation:
        eval_every, eval_tasks, eval_temperature.
    Parameters that control checkpoints and logging:
        output_dir, save_every, save_every_minutes, save_total_limit, resume_from_checkpoint, report_to,
        logging_every, progress. A run checkpoints every ``save_every`` steps, after any step that ends
        ``save_every_minutes`` or more after the last checkpoint (so an interrupted run loses at most about
        that long) and at its last step; only the newest ``save_total_limit`` checkpoints are kept.
    Parameters that control precision, memory and device placement:
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

    # --- generation
    max_new_tokens: int = field(default=64, metadata={"help": "Most tokens an agent may write per answer."})
    temperature: float = field(default=0.7, metadata={
        "help": "Sampling temperature of training rollouts (> 0: the losses score the sampled tokens' log-probs)."})
    top_p: float = field(default=0.9, metadata={"help": "Nucleus sampling mass in (0, 1]."})
    # --- training
    learning_rate: float = field(default=5e-5, metadata={
        "help": "AdamW learning rate of every agent's trainable weights."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay of every optimizer."})
    max_grad_norm: float | None = field(default=1.0, metadata={
        "help": "Gradient-norm clip per optimizer step (None: no clipping)."})
    kl_coef: float = field(default=0.0, metadata={
        "help": "β: weight of the KL penalty to the reference policy, the base with adapters disabled (needs LoRA "
                "policies when > 0)."})
    max_steps: int = field(default=100, metadata={"help": "Training steps (each: one collect, then one update)."})
    seed: int = field(default=0, metadata={"help": "Seed of task sampling, generation and initialisation."})
    # --- evaluation
    eval_every: int = field(
        default=0, metadata={"help": "Evaluate every N steps (0: only when .evaluate() is called)."}
    )
    eval_tasks: int = field(default=16, metadata={"help": (
        "Held-out tasks evaluate() plays: with an eval_env (llm-marl train passes the test split) its first "
        "eval_tasks tasks; without one, the last eval_tasks tasks of the env, which training then never samples.")})
    eval_temperature: float = field(default=0.0, metadata={"help": "Sampling temperature of evaluate() (0: greedy)."})
    # --- checkpoints and logging
    output_dir: str = field(default="outputs", metadata={"help": "Checkpoints, metrics.jsonl and TensorBoard logs."})
    save_every: int = field(default=0, metadata={
        "help": "Write a checkpoint every N steps (0: by time, save_every_minutes, and at the end)."})
    save_every_minutes: float = field(default=10.0, metadata={
        "help": "Also write a checkpoint after the first step that ends this many minutes after the last checkpoint "
                "(or the start), bounding what an interrupted run loses (0: no time-based checkpoints)."})
    save_total_limit: int = field(default=3, metadata={
        "help": "Keep only the newest N checkpoints under output_dir/checkpoints, deleting older ones after each "
                "save (0: keep all)."})
    resume_from_checkpoint: str | None = field(default=None, metadata={
        "help": "A checkpoint directory (output_dir/checkpoints/step-*), or 'latest' for the newest one under "
                "output_dir/checkpoints."})
    report_to: tuple[str, ...] = field(default=("jsonl", "tensorboard"), metadata={
        "help": f"Metric sinks, any of {REPORT_TO} (wandb and trackio only when installed: "
                "pip install 'llm-marl-envs[trackio]')."})
    logging_every: int = field(default=1, metadata={"help": "Log metrics every N steps."})
    progress: bool = field(default=True, metadata={"help": "Show tqdm progress bars."})
    # --- precision, memory and devices
    mixed_precision: str = field(default="no", metadata={
        "help": f"Autocast precision of forward passes, one of {MIXED_PRECISION}; bf16 runs on CPUs with bf16 units "
                "and recent GPUs, fp16 needs a CUDA GPU (losses are scaled). Must match `accelerate launch "
                "--mixed_precision` when that is given."})
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "Recompute decoder-layer activations during the backward pass (less memory, ~30% more compute)."})
    agent_devices: dict[str, str] | None = field(
        default=None,
        metadata={
            "help": "Place agents on devices in one process, e.g. {agent_0: cuda:0, agent_1: cuda:1}; "
            "needs one model per agent (Team.separate): agents sharing a base (Team.adapter_per_agent) must "
            "share its device. Unlisted agents use the process's device. Not combinable with several processes "
            "per machine."
        },
    )
    fsdp: bool = field(default=False, metadata={
        "help": "Shard weights, gradients and AdamW states over the launched processes with FSDP2 (torch fully_shard); "
                "rollouts gather the full weights once per step. Needs >= 2 processes to do anything."})

    def __post_init__(self) -> None:
        require(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        require(
            self.temperature > 0,
            f"temperature must be > 0: training scores the log-probs of sampled tokens, which "
            f"a greedy policy makes degenerate (got {self.temperature}); use e.g. 0.7",
        )
        require(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        require(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}")
        require(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        require(self.max_grad_norm is None or self.max_grad_norm > 0,
                f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        require(self.kl_coef >= 0, f"kl_coef must be >= 0, got {self.kl_coef}")
        for name in ("max_steps", "logging_every"):
            require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "eval_tasks", "save_every", "save_every_minutes", "save_total_limit"):
            require(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        require(self.eval_temperature >= 0, f"eval_temperature must be >= 0, got {self.eval_temperature}")
        if isinstance(self.report_to, str):
            self.report_to = (self.report_to,) if self.report_to else ()
        self.report_to = tuple(self.report_to)
        unknown = [sink for sink in self.report_to if sink not in REPORT_TO]
        require(not unknown, f"report_to entries must be in {REPORT_TO}, got {unknown}")
        require(self.mixed_precision in MIXED_PRECISION,
                f"mixed_precision must be one of {MIXED_PRECISION}, got {self.mixed_precision!r}")
        for name in ("gradient_checkpointing", "fsdp"):
            require(isinstance(getattr(self, name), bool), f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.agent_devices is not None:
            require(
                isinstance(self.agent_devices, dict) and bool(self.agent_devices),
                f"agent_devices must be a non-empty mapping {{agent: device}} (or None), got {self.agent_devices!r}",
            )
            self.agent_devices = {
                str(agent): parse_device(device, agent) for agent, device in self.agent_devices.items()
            }

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (saved with checkpoints and sent to the metric sinks)."""
        return asdict(self)


def trainer_default(name: str, default: Any, help: str | None = None) -> Any:
    """A :class:`TrainerConfig` field for a subclass: the same field with this trainer's ``default`` (and ``help``)."""
    shared = TrainerConfig.__dataclass_fields__[name]
    return field(default=default, metadata={"help": help if help is not None else shared.metadata["help"]})


def require(condition: bool, message: str) -> None:
    """``ValueError(message)`` unless ``condition``: the check of a config value, its message saying what to change."""
    if not condition:
        raise ValueError(message)


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


__all__ = ["TrainerConfig", "KL_ESTIMATORS", "MIXED_PRECISION", "REPORT_TO", "parse_device", "require",
           "trainer_default"]
