"""`MAGRPOConfig`: every knob of the MAGRPO trainer, documented (usable with ``HfArgumentParser``)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..common.config import ScalingConfig

ADVANTAGE_MODES = ("mean", "rloo", "max", "raw")
JOINT_MODES = ("aligned", "cross")
REPORT_TO = ("jsonl", "tensorboard", "wandb")


@dataclass
class MAGRPOConfig(ScalingConfig):
    """Configuration of :class:`~trainers.magrpo.MAGRPOTrainer`.

    Parameters that control sampling:
        num_generations (G), joint_mode, max_new_tokens, temperature, top_p.
    Parameters that control returns and advantages:
        advantage_mode, normalize_advantages, advantage_std_floor, discount, early_termination_threshold.
    Parameters that control training:
        learning_rate, agent_learning_rates, max_grad_norm, weight_decay, lr_scheduler, kl_coef,
        max_steps, prompts_per_step, micro_batch_size, seed.
    Parameters that control evaluation, checkpoints and logging:
        eval_every, eval_tasks, eval_temperature, save_every, output_dir, resume_from_checkpoint,
        report_to, logging_every, progress.
    Parameters that control scaling out (:class:`~trainers.common.config.ScalingConfig`):
        mixed_precision, gradient_checkpointing, agent_devices.

    Batch semantics under ``accelerate launch`` with N processes: ``prompts_per_step`` is GLOBAL
    (the step's tasks are split over the processes, so a step trains on the same number of trees
    whatever N is, and N must not exceed it); ``micro_batch_size`` is per process (completions per
    forward pass, a memory knob that does not change the update).
    """

    # --- sampling
    num_generations: int = field(default=4, metadata={"help": "G: completions sampled per agent per tree node (>= 2)."})
    joint_mode: str = field(default="aligned", metadata={
        "help": "How agents' samples form joint actions: 'aligned' (g-th with g-th, G per node) or 'cross' "
                "(Cartesian product, G^N per node)."})
    max_new_tokens: int = field(default=64, metadata={"help": "Maximum completion tokens per answer."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature during training (> 0)."})
    top_p: float = field(default=0.9, metadata={"help": "Nucleus sampling mass in (0, 1]."})
    # --- returns / advantages
    advantage_mode: str = field(default="mean", metadata={
        "help": "Group baseline: 'mean' (R - mean R), 'rloo' (R - mean of the others), 'max' (R - max R) or "
                "'raw' (R, no baseline)."})
    normalize_advantages: bool = field(default=False, metadata={
        "help": "Divide advantages by the group's std (at least advantage_std_floor)."})
    advantage_std_floor: float = field(default=1e-4, metadata={"help": "Lower bound of the std used to normalise."})
    discount: float = field(default=0.9, metadata={
        "help": "gamma in the multi-turn tree return R = r + gamma * mean(child returns), in [0, 1]."})
    early_termination_threshold: float | None = field(default=None, metadata={
        "help": "Do not expand a joint action further when its joint reward reaches this value (None: always expand)."})
    # --- training
    learning_rate: float = field(default=5e-5, metadata={"help": "AdamW learning rate of every agent."})
    agent_learning_rates: dict[str, float] | None = field(default=None, metadata={
        "help": "Per-agent learning rates {agent: lr}; agents not listed use learning_rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "Gradient clipping norm (None: no clipping)."})
    lr_scheduler: str = field(default="constant", metadata={
        "help": "transformers scheduler name ('constant', 'linear', 'cosine', ...) over max_steps."})
    warmup_steps: int = field(default=0, metadata={"help": "Scheduler warm-up steps."})
    kl_coef: float = field(default=0.0, metadata={
        "help": "Weight of the KL penalty to the reference policy (the base with adapters disabled; needs LoRA)."})
    max_steps: int = field(default=100, metadata={"help": "Training steps (each: prompts_per_step tree expansions)."})
    prompts_per_step: int = field(default=1, metadata={
        "help": "Tasks (tree roots) per training step, over all processes (split between them under accelerate launch)."})
    micro_batch_size: int = field(default=16, metadata={
        "help": "Completions per forward/backward pass in each process when computing the loss (gradients are "
                "accumulated; does not change the update)."})
    seed: int = field(default=0, metadata={"help": "Seed of task sampling, sampling and initialisation."})
    # --- evaluation, checkpoints, logging
    eval_every: int = field(default=0, metadata={"help": "Evaluate every N steps (0: only when .evaluate() is called)."})
    eval_tasks: int = field(default=16, metadata={
        "help": "Held-out tasks: without an eval_env, the last eval_tasks tasks of the env are reserved for evaluation."})
    eval_temperature: float = field(default=0.0, metadata={"help": "Sampling temperature of evaluation (0: greedy)."})
    save_every: int = field(default=0, metadata={"help": "Write a checkpoint every N steps (0: only at the end)."})
    output_dir: str = field(default="outputs/magrpo", metadata={"help": "Checkpoints, metrics.jsonl and TensorBoard logs."})
    resume_from_checkpoint: str | None = field(default=None, metadata={
        "help": "A checkpoint directory, or 'latest' for the newest one under output_dir/checkpoints."})
    report_to: tuple[str, ...] = field(default=("jsonl", "tensorboard"), metadata={
        "help": f"Metric sinks, any of {REPORT_TO} (wandb only when installed)."})
    logging_every: int = field(default=1, metadata={"help": "Log metrics every N steps."})
    progress: bool = field(default=True, metadata={"help": "Show tqdm progress bars."})

    def __post_init__(self) -> None:
        super().__post_init__()

        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        need(self.num_generations >= 2, f"num_generations must be >= 2 for group-relative advantages, got {self.num_generations}")
        need(self.joint_mode in JOINT_MODES, f"joint_mode must be one of {JOINT_MODES}, got {self.joint_mode!r}")
        need(self.advantage_mode in ADVANTAGE_MODES, f"advantage_mode must be one of {ADVANTAGE_MODES}, got {self.advantage_mode!r}")
        need(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        need(self.temperature > 0, f"temperature must be > 0 for sampling groups (got {self.temperature}); use e.g. 0.7")
        need(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        need(self.advantage_std_floor > 0, f"advantage_std_floor must be > 0, got {self.advantage_std_floor}")
        need(0 <= self.discount <= 1, f"discount must be in [0, 1], got {self.discount}")
        need(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}")
        for agent, lr in (self.agent_learning_rates or {}).items():
            need(lr > 0, f"agent_learning_rates[{agent!r}] must be > 0, got {lr}")
        need(self.kl_coef >= 0, f"kl_coef must be >= 0, got {self.kl_coef}")
        need(self.max_grad_norm is None or self.max_grad_norm > 0, f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        need(self.max_steps >= 1, f"max_steps must be >= 1, got {self.max_steps}")
        need(self.prompts_per_step >= 1, f"prompts_per_step must be >= 1, got {self.prompts_per_step}")
        need(self.micro_batch_size >= 1, f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        need(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        for name in ("eval_every", "eval_tasks", "save_every"):
            need(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        need(self.logging_every >= 1, f"logging_every must be >= 1, got {self.logging_every}")
        need(self.eval_temperature >= 0, f"eval_temperature must be >= 0, got {self.eval_temperature}")
        if isinstance(self.report_to, str):
            self.report_to = (self.report_to,) if self.report_to else ()
        self.report_to = tuple(self.report_to)
        bad = [r for r in self.report_to if r not in REPORT_TO]
        need(not bad, f"report_to entries must be in {REPORT_TO}, got {bad}")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (saved with checkpoints)."""
        return asdict(self)
