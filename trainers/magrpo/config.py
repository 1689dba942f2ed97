"""`MAGRPOConfig`: every knob of the MAGRPO trainer, documented (usable with ``HfArgumentParser``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from llm_marl.rollout import JOINT_MODES

from ..common.config import TrainerConfig, require, trainer_default
from .counterfactual import TEAM_OUTCOMES

ADVANTAGE_MODES = ("mean", "rloo", "max", "raw")
KL_PLACEMENTS = ("reward", "loss")
EARLY_TERMINATIONS = ("node_mean", "joint_action")
UPDATE_ORDERS = ("last_turn_first", "first_turn_first")
CREDITS = ("group", "counterfactual")
REWARD_TURNS = ("every", "final")
COUNTERFACTUAL_UPDATES = ("all", "transcript")


@dataclass
class MAGRPOConfig(TrainerConfig):
    """Configuration of :class:`~trainers.magrpo.MAGRPOTrainer`.

    Parameters that control sampling:
        num_generations (G), joint_mode, no_repeat_ngram; and from :class:`~trainers.common.config.TrainerConfig`:
        max_new_tokens, temperature, top_p.
    Parameters that control returns and advantages:
        credit, counterfactual_samples, counterfactual_reward, counterfactual_update, advantage_mode,
        normalize_advantages, advantage_std_floor, discount, early_termination_threshold,
        early_termination, kl_placement, reward_turns, alpha0, alpha1, incentive_penalties (MAPoRL's incentives).
    Parameters that control training:
        agent_learning_rates, weight_decay, lr_scheduler, warmup_steps, prompts_per_step, micro_batch_size,
        update_order; and from ``TrainerConfig``: learning_rate, max_grad_norm, kl_coef (β of the k3 KL),
        max_steps, seed.

    Where CoMLRL's implementations differ, the default follows CoMLRL and the other choice is a named
    option (``kl_placement``, ``early_termination``, ``update_order``); the README lists every
    remaining difference.
    Parameters that control evaluation, checkpoints, logging and scaling out (all from ``TrainerConfig``):
        eval_every, eval_tasks, eval_temperature, output_dir, save_every, resume_from_checkpoint,
        report_to, logging_every, progress, mixed_precision, gradient_checkpointing, agent_devices, fsdp.

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
    no_repeat_ngram: int = field(default=0, metadata={
        "help": "n > 0: training samples never repeat one of their own token n-grams (the HF decode loop bans the "
                "token that would; other backends refuse it), so a reward cannot be earned by looping text that "
                "the evaluation decoder would not produce (0: off)."})
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
    credit: str = field(default="group", metadata={
        "help": f"How messages are credited, one of {CREDITS}: 'group' (MAGRPO: G samples per agent per tree node, "
                "group-relative returns over the tree) or 'counterfactual' (C3-style: one transcript per task; each "
                "message's advantage is its effect on the team outcome, from K alternatives replayed from the frozen "
                "transcript; see trainers.magrpo.counterfactual). With 'counterfactual', num_generations, "
                "joint_mode and discount are not used."})
    counterfactual_samples: int = field(default=2, metadata={
        "help": "K (credit='counterfactual'): alternative messages sampled per transcript message, each followed by "
                "a fresh sample of the rest of the episode (>= 1)."})
    counterfactual_reward: str = field(default="final_turn", metadata={
        "help": f"Team outcome a branch is scored by (credit='counterfactual'), one of {TEAM_OUTCOMES}: 'final_turn' "
                "(the agents' mean reward at the last turn) or 'episode_mean' (over every agent and turn)."})
    counterfactual_update: str = field(default="all", metadata={
        "help": f"Which messages the update trains (credit='counterfactual'), one of {COUNTERFACTUAL_UPDATES}: 'all' "
                "(the transcript's message and its K alternatives, each with its advantage in the group, as C3) or "
                "'transcript' (only the transcript's messages)."})
    reward_turns: str = field(default="every", metadata={
        "help": f"Which turns' joint rewards enter the tree's returns, one of {REWARD_TURNS}: 'every' (each turn's "
                "reward, CoMLRL) or 'final' (only joint actions that end the episode keep theirs; an earlier answer "
                "is credited through the discounted returns of the turns it leads to)."})
    alpha0: float = field(default=0.0, metadata={
        "help": "MAPoRL incentive α0 (critical reasoning), added to the joint reward of a turn t >= 1 per agent "
                "that is right while the others' majority was wrong at t-1 (0: off). Needs an env whose infos carry "
                "the per-turn 'correct' table (the debate envs); see trainers.mappo.rewards."})
    alpha1: float = field(default=0.0, metadata={
        "help": "MAPoRL incentive α1 (persuadability): per agent wrong at t-1 that is right at t after the others' "
                "majority was right at t-1 (0: off)."})
    incentive_penalties: bool = field(default=False, metadata={
        "help": "Also subtract α0/α1 per agent that turns a right answer wrong (MAPoRL's reference code; a penalty for "
                "the correct-to-incorrect flips of a debate)."})
    # --- training
    agent_learning_rates: dict[str, float] | None = field(default=None, metadata={
        "help": "Per-agent learning rates {agent: lr}; agents not listed use learning_rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
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
        require(self.no_repeat_ngram >= 0, f"no_repeat_ngram must be >= 0 (0: off), got {self.no_repeat_ngram}")
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
        for name, choices in (("credit", CREDITS), ("reward_turns", REWARD_TURNS),
                              ("counterfactual_reward", TEAM_OUTCOMES),
                              ("counterfactual_update", COUNTERFACTUAL_UPDATES)):
            require(getattr(self, name) in choices, f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        require(isinstance(self.counterfactual_samples, int) and self.counterfactual_samples >= 1,
                f"counterfactual_samples (K alternatives per message) must be an int >= 1, got "
                f"{self.counterfactual_samples!r}")
        require(self.reward_turns == "every" or self.early_termination_threshold is None,
                "reward_turns='final' leaves a branch that early termination stops without any reward; set "
                "early_termination_threshold=None or reward_turns='every'")
        require(self.alpha0 >= 0 and self.alpha1 >= 0,
                f"alpha0 and alpha1 are incentive weights and must be >= 0 (use incentive_penalties for the "
                f"penalties), got alpha0={self.alpha0}, alpha1={self.alpha1}")
        if self.credit == "counterfactual":
            require(self.reward_turns == "every",
                    "reward_turns shapes the tree's returns and does not apply to credit='counterfactual' (see "
                    "counterfactual_reward); leave reward_turns='every'")
            require(self.alpha0 == 0 and self.alpha1 == 0,
                    "the incentives alpha0/alpha1 shape the tree's joint rewards and do not apply to "
                    "credit='counterfactual'; set them to 0")
            require(self.joint_mode == "aligned",
                    f"joint_mode={self.joint_mode!r} does not apply to credit='counterfactual' (one transcript per "
                    f"task, no joint-action tree); leave joint_mode='aligned'")
            require(self.early_termination_threshold is None,
                    "early_termination_threshold stops tree expansion and does not apply to credit='counterfactual'; "
                    "set it to None")
            require(self.kl_coef == 0 or self.kl_placement == "loss",
                    f"kl_placement='reward' (kl_coef={self.kl_coef}) is not supported with credit='counterfactual'; "
                    f"use kl_placement='loss' or kl_coef=0")


__all__ = ["MAGRPOConfig", "ADVANTAGE_MODES", "CREDITS", "REWARD_TURNS", "COUNTERFACTUAL_UPDATES", "TEAM_OUTCOMES",
           "JOINT_MODES", "KL_PLACEMENTS", "EARLY_TERMINATIONS", "UPDATE_ORDERS"]
