"""A compute-matched collaboration study: does multi-agent training teach a debate team to use its second turn?

Every arm starts from the same base model, seed, learning rate, steps, sampling settings and KL weight to
the base (``kl_coef``, 0 by default in every arm), trains one LoRA adapter per trained policy, and samples
**the same number of completions per training step** (:func:`matched_batches` sets each arm's batch so; a
shape that cannot be matched is a ``ValueError`` saying why). The answer tokens actually sampled are
counted in every arm (:class:`SamplingCounter`) and reported beside the completions.

- ``untrained``: nothing trains; the base model sits in every seat.
- ``solo``: one agent trains alone (1 agent, 1 turn) with MAGRPO, then sits in every seat;
  ``C / G`` prompts × G answers per step.
- ``shared``: one policy in every seat, trained by TRL's ``GRPOTrainer`` (:mod:`trainers.trl_bridge`);
  ``P`` tasks × ``C / P`` rows (whole debates) per step.
- ``magrpo``: one adapter per agent, MAGRPO with aligned joint actions; ``P`` task trees per step.
- ``mappo``: one adapter per agent, MAPPO with a centralized critic; ``C / (N·T)`` debates per step.
- ``counterfactual``: one adapter per agent, MAGRPO with counterfactual per-message credit
  (:mod:`trainers.experimental.counterfactual`); transcripts per step such that transcripts and replays make ``C``.

Levers, arms run only when named (``arms=(..., "magrpo_incentives")``):

- ``magrpo_incentives``: the ``magrpo`` arm with MAPoRL's incentives on the tree's joint rewards
  (α0 = α1 = 0.2 with penalties: a right answer kept or found against the partner earns 0.2, a right
  answer turned wrong costs 0.2); the same batch as ``magrpo``.
- ``magrpo_final_turn``: the ``magrpo`` arm rewarding the final turn only (``reward_turns="final"``):
  a first answer is credited only through the discounted outcome of the second turn it leads to.
- ``magrpo_after_solo``: the first half of the steps as the ``solo`` arm (one adapter, single answers,
  its batch), then both seats start from that adapter and train as ``magrpo_final_turn`` for the rest.
- ``magrpo_one_adapter``: ``magrpo_final_turn`` with parameter sharing: both seats act with one LoRA
  adapter (``Team.shared_adapter``), stepped once per turn on both agents' samples; the same batch as ``magrpo``.
- ``magrpo_after_solo_scores``: ``magrpo_after_solo`` in a debate with ``show_scores=True`` (each agent
  reads the verifier's score of the other agent's previous answer), in training and in evaluation.
- ``solo_scores``: the ``solo`` arm's trained adapter (nothing trains again) seated in that
  ``show_scores`` debate: the single-policy control a ``show_scores`` team is compared with.

``C = P · N · (G + G² + … + G^T)``: the completions MAGRPO samples per step for ``P`` prompts, N agents,
T turns and G samples per tree node.

Each trained arm is seated in the debate (a 2-agent, 2-turn ``arithmetic_debate-v0`` by default) and
played on the same held-out test tasks: greedily, sampled at the training temperature, as a majority
vote of ``N·T`` independent answers (the debate's token budget), and greedily on a harder set no arm
trained on (three 2-digit numbers added). The untrained team is played once. Per arm and setting:
turn-0 and final-turn accuracy, the team answer (majority of final answers), the **collaboration gain**
(final-turn − turn-0 accuracy of the same episodes, paired by task), and the transitions with the fix and
break rates (the summary of :class:`trainers.common.evaluation.HeldOutScores`); between arms, paired
differences by task with 95% bootstrap intervals. Each arm's evaluation is stored as it finishes, so an
interrupted study resumes at the next arm. The command is :mod:`studies.collaboration.run`; the log of what
it found is ``studies/collaboration/README.md``.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from llm_marl.backends.hf import rename_adapter
from llm_marl.files import write_text_atomically
from llm_marl.team_checkpoint import save_team
from studies.arms import check_jobs, log_matching, run_arms
from trainers.common.evaluation import HeldOutScores, paired_interval
from trainers.common.experiment import plot_seed_points, seed_spread
from trainers.experimental.counterfactual import completions_per_transcript

ARMS = ("untrained", "solo", "shared", "magrpo", "mappo", "counterfactual")
TRAINED_ARMS = ARMS[1:]
LEVERS = {"magrpo_incentives": {"alpha0": 0.2, "alpha1": 0.2, "incentive_penalties": True},
          "magrpo_final_turn": {"reward_turns": "final"},
          "magrpo_one_adapter": {"reward_turns": "final"},
          "magrpo_after_solo": {"reward_turns": "final"},
          "magrpo_after_solo_scores": {"reward_turns": "final"}}   # each lever's ExperimentalMAGRPOConfig settings
ONE_ADAPTER_ARMS = ("magrpo_one_adapter",)   # lever arms whose seats act and train with one shared LoRA adapter
SOLO_FIRST_ARMS = ("magrpo_after_solo", "magrpo_after_solo_scores")   # the first half of their steps as solo
DEBATE_SETTINGS = {"magrpo_after_solo_scores": {"show_scores": True},  # arms whose debate env differs from the
                   "solo_scores": {"show_scores": True}}               # study's: its keyword arguments
REPLAYED_ARMS = {"solo_scores": "solo"}   # arms that train nothing: another arm's adapters seated in their own debate
SAME_DEBATE_CONTROL = {"magrpo_after_solo_scores": "solo_scores"}   # the single-policy control of an arm's debate
LEVER_ARMS = (*LEVERS, *REPLAYED_ARMS)
MULTI_AGENT_ARMS = ("magrpo", "mappo", "counterfactual", *LEVERS)
SINGLE_POLICY_ARMS = ("solo", "shared", *REPLAYED_ARMS)
SETTINGS = ("greedy", "sampled", "vote", "hard")
SHARED_MICRO_BATCH = 8   # rows per forward and backward of the shared arm's TRL trainer


@dataclass
class StudyConfig:
    """Settings shared by every arm of the study (see the module docstring for the arms)."""

    env: str = "arithmetic_debate-v0"
    model: str = "smollm2-135m"
    num_agents: int = 2
    num_turns: int = 2
    num_generations: int = 4          # G: MAGRPO's samples per agent per tree node; sets C, the completions per step
    prompts_per_step: int = 1         # P: MAGRPO's task trees per step
    steps: int = 20
    learning_rate: float = 2e-4
    kl_coef: float = 0.0              # β of every arm's KL to the base model (0: none, and no reference forward)
    temperature: float = 0.7
    top_p: float = 0.9
    max_new_tokens: int = 40
    counterfactual_samples: int = 2   # K: alternatives replayed per message by the counterfactual arm
    eval_tasks: int = 200
    samples: int = 1                  # sampled plays per held-out task
    hard_tasks: int = 100
    seed: int = 0
    arms: tuple[str, ...] = ARMS
    evaluate: tuple[str, ...] = SETTINGS   # held-out settings played per arm (seed repeats may play "greedy" only)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.arms = tuple(self.arms)
        self.evaluate = tuple(self.evaluate)
        if "greedy" not in self.evaluate or any(s not in SETTINGS for s in self.evaluate):
            raise ValueError(f"evaluate must name settings from {SETTINGS} and include 'greedy' (the research bar's "
                             f"setting), got {self.evaluate}")
        unknown = [a for a in self.arms if a not in (*ARMS, *LEVER_ARMS)]
        if unknown:
            raise ValueError(f"unknown arm(s) {unknown}; choose from {ARMS} or the levers {LEVER_ARMS}")
        if "untrained" not in self.arms:
            self.arms = ("untrained", *self.arms)    # every comparison is paired against the untrained team
        for arm, source in REPLAYED_ARMS.items():     # a replayed arm seats its source's adapters: source first
            if arm in self.arms and (source not in self.arms or self.arms.index(source) > self.arms.index(arm)):
                self.arms = tuple(a for a in self.arms if a != source)
                self.arms = (*self.arms[:self.arms.index(arm)], source, *self.arms[self.arms.index(arm):])
        for name in ("num_agents", "num_turns", "prompts_per_step", "steps", "max_new_tokens", "eval_tasks",
                     "hard_tasks", "counterfactual_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_agents < 2 or self.num_turns < 2:
            raise ValueError(f"a collaboration study needs a debate: num_agents >= 2 and num_turns >= 2, got "
                             f"{self.num_agents} agents x {self.num_turns} turns")
        if self.num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (a group-relative baseline needs two samples), got "
                             f"{self.num_generations}")
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1 (sampled plays per held-out task), got {self.samples}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if not 0 < self.temperature:
            raise ValueError(f"temperature must be > 0 (the arms train by sampling), got {self.temperature}")

    @property
    def completions_per_step(self) -> int:
        """C: what MAGRPO samples per step, and so what every trained arm samples per step."""
        g, t = self.num_generations, self.num_turns
        return self.prompts_per_step * self.num_agents * sum(g ** k for k in range(1, t + 1))

    def key(self) -> str:
        """A digest of every setting that changes what an arm learns or how its held-out tasks are played (resuming
        checks it; which settings are played is checked apart, so a record that played more is reused)."""
        settings = {k: v for k, v in asdict(self).items() if k not in ("arms", "evaluate")}
        return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ArmBatch:
    """How one arm is matched: its per-step batch settings and the completions they sample per step."""

    arm: str
    completions_per_step: int
    settings: dict[str, int]
    how: str


def matched_batches(config: StudyConfig) -> dict[str, ArmBatch]:
    """Each trained arm's per-step batch, all sampling ``config.completions_per_step`` completions per step.

    A shape whose batches cannot all equal that count raises ``ValueError`` naming the arm and why.
    """
    c, g, n, t = config.completions_per_step, config.num_generations, config.num_agents, config.num_turns
    per_task = c // config.prompts_per_step
    batches = {arm: ArmBatch(arm, c, {"prompts_per_step": config.prompts_per_step, "num_generations": g},
                             f"{config.prompts_per_step} task tree(s) x N·(G+…+G^T) = {per_task} completions")
               for arm in ("magrpo", *LEVERS)}
    if c % g:
        raise ValueError(f"solo cannot be matched: C={c} completions per step is not a multiple of G={g}")
    batches["solo"] = ArmBatch("solo", c, {"prompts_per_step": c // g, "num_generations": g},
                               f"{c // g} prompts x G={g} answers (1 agent, 1 turn)")
    for arm, source in REPLAYED_ARMS.items():
        batches[arm] = replace(batches[source], arm=arm,
                               how=f"{source}'s trained adapters, seated in its own debate (no training of its own; "
                                   f"{source}: {batches[source].how})")
    for arm in SOLO_FIRST_ARMS:
        first = config.steps // 2
        batches[arm] = replace(batches[arm], how=f"{first} step(s) as solo ({batches['solo'].how}), then "
                                                 f"{config.steps - first} of the magrpo tree ({batches[arm].how})")
    if per_task % (n * t):
        raise ValueError(f"shared and mappo cannot be matched: {per_task} completions per task is not a whole number "
                         f"of {n}x{t} debates ({n * t} answers each); choose G and T so that N·(G+…+G^T) is a "
                         f"multiple of N·T")
    batches["shared"] = ArmBatch("shared", c, {"tasks_per_step": config.prompts_per_step, "rows_per_task": per_task},
                                 f"{config.prompts_per_step} task(s) x {per_task // (n * t)} whole debates "
                                 f"({per_task} rows)")
    batches["mappo"] = ArmBatch("mappo", c, {"episodes_per_step": c // (n * t)},
                                f"{c // (n * t)} debates x {n * t} answers")
    cost = completions_per_transcript(n, t, config.counterfactual_samples)
    if c % cost:
        raise ValueError(f"counterfactual cannot be matched: one transcript with K={config.counterfactual_samples} "
                         f"replays per message costs {cost} completions, which does not divide C={c}; change K "
                         f"(counterfactual_samples) or G")
    batches["counterfactual"] = ArmBatch("counterfactual", c, {"transcripts_per_step": c // cost,
                                                               "counterfactual_samples": config.counterfactual_samples},
                                         f"{c // cost} transcript(s) x {cost} completions (messages + replays)")
    return {arm: batches[arm] for arm in config.arms if arm in batches}


# ------------------------------------------------------------------------------------------------ counting
class SamplingCounter:
    """Counts the completions and answer tokens every HF policy samples while it is active (one process)."""

    def __init__(self) -> None:
        self.completions = 0
        self.answer_tokens = 0
        self.calls = 0

    @contextlib.contextmanager
    def active(self) -> Iterator[SamplingCounter]:
        """Count every ``HFPolicy.generate`` call made inside the block (the one place all arms sample)."""
        from llm_marl.backends.hf import HFPolicy

        original = HFPolicy.generate
        counter = self

        def counted(policy, conversations, params, **kwargs):
            out = original(policy, conversations, params, **kwargs)
            counter.calls += 1
            for generations in out:
                counter.completions += len(generations)
                counter.answer_tokens += sum(g.num_tokens for g in generations)
            return out

        HFPolicy.generate = counted
        try:
            yield self
        finally:
            HFPolicy.generate = original

    def to_dict(self) -> dict[str, int]:
        return {"completions": self.completions, "answer_tokens": self.answer_tokens, "generate_calls": self.calls}


# ------------------------------------------------------------------------------------------------ models
def base_model(config: StudyConfig) -> tuple[Any, Any]:
    """A fresh ``(model, tokenizer)`` of the study's base (the same weights for every arm)."""
    from llm_marl.models import load

    return load(config.model)


