"""MAGRPO with the experimental options: counterfactual credit, incentives, final-turn rewards, n-gram-free samples.

:class:`ExperimentalMAGRPOTrainer` is :class:`~trainers.magrpo.MAGRPOTrainer` with these hooks
filled in (the numbers are MAGRPO's steps):

- step 1, sampling: ``no_repeat_ngram = n > 0`` keeps every training sample free of repeats of its
  own token n-grams (the HF decode loop bans the token that would; other backends refuse it);
- step 2, rewards (:meth:`ExperimentalMAGRPOTrainer.shape_rewards`): with ``alpha0``/``alpha1`` each
  joint action's reward gains the mean over agents of MAPoRL's α bonuses of the turn just played
  (:func:`trainers.common.incentives.incentive_shaped`); with ``reward_turns="final"`` only the joint
  actions that end the episode keep their reward, so an earlier answer is credited through the
  discounted returns of the turns it leads to;
- steps 1-3, with ``credit="counterfactual"`` (C3-style, :mod:`trainers.experimental.counterfactual`):
  one transcript per task is sampled, and every message (turn t, agent i) is replayed with K
  alternatives from the frozen transcript up to it, the rest of each branch sampled afresh; the
  transcript's outcome R_0 and the alternatives' R_1..R_K form the message's group, whose advantages
  use MAGRPO's baselines (mean: ``A_k = R_k - mean(R_0..R_K)``). Step 4 is MAGRPO's (per turn, per
  agent).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from accelerate import Accelerator

from llm_marl.policy import SamplingParams
from llm_marl.rollout import Expansion
from llm_marl.team import Team
from llm_marl_envs.core import TextEnv

from ..common.config import require
from ..common.incentives import IncentiveWeights, incentive_field, incentive_shaped
from ..magrpo.config import MAGRPOConfig
from ..magrpo.trainer import MAGRPOTrainer, TreeNode, group_advantages, sample_diagnostics
from .counterfactual import TEAM_OUTCOMES, CounterfactualBatch, MessageReplay, collect_counterfactual, team_outcome

CREDITS = ("group", "counterfactual")
REWARD_TURNS = ("every", "final")
COUNTERFACTUAL_UPDATES = ("all", "transcript")


@dataclass
class ExperimentalMAGRPOConfig(MAGRPOConfig):
    """:class:`~trainers.magrpo.MAGRPOConfig` plus the experimental options (see the module docstring).

    Parameters that control sampling:
        no_repeat_ngram.
    Parameters that control credit and rewards:
        credit, counterfactual_samples, counterfactual_reward, counterfactual_update, reward_turns,
        alpha0, alpha1, incentive_penalties (MAPoRL's α incentives, :mod:`trainers.common.incentives`).
    """

    no_repeat_ngram: int = field(default=0, metadata={
        "help": "n > 0: training samples never repeat one of their own token n-grams (the HF decode loop bans the "
                "token that would; other backends refuse it), so a reward cannot be earned by looping text that "
                "the evaluation decoder would not produce (0: off)."})
    credit: str = field(default="group", metadata={
        "help": f"How messages are credited, one of {CREDITS}: 'group' (MAGRPO: G samples per agent per tree node, "
                "group-relative returns over the tree) or 'counterfactual' (C3-style: one transcript per task; each "
                "message's advantage is its effect on the team outcome, from K alternatives replayed from the frozen "
                "transcript; see trainers.experimental.counterfactual). With 'counterfactual', num_generations, "
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
    alpha0: float = incentive_field("alpha0")
    alpha1: float = incentive_field("alpha1")
    incentive_penalties: bool = incentive_field("incentive_penalties")

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.no_repeat_ngram >= 0, f"no_repeat_ngram must be >= 0 (0: off), got {self.no_repeat_ngram}")
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

    @property
    def incentives(self) -> IncentiveWeights:
        """The α incentive weights as one object."""
        return IncentiveWeights(alpha0=self.alpha0, alpha1=self.alpha1, penalties=self.incentive_penalties)


class ExperimentalMAGRPOTrainer(MAGRPOTrainer):
    """:class:`~trainers.magrpo.MAGRPOTrainer` with the options of :class:`ExperimentalMAGRPOConfig`."""

    def __init__(self, env: TextEnv, team: Team, config: ExperimentalMAGRPOConfig | None = None, *,
                 eval_env: TextEnv | None = None, accelerator: Accelerator | None = None) -> None:
        config = config or ExperimentalMAGRPOConfig()
        if not isinstance(config, ExperimentalMAGRPOConfig):
            raise ValueError(f"ExperimentalMAGRPOTrainer takes an ExperimentalMAGRPOConfig, got "
                             f"{type(config).__name__}; use MAGRPOTrainer for a plain MAGRPOConfig")
        self.incentives = config.incentives if config.incentives.any_nonzero else None
        if self.incentives and len(env.possible_agents) < 2:
            raise ValueError("alpha0/alpha1 incentives need at least 2 agents (they read the other agents' answers); "
                             "set them to 0")
        super().__init__(env, team, config, eval_env=eval_env, accelerator=accelerator)

    def sampling_params(self) -> SamplingParams:
        """MAGRPO's sampling settings with ``no_repeat_ngram``."""
        return replace(super().sampling_params(), no_repeat_ngram=self.config.no_repeat_ngram)

    # ------------------------------------------------------------------ incentives and final-turn rewards
    def shape_rewards(self, expansion: Expansion, joint_rewards: list[float]) -> list[float]:
        """Joint rewards plus the α incentives of the turn, then (``reward_turns="final"``) zero for every joint
        action that does not end the episode."""
        shaped = joint_rewards if self.incentives is None else incentive_shaped(expansion, joint_rewards,
                                                                                 self.incentives)
        if self.config.reward_turns == "final":         # only the episode's last joint actions keep a reward
            shaped = [r if done else 0.0 for r, done in zip(shaped, expansion.done)]
        return shaped

    def joint_reward_mean(self, roots: list[TreeNode]) -> float:
        """MAGRPO's headline reward; with ``reward_turns="final"`` (earlier turns' rewards are zeroed) the mean
        reward of the joint actions that end an episode."""
        if self.config.reward_turns != "final":
            return super().joint_reward_mean(roots)
        return self.final_joint_reward_mean(roots)

    # ------------------------------------------------------------------ counterfactual credit
    def run_step(self, step: int) -> dict[str, float]:
        """MAGRPO's step, or with ``credit="counterfactual"``: transcripts and their replays, then step 4 on every
        message with its counterfactual advantage."""
        cfg = self.config
        if cfg.credit != "counterfactual":
            return super().run_step(step)
        started = time.perf_counter()
        with self.accelerator.autocast(), self.distributed.full_weights():   # sharded weights gathered for sampling
            batch = self.collect_counterfactual()
        rollout_time = time.perf_counter() - started
        metrics = self.update_counterfactual(batch)
        outcomes = [team_outcome(t.rewards, cfg.counterfactual_reward) for t in batch.transcripts]

        def transcripts_reward_mean(turn: int) -> float:       # the transcripts' mean reward at ``turn``
            return float(np.mean([r for t in batch.transcripts for r in t.rewards[turn].values()]))

        metrics.update({"joint_reward_mean": transcripts_reward_mean(0),
                        "final_joint_reward_mean": transcripts_reward_mean(-1),
                        "team_outcome_mean": float(np.mean(outcomes))})
        return self.step_metrics(metrics, started, rollout_time, batch.completions_sampled,
                                 batch.answer_tokens_sampled)

    def collect_counterfactual(self) -> CounterfactualBatch:
        """One transcript per task, then K replayed alternatives per message."""
        cfg = self.config
        batch = collect_counterfactual(self.engine, self.step_roots(), cfg.counterfactual_samples, self.sampling,
                                       cfg.counterfactual_reward)
        self.engine.clear_caches()                 # every branch is finished: nothing extends its KV caches
        return batch

    def counterfactual_advantages(self, replay: MessageReplay) -> torch.Tensor:
        """The K+1 advantages of a message's group: the transcript's message first, then its alternatives."""
        cfg = self.config
        outcomes = torch.tensor(replay.outcomes, dtype=torch.float64)     # R_0 (transcript), R_1..R_K
        return group_advantages(outcomes, cfg.advantage_mode, cfg.normalize_advantages, cfg.advantage_std_floor)

    def update_counterfactual(self, batch: CounterfactualBatch) -> dict[str, float]:
        """Step 4 for ``credit="counterfactual"``: per turn (in ``update_order``), per agent, REINFORCE on its
        messages weighted by their counterfactual advantages; returns local metrics."""
        cfg, metrics = self.config, {}
        by_turn: dict[int, list[MessageReplay]] = {}
        for replay in batch.replays:
            by_turn.setdefault(replay.turn, []).append(replay)
        num_turns = self.distributed.max(max(by_turn, default=-1) + 1)    # every process steps through the same turns
        order = range(num_turns - 1, -1, -1) if cfg.update_order == "last_turn_first" else range(num_turns)
        for turn in order:
            replays = by_turn.get(turn, [])
            per_agent = {}
            for agent in self.agents:
                mine = [replay for replay in replays if replay.agent == agent]
                advantages = [self.counterfactual_advantages(replay) for replay in mine]
                if cfg.counterfactual_update == "transcript":
                    advantages = [adv[:1] for adv in advantages]
                trained = [[replay.actual, *replay.alternatives][:len(adv)] for replay, adv in zip(mine, advantages)]
                per_agent[agent] = (mine, advantages, trained)
            for leader, group in self.update_groups.items():   # one step per group on all its agents' messages
                rows = [(g.prompt_ids, g.completion_ids, float(a)) for agent in group
                        for messages, adv in zip(per_agent[agent][2], per_agent[agent][1])
                        for g, a in zip(messages, adv)]
                metrics.update(self._update_agent(leader, turn, rows))
            for agent, (mine, advantages, trained) in per_agent.items():
                if not mine:
                    continue
                credits = [float(adv[0]) for adv in advantages]          # the transcript messages' credit
                values = torch.cat(advantages)
                own_rewards = [batch.transcripts[r.transcript].rewards[turn][agent] for r in mine]
                prefix = f"turn{turn}/{agent}"
                metrics.update({
                    f"{prefix}/reward_mean": float(np.mean(own_rewards)),
                    f"{prefix}/reward_std": float(np.std(own_rewards)),
                    f"{prefix}/credit_mean": float(np.mean(credits)),
                    f"{prefix}/credit_abs_mean": float(np.mean(np.abs(credits))),
                    f"{prefix}/outcome_spread": float(np.mean([max(r.outcomes) - min(r.outcomes) for r in mine])),
                    f"{prefix}/advantage_mean": float(values.mean()),
                    f"{prefix}/advantage_std": float(values.std()) if values.numel() > 1 else 0.0})
                metrics.update({f"{prefix}/{k}": v for k, v in sample_diagnostics(
                    [g for messages in trained for g in messages], advantages).items()})
            if replays:
                rewards = [batch.transcripts[r.transcript].rewards[turn] for r in replays]
                metrics[f"turn{turn}/joint_reward_mean"] = float(np.mean([v for r in rewards for v in r.values()]))
        return metrics


__all__ = ["ExperimentalMAGRPOConfig", "ExperimentalMAGRPOTrainer", "CREDITS", "REWARD_TURNS",
           "COUNTERFACTUAL_UPDATES", "TEAM_OUTCOMES"]
