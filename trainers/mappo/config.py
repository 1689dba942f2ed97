"""`MAPPOConfig`: every knob of the MAPPO (MAPoRL) trainer, documented for ``--help``."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trainers.common.config import ScalingConfig

from .ppo_math import KL_ESTIMATORS
from .rewards import FUTURE_MEANS, REWARD_RULES, IncentiveWeights

VERIFIERS = ("label", "learned")


@dataclass
class MAPPOConfig(ScalingConfig):
    r"""Configuration of :class:`~trainers.mappo.MAPPOTrainer`.

    Parameters that control the rewards (MAPoRL):
        reward_rule, reward_gamma, future_mean: how verifier scores become turn rewards
            (:func:`trainers.mappo.rewards.influence_aware_returns`).
        alpha0, alpha1, beta0, beta1: collaboration incentives (:func:`trainers.mappo.rewards.incentive_bonuses`).
        verifier, reward_model_path, reward_server_url: the env's answer label, or a learned verifier.

    Parameters that control generation:
        max_new_tokens, temperature, top_p.

    Parameters that control the PPO update:
        episodes_per_step, ppo_epochs, minibatch_size, learning_rate, critic_learning_rate, gae_gamma,
        gae_lambda, clip_eps, value_clip, vf_coef, entropy_coef, kl_coef, kl_estimator,
        whiten_advantages, max_grad_norm.

    Parameters that control the critic:
        critic_lora_r, critic_max_context_tokens.

    Parameters that control the run:
        max_steps, seed, output_dir, save_every, resume_from_checkpoint, report_to, logging_every,
        progress, eval_tasks, eval_temperature.

    Parameters that control scaling out (:class:`~trainers.common.config.ScalingConfig`):
        mixed_precision, gradient_checkpointing, agent_devices.

    Batch semantics under ``accelerate launch`` with N processes: ``episodes_per_step`` and
    ``minibatch_size`` are GLOBAL (episodes are split over the processes, N must not exceed
    ``episodes_per_step``; a minibatch is drawn from all processes' responses), so the update does
    not depend on N.
    """

    # ---------------------------------------------------------------- rewards
    reward_rule: str = field(default="influence_aware", metadata={
        "help": f"Turn reward rule, one of {REWARD_RULES}: influence_aware = own score plus discounted future team "
                "scores (MAPoRL); current_turn = own score; last_turn = own score at the last turn."})
    reward_gamma: float = field(default=0.3, metadata={
        "help": "γ of the influence-aware return across turns (0.3 in MAPoRL); 0 = current turn only."})
    future_mean: str = field(default="all", metadata={
        "help": f"Whose scores form the future team score s̄, one of {FUTURE_MEANS}: all agents, or the others only."})
    alpha0: float = field(default=0.0, metadata={"help": "Incentive α0 (critical reasoning): right at t while the others' majority was wrong at t-1."})
    alpha1: float = field(default=0.0, metadata={"help": "Incentive α1 (persuadability): wrong at t-1, others' majority right at t-1, right at t."})
    beta0: float = field(default=0.0, metadata={"help": "Incentive β0 (useful wrong answer): wrong at t and more others right at t+1 than at t."})
    beta1: float = field(default=0.0, metadata={"help": "Incentive β1 (persuasion): right at t and more others right at t+1 than at t."})
    verifier: str = field(default="label", metadata={
        "help": f"Where scores come from, one of {VERIFIERS}: the env's answer-label verifier, or a learned reward "
                "model (set reward_model_path or reward_server_url)."})
    reward_model_path: str | None = field(default=None, metadata={"help": "Directory of a saved RewardModel (verifier='learned')."})
    reward_server_url: str | None = field(default=None, metadata={"help": "URL of a running reward server (verifier='learned')."})

    # ---------------------------------------------------------------- generation
    max_new_tokens: int = field(default=128, metadata={"help": "Most tokens an agent may write per turn."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature during training rollouts (> 0)."})
    top_p: float = field(default=0.9, metadata={"help": "Nucleus sampling mass during training rollouts."})

    # ---------------------------------------------------------------- PPO
    episodes_per_step: int = field(default=4, metadata={
        "help": "Debate episodes collected per training step, over all processes (split between them under accelerate launch)."})
    ppo_epochs: int = field(default=2, metadata={"help": "Passes over each step's responses."})
    minibatch_size: int = field(default=4, metadata={
        "help": "Responses (agent-turns) per gradient step, over all processes; also the forward batch of the advantage pass."})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate of the agents' adapters."})
    critic_learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate of the critic's adapter and value head."})
    gae_gamma: float = field(default=1.0, metadata={"help": "γ of token-level GAE inside a response."})
    gae_lambda: float = field(default=0.95, metadata={"help": "λ of token-level GAE inside a response."})
    clip_eps: float = field(default=0.2, metadata={"help": "PPO ratio clip ε."})
    value_clip: float = field(default=0.2, metadata={"help": "Clip range of the value update around the rollout values."})
    vf_coef: float = field(default=0.5, metadata={"help": "Weight of the value loss in the total loss."})
    entropy_coef: float = field(default=0.0, metadata={"help": "Weight of the entropy bonus (0 = off)."})
    kl_coef: float = field(default=0.05, metadata={"help": "β of the per-token KL penalty to the reference (base without adapter)."})
    kl_estimator: str = field(default="k1", metadata={"help": f"KL estimator, one of {KL_ESTIMATORS} (see trainers.mappo.ppo_math)."})
    whiten_advantages: bool = field(default=True, metadata={"help": "Normalise advantages to zero mean, unit variance per step."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient-norm clip per optimiser step."})

    # ---------------------------------------------------------------- critic
    critic_lora_r: int = field(default=8, metadata={"help": "LoRA rank of the critic's own adapter on the shared base."})
    critic_max_context_tokens: int = field(default=768, metadata={
        "help": "The critic keeps the last this-many tokens of its context (task + debate so far)."})

    # ---------------------------------------------------------------- run (names as in MAGRPOConfig)
    max_steps: int = field(default=10, metadata={"help": "Training steps (each: collect episodes_per_step episodes, then update)."})
    seed: int = field(default=0, metadata={"help": "Seed of task sampling, generation and initialisation."})
    output_dir: str = field(default="outputs/mappo", metadata={"help": "Checkpoints, metrics.jsonl and TensorBoard logs."})
    save_every: int = field(default=0, metadata={"help": "Write a checkpoint every N steps (0: only at the end)."})
    resume_from_checkpoint: str | None = field(default=None, metadata={
        "help": "A checkpoint dir (output_dir/checkpoints/step-*) or 'latest' to continue a run."})
    report_to: tuple[str, ...] = field(default=("jsonl", "tensorboard"), metadata={
        "help": "Metric sinks: any of 'jsonl', 'tensorboard', 'wandb'."})
    logging_every: int = field(default=1, metadata={"help": "Log metrics every N steps."})
    progress: bool = field(default=True, metadata={"help": "Show a tqdm progress bar over steps."})
    eval_tasks: int = field(default=16, metadata={"help": "evaluate() plays the eval env's tasks 0..n-1."})
    eval_temperature: float = field(default=0.0, metadata={"help": "Sampling temperature of evaluate() (0: greedy)."})

    def __post_init__(self) -> None:
        super().__post_init__()

        def need(condition: bool, message: str) -> None:
            if not condition:
                raise ValueError(message)

        need(self.reward_rule in REWARD_RULES, f"reward_rule must be one of {REWARD_RULES}, got {self.reward_rule!r}")
        need(0.0 <= self.reward_gamma <= 1.0, f"reward_gamma must be in [0, 1], got {self.reward_gamma}")
        need(self.future_mean in FUTURE_MEANS, f"future_mean must be one of {FUTURE_MEANS}, got {self.future_mean!r}")
        need(self.verifier in VERIFIERS, f"verifier must be one of {VERIFIERS}, got {self.verifier!r}")
        if self.verifier == "learned":
            need((self.reward_model_path is None) != (self.reward_server_url is None),
                 "verifier='learned' needs exactly one of reward_model_path or reward_server_url")
        else:
            need(self.reward_model_path is None and self.reward_server_url is None,
                 "reward_model_path/reward_server_url are only used with verifier='learned'; set verifier='learned'")
        need(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        need(self.temperature > 0, f"temperature must be > 0 for PPO rollouts (log-probs of a greedy policy are "
                                   f"degenerate), got {self.temperature}")
        need(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        for name in ("episodes_per_step", "ppo_epochs", "minibatch_size", "max_steps", "critic_lora_r",
                     "critic_max_context_tokens", "logging_every", "eval_tasks"):
            need(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        need(self.save_every >= 0, f"save_every must be >= 0 (0 = only at the end), got {self.save_every}")
        unknown = sorted(set(self.report_to) - {"jsonl", "tensorboard", "wandb"})
        need(not unknown, f"report_to entries must be 'jsonl', 'tensorboard' or 'wandb', got {unknown}")
        for name in ("learning_rate", "critic_learning_rate", "clip_eps", "value_clip", "max_grad_norm"):
            need(getattr(self, name) > 0, f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("vf_coef", "entropy_coef", "kl_coef"):
            need(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        need(0 <= self.gae_gamma <= 1 and 0 <= self.gae_lambda <= 1,
             f"gae_gamma and gae_lambda must be in [0, 1], got {self.gae_gamma}, {self.gae_lambda}")
        need(self.kl_estimator in KL_ESTIMATORS, f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        need(self.eval_temperature >= 0, f"eval_temperature must be >= 0, got {self.eval_temperature}")

    @property
    def incentives(self) -> IncentiveWeights:
        """The four incentive weights as one object."""
        return IncentiveWeights(self.alpha0, self.alpha1, self.beta0, self.beta1)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (saved beside checkpoints)."""
        return asdict(self)


__all__ = ["MAPPOConfig", "VERIFIERS"]