def make_env(config: StudyConfig, split: str, *, agents: int | None = None, turns: int | None = None,
             **kwargs: Any) -> Any:
    import llm_marl_envs

    return llm_marl_envs.make(config.env, num_agents=agents or config.num_agents, num_turns=turns or config.num_turns,
                              split=split, **kwargs)


# ------------------------------------------------------------------------------------------------ training
@dataclass
class TrainedArm:
    """What training one arm leaves: each debate seat's adapter tensors (named ``agent_i``), counts, history."""

    seats: dict[str, dict[str, Any]]
    counts: dict[str, int]
    seconds: float
    history: list[dict[str, Any]]


def _trainer_config_kwargs(config: StudyConfig, out: Path) -> dict[str, Any]:
    return {"max_steps": config.steps, "learning_rate": config.learning_rate, "kl_coef": config.kl_coef,
            "temperature": config.temperature, "top_p": config.top_p, "max_new_tokens": config.max_new_tokens,
            "seed": config.seed,
            "output_dir": str(out), "eval_tasks": 1, "save_every": 0, "report_to": ("jsonl",),
            "progress": True}


def train_arm(arm: str, config: StudyConfig, batch: ArmBatch, out: Path) -> TrainedArm:
    """Train one arm from the base model; its seats' adapter tensors come back named ``agent_0 … agent_{N-1}``."""
    import torch

    from llm_marl.team import Team, default_lora_config

    torch.manual_seed(config.seed)
    seats = [f"agent_{i}" for i in range(config.num_agents)]
    model, tokenizer = base_model(config)
    counter = SamplingCounter()
    started = time.perf_counter()
    if arm == "shared":
        from trl import GRPOConfig

        from llm_marl.backends.hf import HFPolicy
        from trainers.trl_bridge import make_grpo_trainer

        rows = batch.settings["rows_per_task"]
        total = batch.settings["tasks_per_step"] * rows
        # one generation of all rows per optimizer step, in micro-batches of at most 8 rows: the whole batch at once
        # without gradient checkpointing (TRL's default, which recomputes every forward) needs about 20 GB
        micro = max(d for d in range(1, min(total, SHARED_MICRO_BATCH) + 1) if total % d == 0)
        args = GRPOConfig(output_dir=str(out), num_generations=rows, max_steps=config.steps,
                          per_device_train_batch_size=micro, gradient_accumulation_steps=total // micro,
                          learning_rate=config.learning_rate, max_completion_length=config.max_new_tokens,
                          temperature=config.temperature, top_p=config.top_p, beta=config.kl_coef,
                          scale_rewards="none", report_to="none", save_strategy="no", logging_steps=1,
                          seed=config.seed, bf16=False, use_cpu=not torch.cuda.is_available(), disable_tqdm=False,
                          gradient_checkpointing=False)
        trainer = make_grpo_trainer(make_env(config, "train"), model, tokenizer, args,
                                    peft_config=default_lora_config())
        with counter.active():
            trainer.train()
        history = [dict(r) for r in trainer.state.log_history]
        trained = trainer.accelerator.unwrap_model(trainer.model)
        state = HFPolicy(trained, tokenizer, name="shared").trainable_state_dict("default")
        seat_states = {seat: rename_adapter(state, "default", seat) for seat in seats}
    else:
        from trainers.experimental import ExperimentalMAGRPOConfig, ExperimentalMAGRPOTrainer
        from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

        common = _trainer_config_kwargs(config, out)
        solo_history: list[dict[str, Any]] = []
        def solo_trainer(team: Any, settings: dict[str, Any], **overrides: Any) -> Any:
            """MAGRPO of one agent answering alone (1 agent, 1 turn): the solo arm's training."""
            return MAGRPOTrainer(make_env(config, "train", agents=1, turns=1), team,
                                 MAGRPOConfig(**{**common, **overrides}, **settings, micro_batch_size=32))

        def debate_trainer(team: Any, **overrides: Any) -> Any:
            """MAGRPO of the whole debate (in the arm's own debate settings) with the arm's batch and lever."""
            return ExperimentalMAGRPOTrainer(make_env(config, "train", **DEBATE_SETTINGS.get(arm, {})), team,
                                             ExperimentalMAGRPOConfig(**{**common, **overrides}, **batch.settings,
                                                                      **LEVERS.get(arm, {}), micro_batch_size=32))

        if arm == "solo":
            team = Team.adapter_per_agent(model, tokenizer, ["agent_0"], name=config.model)
            trainer = solo_trainer(team, batch.settings)
        elif arm in SOLO_FIRST_ARMS:
            team = Team.adapter_per_agent(model, tokenizer, seats, name=config.model)
            policy, first = team.policy(seats[0]), config.steps // 2
            if first:       # phase 1: the solo arm's batches, one adapter; then every seat starts from it
                solo = solo_trainer(Team.from_policies({seats[0]: (policy, seats[0])}),
                                    matched_batches(replace(config, arms=("solo",)))["solo"].settings,
                                    max_steps=first, output_dir=str(out / "solo"))
                with counter.active():
                    solo_history = [{**row, "phase": "solo"} for row in solo.train()]
                for seat in seats[1:]:
                    policy.copy_adapter(seats[0], seat)
            trainer = debate_trainer(team, max_steps=config.steps - first, output_dir=str(out / "debate"))
        elif arm in ("magrpo", *LEVERS):
            team = (Team.shared_adapter(model, tokenizer, seats, name=config.model) if arm in ONE_ADAPTER_ARMS
                    else Team.adapter_per_agent(model, tokenizer, seats, name=config.model))
            trainer = debate_trainer(team)
        elif arm == "counterfactual":
            team = Team.adapter_per_agent(model, tokenizer, seats, name=config.model)
            settings = dict(batch.settings)
            cf = ExperimentalMAGRPOConfig(**common, credit="counterfactual",
                                          prompts_per_step=settings["transcripts_per_step"],
                                          counterfactual_samples=settings["counterfactual_samples"],
                                          num_generations=config.num_generations, micro_batch_size=32,
                                          kl_placement="loss" if config.kl_coef else "reward")   # no KL reward here
            trainer = ExperimentalMAGRPOTrainer(make_env(config, "train"), team, cf)
        elif arm == "mappo":
            from trainers.mappo import MAPPOConfig, MAPPOTrainer

            team = Team.adapter_per_agent(model, tokenizer, seats, name=config.model)
            mappo = MAPPOConfig(**common, **batch.settings, ppo_epochs=1, minibatch_size=16,
                                critic_learning_rate=1e-4, reward_gamma=0.3, alpha1=0.2, beta1=0.2)
            trainer = MAPPOTrainer(make_env(config, "train"), team, mappo)
        else:
            raise ValueError(f"unknown trained arm {arm!r}; choose from {TRAINED_ARMS + tuple(LEVERS)}")
        with counter.active():
            history = solo_history + [{**row, "phase": "debate"} if solo_history else row for row in trainer.train()]
        if arm == "solo":
            state = team.policy("agent_0").trainable_state_dict("agent_0")
            seat_states = {seat: rename_adapter(state, "agent_0", seat) for seat in seats}
        else:
            seat_states = {seat: rename_adapter(team.policy(seat).trainable_state_dict(team.adapter(seat)),
                                                team.adapter(seat), seat) for seat in seats}
    return TrainedArm(seat_states, counter.to_dict(), time.perf_counter() - started, list(history))


