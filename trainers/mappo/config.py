"""`MAPPOConfig`: every knob of the MAPPO (MAPoRL) trainer, documented for ``--help``."""
from __future__ import annotations

from dataclasses import dataclass, field

from trainers.common.config import KL_ESTIMATORS, TrainerConfig, require, trainer_default
from trainers.common.incentives import IncentiveWeights, incentive_field

from .rewards import FUTURE_MEANS, REWARD_RULES

VERIFIERS = ("label", "learned")
WHITEN_SCOPES = ("turn_agent", "all")


@dataclass
class MAPPOConfig(TrainerConfig):
    r"""Configuration of :class:`~trainers.mappo.MAPPOTrainer`.

    Parameters that control the rewards (MAPoRL):
        reward_rule, reward_gamma, future_mean: how verifier scores become turn rewards
            (:func:`trainers.mappo.rewards.influence_aware_returns`).
        alpha0, alpha1, beta0, beta1, incentive_penalties: collaboration incentives, each agent's bonus added to
            its turn reward (:mod:`trainers.common.incentives`); they always read the env's answer labels.
        verifier, reward_model_path, reward_server_url: the env's answer label, or a learned verifier (its
            scores replace s_i^t; the incentives still use the labels, as MAPoRL does).

    Parameters that control the rollouts and the PPO update:
        episodes_per_step, num_generations, ppo_epochs, minibatch_size, critic_learning_rate, gae_gamma, gae_lambda,
        clip_eps, value_clip, vf_coef, entropy_coef, kl_estimator, recompute_old_logprobs, whiten_advantages,
        whiten_scope; and from
        :class:`~trainers.common.config.TrainerConfig`: learning_rate, weight_decay, max_grad_norm, kl_coef.

    Parameters that control the critic:
        critic_lora_r, critic_max_context_tokens, critic_layers, critic_depth, fused_critic_pass.

    Parameters that control generation, the run, evaluation, logging and scaling out (all from ``TrainerConfig``):
        max_new_tokens, temperature, top_p, max_steps, seed, eval_every, eval_tasks, eval_temperature,
        output_dir, save_every, save_every_minutes, save_total_limit, resume_from_checkpoint, report_to,
        logging_every, progress, mixed_precision, gradient_checkpointing, agent_devices, fsdp.

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
    alpha0: float = incentive_field("alpha0")
    alpha1: float = incentive_field("alpha1")
    beta0: float = incentive_field("beta0")
    beta1: float = incentive_field("beta1")
    incentive_penalties: bool = incentive_field("incentive_penalties")
    verifier: str = field(default="label", metadata={
        "help": f"Where scores come from, one of {VERIFIERS}: the env's answer-label verifier, or a learned reward "
                "model (set reward_model_path or reward_server_url)."})
    reward_model_path: str | None = field(
        default=None, metadata={"help": "Directory of a saved RewardModel (verifier='learned')."}
    )
    reward_server_url: str | None = field(
        default=None, metadata={"help": "URL of a running reward server (verifier='learned')."}
    )

    # ---------------------------------------------------------------- PPO
    episodes_per_step: int = field(
        default=4,
        metadata={
            "help": "Debate episodes collected per training step, over all processes "
            "(split between them under accelerate launch)."
        },
    )
    num_generations: int = field(default=1, metadata={
        "help": "Answers each agent samples per node of a task tree (G). 1: plain episodes (MAPoRL). With G > 1 "
                "each of the step's episodes_per_step tasks is played as a tree, as MAGRPO plays it: at every turn "
                "each node samples G answers per agent, the g-th answers act together (G children per node), so a "
                "node's samples share their prompt in sampling, in the actors' loss and, as the task part of its "
                "context, in the critic; an answer's reward is the mean over the finished episodes through it. A "
                "step samples episodes_per_step x N x (G + G^2 + ... + G^T) answers."})
    ppo_epochs: int = field(default=2, metadata={"help": "Passes over each step's responses."})
    minibatch_size: int = field(
        default=4,
        metadata={
            "help": "Responses (agent-turns) per gradient step, over all processes; "
            "also the forward batch of the advantage pass."
        },
    )
    critic_learning_rate: float = field(
        default=1e-4, metadata={"help": "AdamW learning rate of the critic's adapter and value head."}
    )
    gae_gamma: float = field(default=1.0, metadata={"help": "γ of token-level GAE inside a response."})
    gae_lambda: float = field(default=0.95, metadata={"help": "λ of token-level GAE inside a response."})
    clip_eps: float = field(default=0.2, metadata={"help": "PPO ratio clip ε."})
    value_clip: float = field(
        default=0.2, metadata={"help": "Clip range of the value update around the rollout values."}
    )
    vf_coef: float = field(default=0.5, metadata={"help": "Weight of the value loss in the total loss."})
    entropy_coef: float = field(default=0.0, metadata={"help": "Weight of the entropy bonus (0 = off)."})
    kl_estimator: str = field(
        default="k1", metadata={"help": f"KL estimator, one of {KL_ESTIMATORS} (see trainers.common.losses)."}
    )
    whiten_advantages: bool = field(
        default=True, metadata={"help": "Normalise advantages to zero mean, unit variance per step."}
    )
    recompute_old_logprobs: bool = field(default=False, metadata={
        "help": "Recompute log π_old with a forward pass under each agent's adapter instead of taking the log-probs "
                "the sampler computed while sampling (the same quantity up to float rounding; backends that report "
                "none are recomputed anyway)."})
    whiten_scope: str = field(default="turn_agent", metadata={
        "help": f"Which tokens share the whitening moments, one of {WHITEN_SCOPES}: 'turn_agent' (MAPoRL's reference "
                "code: each (turn, agent) group on its own) or 'all' (every agent and turn of the step together)."})

    # ---------------------------------------------------------------- critic
    critic_lora_r: int = field(
        default=8, metadata={"help": "LoRA rank of the critic's own adapter on the shared base."}
    )
    critic_max_context_tokens: int = field(default=768, metadata={
        "help": "The critic keeps the last this-many tokens of its context (task + debate so far)."})
    critic_layers: int | None = field(default=None, metadata={
        "help": "Decoder layers the critic's adapter adapts, counted from the top (None: every layer). With a "
                "number, the frozen layers below run once per step without gradients and every critic pass of "
                "the step (the values, the value loss) starts from their output."})
    critic_depth: int | None = field(default=None, metadata={
        "help": "Decoder layers of the shared base the critic runs, from the bottom (None: all of them): a shallower "
                "value model whose passes cost about critic_depth / (the base's layers) of a full one. The value "
                "head reads the final norm of layer critic_depth's output; critic_layers counts within these."})
    fused_critic_pass: bool = field(default=True, metadata={
        "help": "When one PPO epoch's one minibatch holds the whole step (ppo_epochs=1, minibatch_size >= the "
                "step's responses) and weights are not sharded, the critic's forward for the advantages also takes "
                "the value loss's gradient (chunk by chunk), so the update runs no critic forward: the same gradients, "
                "one critic pass a step instead of two. False: always two passes."})

    # ---------------------------------------------------------------- this trainer's defaults of shared fields
    max_new_tokens: int = trainer_default("max_new_tokens", 128)
    learning_rate: float = trainer_default("learning_rate", 1e-4)
    weight_decay: float = trainer_default("weight_decay", 0.01)
    kl_coef: float = trainer_default("kl_coef", 0.05, help=(
        "β of the per-token KL penalty to the reference (the base with adapters disabled), folded into the rewards; "
        "0 skips the reference forward (and its kl_ref metric)."))
    max_steps: int = trainer_default("max_steps", 10)
    output_dir: str = trainer_default("output_dir", "outputs/mappo")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            self.reward_rule in REWARD_RULES, f"reward_rule must be one of {REWARD_RULES}, got {self.reward_rule!r}"
        )
        require(0.0 <= self.reward_gamma <= 1.0, f"reward_gamma must be in [0, 1], got {self.reward_gamma}")
        require(
            self.future_mean in FUTURE_MEANS, f"future_mean must be one of {FUTURE_MEANS}, got {self.future_mean!r}"
        )
        require(
            self.whiten_scope in WHITEN_SCOPES,
            f"whiten_scope must be one of {WHITEN_SCOPES}, got {self.whiten_scope!r}",
        )
        require(self.verifier in VERIFIERS, f"verifier must be one of {VERIFIERS}, got {self.verifier!r}")
        if self.verifier == "learned":
            require((self.reward_model_path is None) != (self.reward_server_url is None),
                    "verifier='learned' needs exactly one of reward_model_path or reward_server_url")
        else:
            require(self.reward_model_path is None and self.reward_server_url is None,
                    "reward_model_path/reward_server_url are only used with verifier='learned'; set verifier='learned'")
        for name in ("episodes_per_step", "num_generations", "ppo_epochs", "minibatch_size", "critic_lora_r",
                     "critic_max_context_tokens"):
            require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        require(self.critic_layers is None or self.critic_layers >= 1,
                f"critic_layers must be None (every layer) or >= 1, got {self.critic_layers}")
        require(self.critic_depth is None or self.critic_depth >= 1,
                f"critic_depth must be None (every layer) or >= 1, got {self.critic_depth}")
        require(self.critic_layers is None or self.critic_depth is None or self.critic_layers <= self.critic_depth,
                f"critic_layers ({self.critic_layers}) counts adapted layers within critic_depth "
                f"({self.critic_depth}): it cannot be larger")
        # evaluate() plays held-out tasks only (trainers.common.evaluation.held_out_tasks): at least one
        require(self.eval_tasks >= 1, f"eval_tasks must be >= 1, got {self.eval_tasks}")
        for name in ("critic_learning_rate", "clip_eps", "value_clip"):
            require(getattr(self, name) > 0, f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("vf_coef", "entropy_coef"):
            require(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        require(0 <= self.gae_gamma <= 1 and 0 <= self.gae_lambda <= 1,
                f"gae_gamma and gae_lambda must be in [0, 1], got {self.gae_gamma}, {self.gae_lambda}")
        require(self.kl_estimator in KL_ESTIMATORS,
                f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")

    @property
    def incentives(self) -> IncentiveWeights:
        """The four incentive weights as one object."""
        return IncentiveWeights(self.alpha0, self.alpha1, self.beta0, self.beta1, penalties=self.incentive_penalties)


__all__ = ["MAPPOConfig", "VERIFIERS", "WHITEN_SCOPES"]
