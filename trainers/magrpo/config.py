"""`MAGRPOConfig`: every knob of the MAGRPO trainer, documented (usable with ``HfArgumentParser``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from llm_marl.rollout import JOINT_MODES

from ..common.config import TrainerConfig, require, trainer_default

ADVANTAGE_MODES = ("mean", "rloo", "max", "raw")
KL_PLACEMENTS = ("reward", "loss")
EARLY_TERMINATIONS = ("node_mean", "joint_action")
UPDATE_ORDERS = ("last_turn_first", "first_turn_first")


@dataclass
class MAGRPOConfig(TrainerConfig):
    """Configuration of :class:`~trainers.magrpo.MAGRPOTrainer`.

    Parameters that control sampling:
        num_generations (G), joint_mode; and from :class:`~trainers.common.config.TrainerConfig`:
        max_new_tokens, temperature, top_p.
    Parameters that control returns and advantages:
        advantage_mode, normalize_advantages, advantage_std_floor, discount, early_termination_threshold,
        early_termination, kl_placement.
    Parameters that control training:
        agent_learning_rates, lr_scheduler, warmup_steps, prompts_per_step, micro_batch_size, update_order; and
        from ``TrainerConfig``: learning_rate, weight_decay, max_grad_norm, kl_coef (β of the k3 KL), max_steps,
        seed.

    Where CoMLRL's implementations differ, the default follows CoMLRL and the other choice is a named
    option (``kl_placement``, ``early_termination``, ``update_order``); the README lists every
    remaining difference. Options that are not (yet) part of the algorithm (counterfactual credit,
    MAPoRL's incentives on the tree, final-turn rewards, n-gram-free sampling) are configured with
    :class:`trainers.experimental.ExperimentalMAGRPOConfig`.

    Parameters that control evaluation, checkpoints, logging and scaling out (all from ``TrainerConfig``):
        eval_every, eval_tasks, eval_temperature, output_dir, save_every, save_every_minutes,
        save_total_limit, resume_from_checkpoint, report_to, logging_every, progress, mixed_precision,
        gradient_checkpointing, agent_devices, fsdp.

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
        "help": "Stop expanding when rewards reach this value (None: always expand); see early_termination."})
    early_termination: str = field(default="node_mean", metadata={
        "help": f"What early_termination_threshold is compared with, one of {EARLY_TERMINATIONS}: 'node_mean' "
                "(CoMLRL: the mean joint reward of a node's G joint actions; when it exceeds the threshold none of "
                "them is expanded) or 'joint_action' (each joint action on its own: only branches whose joint "
                "reward reaches the threshold stop)."})
    kl_placement: str = field(default="reward", metadata={
        "help": f"Where the KL to the reference enters (kl_coef > 0), one of {KL_PLACEMENTS}: 'reward' (CoMLRL: "
                "β·Σ_t k3 of each sample is subtracted from its return before the group baseline, no gradient "
                "through the KL) or 'loss' (GRPO/DeepSeekMath style: β·mean_t k3 is a differentiable loss term)."})
    # --- training
    agent_learning_rates: dict[str, float] | None = field(default=None, metadata={
        "help": "Per-agent learning rates {agent: lr}; agents not listed use learning_rate."})
    lr_scheduler: str = field(default="constant", metadata={
        "help": "transformers scheduler name ('constant', 'linear', 'cosine', ...) over max_steps."})
    warmup_steps: int = field(default=0, metadata={"help": "Scheduler warm-up steps."})
    prompts_per_step: int = field(
        default=1,
        metadata={
            "help": "Tasks (tree roots) per training step, over all processes "
            "(split between them under accelerate launch)."
        },
    )
    update_order: str = field(default="last_turn_first", metadata={
        "help": f"Order of the per-turn optimiser steps, one of {UPDATE_ORDERS}: 'last_turn_first' (CoMLRL's "
                "multi-turn trainer updates the tree post-order, from the last turn back to the first) or "
                "'first_turn_first' (comlrl 1.4's buffered trainer, which steps in the order nodes were created)."})
    micro_batch_size: int = field(default=16, metadata={
        "help": "Completions per forward/backward pass in each process when computing the loss (gradients are "
                "accumulated; does not change the update)."})
    # --- this trainer's defaults of shared fields
    output_dir: str = trainer_default("output_dir", "outputs/magrpo")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.num_generations >= 2,
                f"num_generations must be >= 2 for group-relative advantages, got {self.num_generations}")
        require(self.joint_mode in JOINT_MODES, f"joint_mode must be one of {JOINT_MODES}, got {self.joint_mode!r}")
        require(self.advantage_mode in ADVANTAGE_MODES,
                f"advantage_mode must be one of {ADVANTAGE_MODES}, got {self.advantage_mode!r}")
        require(self.advantage_std_floor > 0, f"advantage_std_floor must be > 0, got {self.advantage_std_floor}")
        require(0 <= self.discount <= 1, f"discount must be in [0, 1], got {self.discount}")
        for name, choices in (("early_termination", EARLY_TERMINATIONS), ("kl_placement", KL_PLACEMENTS),
                              ("update_order", UPDATE_ORDERS)):
            require(getattr(self, name) in choices, f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        for agent, lr in (self.agent_learning_rates or {}).items():
            require(lr > 0, f"agent_learning_rates[{agent!r}] must be > 0, got {lr}")
        for name in ("prompts_per_step", "micro_batch_size"):
            require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        require(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")


__all__ = ["MAGRPOConfig", "ADVANTAGE_MODES", "JOINT_MODES", "KL_PLACEMENTS", "EARLY_TERMINATIONS", "UPDATE_ORDERS"]