# ------------------------------------------------------------------------------------------------ evaluation
class Evaluator:
    """One base model with one adapter per debate seat: every arm's seats are loaded into it and played."""

    def __init__(self, config: StudyConfig) -> None:
        from llm_marl.team import Team

        self.config = config
        self.seats = [f"agent_{i}" for i in range(config.num_agents)]
        model, tokenizer = base_model(config)
        self.team = Team.adapter_per_agent(model, tokenizer, self.seats, name=config.model)
        self.policy = self.team.policy(self.seats[0])
        self.untrained = {seat: self.policy.trainable_state_dict(seat) for seat in self.seats}
        self._envs_by_debate: dict[str, dict[str, Any]] = {}
        self.use_debate({})
        for name in ("debate", "vote"):
            if len(self.envs[name].tasks) < config.eval_tasks:
                raise ValueError(f"{config.env}'s test split has {len(self.envs[name].tasks)} tasks, fewer than "
                                 f"eval_tasks={config.eval_tasks}")

    def make_envs(self, debate: dict[str, Any]) -> dict[str, Any]:
        """The held-out envs of every setting, the debates built with the keyword arguments ``debate`` (the vote is
        one turn of independent answers, which no debate argument changes)."""
        c = self.config
        return {"debate": make_env(c, "test", **debate),
                "vote": make_env(c, "test", agents=c.num_agents * c.num_turns, turns=1),
                "hard": make_env(c, "test", min_terms=3, max_terms=3, num_tasks=max(500, c.hard_tasks), **debate)}

    def use_debate(self, debate: dict[str, Any]) -> None:
        """Play the next arm in debates built with ``debate`` (e.g. ``{"show_scores": True}``; ``{}``: the study's)."""
        key = json.dumps(debate, sort_keys=True)
        if key not in self._envs_by_debate:
            self._envs_by_debate[key] = self.make_envs(debate)
        self.envs = self._envs_by_debate[key]

    def load(self, seats: dict[str, dict[str, Any]]) -> None:
        """Put an arm's adapter tensors on the seats."""
        for seat in self.seats:
            self.policy.load_trainable_state_dict(seat, seats[seat])

    def team_for(self, env: Any) -> Any:
        """The seats of ``env``'s agents: agent j plays with the adapter of debate seat ``j mod N``."""
        from llm_marl.team import Team

        return Team.from_policies({agent: (self.policy, self.seats[j % len(self.seats)])
                                   for j, agent in enumerate(env.possible_agents)})

    def play(self, out: Path, label: str = "") -> dict[str, Any]:
        """Every setting's per-task scores (:meth:`HeldOutScores.to_arrays`), and each setting's report.html under
        ``out``."""
        from llm_marl.policy import SamplingParams
        from llm_marl.rollout import RolloutEngine
        from trainers.common.evaluation import evaluate_episodes, scores_from

        c = self.config
        plan = {"greedy": ("debate", c.eval_tasks, 1, 0.0),
                "sampled": ("debate", c.eval_tasks, c.samples, c.temperature),
                "vote": ("vote", c.eval_tasks, 1, c.temperature), "hard": ("hard", c.hard_tasks, 1, 0.0)}
        scores = {}
        self.policy.model.eval()
        for setting in c.evaluate:
            env_name, num_tasks, samples, temperature = plan[setting]
            env = self.envs[env_name]
            tasks = list(range(num_tasks))
            played = [task for task in tasks for _ in range(samples)]
            seeds = [c.seed + 1_000 * i + s for i in range(num_tasks) for s in range(samples)]
            params = SamplingParams(max_new_tokens=c.max_new_tokens, temperature=temperature, top_p=c.top_p,
                                    seed=c.seed)
            engine = RolloutEngine(env, self.team_for(env))
            result = evaluate_episodes(engine, None, None, played, seeds, params, desc=f"{label} {setting}".strip(),
                                       report_path=out / setting / "report.html")
            scores[setting] = scores_from(result, tasks, samples, temperature).to_arrays()
        return scores


# ------------------------------------------------------------------------------------------------ summaries
def setting_summary(scores: dict[str, Any]) -> dict[str, Any]:
    """The summary of one setting's stored per-task scores (:meth:`HeldOutScores.to_dict`: turn-0, final-turn and
    team-answer accuracy, collaboration gain, transitions with the fix and break rates)."""
    return HeldOutScores.from_arrays(scores).to_dict()


def arm_summary(scores: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every setting's summary, and whether the sampled debate's team answer beats the vote of the same policy."""
    out = {setting: setting_summary(scores[setting]) for setting in SETTINGS if setting in scores}
    if "sampled" in scores and "vote" in scores:
        out["debate_minus_vote"] = paired_interval(scores["sampled"]["team"], scores["vote"]["team"])
    return out


def comparisons(arm_scores: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Paired differences by task: each multi-agent arm against ``solo``, ``shared`` and ``untrained``, each lever
    arm against ``magrpo`` (final turn and team answer), each single policy against ``untrained``, and ``shared``
    against ``solo`` (the same budget on one policy, trained on whole debates or on single answers)."""
    out = {}
    for arm in MULTI_AGENT_ARMS:
        for base in (*SINGLE_POLICY_ARMS, "untrained", *(("magrpo",) if arm in LEVERS else ())):
            if base in REPLAYED_ARMS and SAME_DEBATE_CONTROL.get(arm) != base:
                continue     # a control in another debate is compared only with the arms of that debate
            if arm not in arm_scores or base not in arm_scores:
                continue
            out[f"{arm} - {base}"] = {
                setting: {"final_turn_accuracy": paired_interval(arm_scores[arm][setting]["final"],
                                                         arm_scores[base][setting]["final"]),
                          "team_answer_accuracy": paired_interval(arm_scores[arm][setting]["team"],
                                                          arm_scores[base][setting]["team"])}
                for setting in ("greedy", "sampled", "hard") if setting in arm_scores[arm]}
    single_pairs = [(arm, "untrained") for arm in SINGLE_POLICY_ARMS if arm not in REPLAYED_ARMS]
    for arm, base in (*single_pairs, ("shared", "solo")):
        if arm in arm_scores and base in arm_scores:
            out[f"{arm} - {base}"] = {setting: {"final_turn_accuracy": paired_interval(
                arm_scores[arm][setting]["final"], arm_scores[base][setting]["final"])}
                for setting in ("greedy", "sampled", "hard") if setting in arm_scores[arm]}
    return out


def research_bar(summaries: dict[str, Any], paired: dict[str, Any]) -> dict[str, Any]:
    """Issue's bar per multi-agent arm (greedy): gain CI > 0, final above solo (CI > 0), I→C above C→I.

    An arm that debates in another setting (``show_scores``) is held to ``solo`` both in the study's debate and in its
    own (:data:`SAME_DEBATE_CONTROL`): the bar needs both."""
    out = {}
    for arm in MULTI_AGENT_ARMS:
        if arm not in summaries or f"{arm} - solo" not in paired:
            continue
        greedy = summaries[arm]["greedy"]
        checks = {"collaboration_gain_above_0": greedy["collaboration_gain"]["low"] > 0,
                  "final_above_solo": paired[f"{arm} - solo"]["greedy"]["final_turn_accuracy"]["low"] > 0,
                  "i_to_c_above_c_to_i": greedy["transitions"]["i_to_c"] > greedy["transitions"]["c_to_i"]}
        control = SAME_DEBATE_CONTROL.get(arm)
        if control is not None:
            same = paired.get(f"{arm} - {control}")
            checks[f"final_above_{control}"] = bool(same and same["greedy"]["final_turn_accuracy"]["low"] > 0)
        out[arm] = {**checks, "met": all(checks.values())}
    return out


def summary_figure(summaries: dict[str, Any], path: Path) -> Path:
    """Arms side by side: turn-0 against final-turn accuracy with 95% CIs, greedy and sampled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(summaries)
    settings = [s for s in ("greedy", "sampled") if s in summaries[arms[0]]]
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4.2), sharey=True, squeeze=False)
    for ax, setting in zip(axes[0], settings):
        for offset, (key, label, color) in enumerate((("turn0_accuracy", "turn 0", "0.6"),
                                                      ("final_turn_accuracy", "final turn", "C0"))):
            entries = [summaries[a][setting][key] for a in arms]
            means = np.array([e["mean"] for e in entries])
            errors = [means - [e["low"] for e in entries], np.array([e["high"] for e in entries]) - means]
            ax.bar(np.arange(len(arms)) + (offset - 0.5) * 0.38, means, 0.38, yerr=errors, capsize=3, color=color,
                   label=label)
        for i, arm in enumerate(arms):
            gain = summaries[arm][setting]["collaboration_gain"]
            ax.annotate(f"{gain['mean']:+.3f}", (i, 0.02), ha="center", fontsize=8)
        ax.set_xticks(np.arange(len(arms)), arms, rotation=20)
        ax.set_ylim(0, 1)
        ax.set_title(f"{setting} debates")
        ax.legend(loc="upper left", fontsize=8)
    axes[0][0].set_ylabel("fraction of agents right (95% CI)")
    fig.suptitle("held-out accuracy per arm; the number under each pair is the collaboration gain (final − turn 0)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def format_table(summaries: dict[str, Any], setting: str = "greedy") -> str:
    """A Markdown table of one setting: one row per arm."""
    def ci(e: dict[str, float]) -> str:
        return f"{e['mean']:.3f} [{e['low']:.3f}, {e['high']:.3f}]"

    lines = [f"| arm ({setting}) | turn 0 | final turn | team answer | collaboration gain | I→C | C→I |",
             "|---|---|---|---|---|---|---|"]
    for arm, summary in summaries.items():
        s = summary[setting]
        lines.append(f"| {arm} | {ci(s['turn0_accuracy'])} | {ci(s['final_turn_accuracy'])} | "
                     f"{ci(s['team_answer_accuracy'])} | {ci(s['collaboration_gain'])} | "
                     f"{s['transitions']['i_to_c']} | {s['transitions']['c_to_i']} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the study
# Expected cost of each arm relative to the others (training + evaluation on one core): parallel jobs start the
# dearest arms first so that the cheap ones fill in around them.
ARM_COST_ORDER = ("mappo", "shared", "counterfactual", "magrpo", *LEVER_ARMS, "untrained", "solo")


def seated_adapters(team_dir: Path, seats: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each seat's adapter tensors from the last seated checkpoint in ``team_dir`` (what :func:`run_arm` saves)."""
    from llm_marl.team_checkpoint import load_team

    checkpoints = sorted((team_dir / "checkpoints").glob("step-*"))
    if not checkpoints:
        raise ValueError(f"no seated checkpoint in {team_dir}: run that arm again")
    team = load_team(checkpoints[-1], seats)
    return {seat: team.policy(seat).trainable_state_dict(team.adapter(seat)) for seat in seats}


def finished_arm(config: StudyConfig, out: Path, arm: str) -> dict[str, Any] | None:
    """The stored record of ``arm`` in ``out`` if it was run with these settings, else ``None``."""
    record_path = out / "arms" / arm / "arm.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if record.get("key") == config.key() and set(config.evaluate) <= set(record["scores"]):
            record["scores"] = {setting: record["scores"][setting] for setting in config.evaluate}
            return record
    return None


def run_arm(arm: str, config: StudyConfig, out: Path, evaluator: Evaluator, log: Any = print) -> dict[str, Any]:
    """Train (unless ``untrained``) and evaluate one arm; its record, also written to ``out/arms/<arm>/arm.json``."""
    batches = matched_batches(config)
    arm_dir = out / "arms" / arm
    arm_started = time.perf_counter()
    if arm == "untrained":
        trained = TrainedArm(evaluator.untrained, {"completions": 0, "answer_tokens": 0, "generate_calls": 0},
                             0.0, [])
    elif arm in REPLAYED_ARMS:
        source = REPLAYED_ARMS[arm]
        record = finished_arm(config, out, source)
        if record is None:
            raise ValueError(f"{arm} seats {source}'s trained adapters: run the {source} arm first (with the same "
                             f"settings and --out)")
        log(f"{arm}: {source}'s adapters in the debate {DEBATE_SETTINGS.get(arm, {})}")
        trained = TrainedArm(seated_adapters(out / "arms" / source / "team", evaluator.seats), record["counts"], 0.0,
                             [])
    else:
        log(f"{arm}: training ({batches[arm].how})")
        trained = train_arm(arm, config, batches[arm], arm_dir / "train")
    evaluator.load(trained.seats)
    evaluator.use_debate(DEBATE_SETTINGS.get(arm, {}))
    checkpoint = None
    if arm != "untrained":
        checkpoint = str(save_team(arm_dir / "team", config.steps, evaluator.team, env=evaluator.envs["debate"]))
    eval_started = time.perf_counter()
    scores = evaluator.play(arm_dir, label=arm)
    record = {"key": config.key(), "arm": arm, "counts": trained.counts, "train_seconds": trained.seconds,
              "eval_seconds": time.perf_counter() - eval_started, "checkpoint": checkpoint,
              "matching": asdict(batches[arm]) if arm in batches else None,
              "history": trained.history, "scores": scores}
    write_text_atomically(arm_dir / "arm.json", json.dumps(record, default=str))
    summary = setting_summary(scores["greedy"])
    log(f"{arm}: done in {(time.perf_counter() - arm_started) / 60:.1f} min; sampled {trained.counts}; greedy "
        f"turn 0 {summary['turn0_accuracy']['mean']:.3f}, final {summary['final_turn_accuracy']['mean']:.3f}, "
        f"gain {summary['collaboration_gain']['mean']:+.3f}")
    return record


def _in_workers(pending: list[str]) -> list[str]:
    """The pending arms worker processes run, the dearest first; replayed arms follow, in the main process."""
    return sorted((a for a in pending if a not in REPLAYED_ARMS),
                  key=lambda a: ARM_COST_ORDER.index(a) if a in ARM_COST_ORDER else -1)


def run_study(config: StudyConfig, out: str | os.PathLike, *, log: Any = print, jobs: int = 1,
              threads_per_job: int = 1) -> dict[str, Any]:
    """Train and evaluate every arm of ``config`` (reusing arms done in ``out``); write results.json and the figure.

    ``jobs > 1`` runs that many arms at once, each in its own process with ``threads_per_job`` torch threads
    (the dearest arms first); every arm's result is the same as in one process (each arm seeds itself).
    """
    check_jobs(jobs, threads_per_job)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    batches = matched_batches(config)
    log_matching(config, batches.values(), "agents", log)
    arm_records = run_arms(config, out, finished_arm=finished_arm, run_arm=run_arm, make_evaluator=Evaluator,
                           in_workers=_in_workers, jobs=jobs,
                           threads_per_job=threads_per_job, log=log)
    arm_scores = {arm: record.pop("scores") for arm, record in arm_records.items()}
    summaries = {arm: arm_summary(arm_scores[arm]) for arm in config.arms}
    paired = comparisons(arm_scores)
    results = {
        "study": "compute-matched collaboration study", "config": asdict(config),
        "completions_per_step": config.completions_per_step,
        "matching": {arm: {**asdict(b), "sampled_in_training": arm_records[arm]["counts"]}
                     for arm, b in batches.items()},
        "arms": {arm: {**summaries[arm], "train_seconds": arm_records[arm]["train_seconds"],
                       "eval_seconds": arm_records[arm]["eval_seconds"], "checkpoint": arm_records[arm]["checkpoint"]}
                 for arm in config.arms},
        "paired_differences": paired, "research_bar": research_bar(summaries, paired),
        "accuracy": "fraction of agents right (mean over agents, and over samples when sampled), per task; team "
                    "answer: majority vote of the final answers; collaboration gain: final-turn minus turn-0 "
                    "accuracy of the same episodes; intervals: 95% percentile bootstrap over tasks, paired by task",
        "machine": {"processor": _processor(), "python": platform.python_version()},
        "jobs": jobs, "threads_per_job": threads_per_job,
        "wall_time_s": {"this_call": time.perf_counter() - started,
                        "all_arms": sum(r["train_seconds"] + r["eval_seconds"] for r in arm_records.values())},
    }
    write_text_atomically(out / "results.json", json.dumps(results, indent=2, default=str))
    summary_figure(summaries, out / "summary.png")
    log(format_table(summaries, "greedy"))
    if "sampled" in config.evaluate:
        log(format_table(summaries, "sampled"))
    for arm, bar in results["research_bar"].items():
        log(f"research bar, {arm}: {'met' if bar['met'] else 'not met'} ({bar})")
    log(f"time: all arms together {results['wall_time_s']['all_arms'] / 60:.1f} min of training + evaluation "
        f"(summed over arms), this call {results['wall_time_s']['this_call'] / 60:.1f} min wall with {jobs} job(s); "
        f"wrote {out / 'results.json'} and {out / 'summary.png'}")
    return results


def run_seeds(config: StudyConfig, out: str | os.PathLike, seeds: Sequence[int], *, log: Any = print,
              jobs: int = 1, threads_per_job: int = 1) -> dict[str, Any]:
    """The study once per seed in ``out/seed-<s>`` (resumable like :func:`run_study`), then the spread over seeds of
    each multi-agent arm's greedy final turn against ``solo`` and of its collaboration gain: ``seeds.json`` and
    ``seeds.png`` in ``out``."""
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    if len(seeds) < 2:
        raise ValueError(f"a seed repeat needs at least two distinct seeds, got {seeds}")
    out = Path(out)
    per_seed = {}
    for seed in seeds:
        log(f"seed {seed}: {out / f'seed-{seed}'}")
        per_seed[seed] = run_study(replace(config, seed=seed), out / f"seed-{seed}", log=log, jobs=jobs,
                                   threads_per_job=threads_per_job)
    spread = {}
    for arm in (a for a in MULTI_AGENT_ARMS if a in config.arms):
        rows = {"final_turn_minus_solo": [per_seed[s]["paired_differences"].get(f"{arm} - solo", {})
                                          .get("greedy", {}).get("final_turn_accuracy") for s in seeds],
                "collaboration_gain": [per_seed[s]["arms"][arm]["greedy"]["collaboration_gain"] for s in seeds],
                "final_turn_accuracy": [per_seed[s]["arms"][arm]["greedy"]["final_turn_accuracy"] for s in seeds]}
        spread[arm] = {name: seed_spread(seeds, values) for name, values in rows.items() if all(values)}
        spread[arm]["research_bar_met"] = {str(s): per_seed[s]["research_bar"].get(arm, {}).get("met") for s in seeds}
    for arm in (a for a in SINGLE_POLICY_ARMS if a in config.arms):
        spread[arm] = {"final_turn_accuracy": seed_spread(seeds, [per_seed[s]["arms"][arm]["greedy"]
                                                                ["final_turn_accuracy"] for s in seeds])}
    results = {"seeds": seeds, "config": {**asdict(config), "seed": None}, "setting": "greedy", "arms": spread,
               "spread": "per seed: mean and paired 95% CI over the held-out tasks; over seeds: mean, sample standard "
                         "deviation, min and max of the per-seed means"}
    write_text_atomically(out / "seeds.json", json.dumps(results, indent=2, default=str))
    seeds_figure(spread, seeds, out / "seeds.png")
    for arm, rows in spread.items():
        for name, row in rows.items():
            if isinstance(row, dict) and "per_seed" in row:
                log(f"{arm} {name}: " + ", ".join(f"seed {s} {v['mean']:+.3f} [{v['low']:+.3f}, {v['high']:+.3f}]"
                                                  for s, v in row["per_seed"].items())
                    + f"; over seeds {row['mean']:+.3f} ± {row['std']:.3f} (min {row['min']:+.3f}, max "
                      f"{row['max']:+.3f})")
    log(f"wrote {out / 'seeds.json'} and {out / 'seeds.png'}")
    return results


def seeds_figure(spread: dict[str, Any], seeds: Sequence[int], path: Path) -> Path:
    """Per multi-agent arm and seed: the greedy final turn minus solo's and the collaboration gain, with 95% CIs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("final_turn_minus_solo", "final turn − solo (paired)"), ("collaboration_gain", "collaboration gain"))
    arms = [a for a in spread if any(name in spread[a] for name, _ in panels)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, (name, title) in zip(axes, panels):
        for i, arm in enumerate(arms):
            if name not in spread[arm]:
                continue
            plot_seed_points(ax, i, spread[arm][name]["per_seed"], seeds, width=0.15, label=i == 0)
        ax.axhline(0, color="0.5", lw=0.8)
        ax.set_xticks(range(len(arms)), arms, rotation=15)
        ax.set_title(title)
    axes[0].set_ylabel("accuracy difference (95% CI)")
    axes[0].legend(fontsize=8)
    fig.suptitle("greedy, held-out tasks: each seed trains every arm again")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _processor() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"



__all__ = ["ARMS", "ArmBatch", "Evaluator", "LEVER_ARMS", "SamplingCounter", "StudyConfig", "TrainedArm",
           "arm_summary", "comparisons", "finished_arm", "format_table", "matched_batches", "research_bar",
           "run_arm", "run_seeds", "run_study", "setting_summary", "summary_figure", "train_arm"]
