"""An information-split study: does a trained team learn to communicate what only it holds?

On an information-split env (``split_arithmetic-v0``, ``reference_game-v0``, ``hidden_profile-v0``: each role
holds a private view and only the views together determine the answer) every arm starts from the same base
model, seed, learning rate, steps, sampling settings and KL weight, and samples **the same number of completions
per training step**, ``C = P·N·(G + G² + … + G^T)`` (MAGRPO's tree of ``P`` tasks, N roles, T turns, G samples per
node). The batches come from the collaboration study's :func:`studies.collaboration.study.matched_batches`; the
completions and answer tokens actually sampled are counted with its
:class:`~studies.collaboration.study.SamplingCounter`.

- ``untrained``: the base model in every seat of the team (``view="split"``).
- ``own_view_solo``: one LoRA adapter per role, each trained alone on its own view only (``view="own"``,
  ``num_agents=1``, ``seat=k``, ``solo_turns`` turns: 1, the answer, by default), ``C / (N·G)`` prompts × G
  answers per role per step (``C`` together), then seated each in its role of the team. One adapter per role,
  rather than one adapter cycling over the seats, gives the control the team's own shape (one adapter per agent)
  without team training: what each role can learn from its view alone.
- ``full_view_solo``: one agent trained alone with every view (``view="full"``, ``num_agents=1``), ``C / G``
  prompts × G answers per step; played alone with the full view (the upper bound of a team).
- ``magrpo``, ``mappo``, ``counterfactual``: the team trained with one adapter per role
  (``Team.adapter_per_agent``): MAGRPO's aligned tree, MAPPO on the same trees (``num_generations = G``, one
  minibatch a step) with a centralized critic that reads every role's view (the base's first
  ``mappo_critic_depth`` layers, its adapter on the top ``MAPPO_CRITIC_LAYERS`` of them) and the ``last_turn``
  reward rule (the env pays only the last turn), and MAGRPO
  with counterfactual per-message credit (:mod:`trainers.experimental.counterfactual`).

With ``warm_start`` (a team checkpoint, e.g. another study's ``arms/full_view_solo/team``) every arm's adapters,
the untrained team's too, start from that checkpoint's, seat ``agent_k`` from its ``agent_k``
(:func:`start_seats`).

Evaluation, greedy on the same ``eval_tasks`` held-out test tasks: each team's final-turn accuracy (mean over
seats, and per seat), the same team again with ``mask_messages=True`` (**the communication ablation**: every
partner's message replaced by an empty one), ``own_view_solo`` seated in the team and ``full_view_solo`` alone.
The untrained team is played once. Paired differences by task with 95% bootstrap intervals: team − untrained,
team − ``own_view_solo``, team − its masked self, team − ``full_view_solo``, and the share of the gap from
``own_view_solo`` (and from the untrained team) to ``full_view_solo`` that the team closes. The turn-0 messages of
the first ``transcripts`` tasks, before (untrained) and after training, are kept: the protocol the team learned.

Each arm's record is stored as it finishes (``arms/<arm>/arm.json``), so an interrupted study resumes at the next
arm; an arm whose training finished (its checkpoint and ``arms/<arm>/trained.json`` written) but whose evaluation
did not is evaluated from its checkpoint, not trained again; an arm stopped during its training resumes from its
newest training checkpoint with the same settings (:func:`train_arm`). The command is
:mod:`studies.information_split.run`; the log of what it found is its README.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from llm_marl.files import write_text_atomically
from llm_marl.team_checkpoint import save_team
from studies.arms import check_jobs, log_matching, run_arms
from studies.collaboration import study as collaboration
from studies.collaboration.study import SamplingCounter, TrainedArm, base_model
from trainers.common.evaluation import EVAL_PARALLEL, HeldOutScores, paired_interval, seat_summary
from trainers.common.experiment import plot_seed_points, seed_spread

ARMS = ("untrained", "own_view_solo", "full_view_solo", "magrpo", "mappo", "counterfactual")
TEAM_ARMS = ("magrpo", "mappo", "counterfactual")
SOLO_ARMS = ("own_view_solo", "full_view_solo")
# what each arm plays on the held-out tasks: "team" (view="split"), "masked" (the same with mask_messages=True),
# "full" (one agent with every view)
PLAYS = {"untrained": ("team",), "own_view_solo": ("team",), "full_view_solo": ("full",),
         **{arm: ("team", "masked") for arm in TEAM_ARMS}}
# settings that change only training, and env arguments that change only the reward: the untrained team's play
# does not depend on them (StudyConfig.key)
TRAINING_SETTINGS = ("solo_turns", "num_generations", "prompts_per_step", "steps", "learning_rate", "kl_coef",
                     "temperature", "counterfactual_samples")
REWARD_ONLY_ENV_ARGS = ("format_reward",)
# written beside a trained arm's checkpoint before its evaluation (record_training)
TRAINED_FILE = "trained.json"
# a training checkpoint's extra holding what the arm sampled and how long it trained so far (ArmProgress)
PROGRESS_KEY = "study_progress"
# expected cost, dearest first: parallel jobs start these first so the cheap arms fill in around them
ARM_COST_ORDER = ("mappo", "counterfactual", "magrpo", "own_view_solo", "full_view_solo", "untrained")


@dataclass
class StudyConfig:
    """Settings shared by every arm of the study (see the module docstring for the arms)."""

    env: str = "split_arithmetic-v0"
    model: str = "smollm2-135m"
    num_turns: int = 2                # the team's turns: tell, then answer
    solo_turns: int = 1               # the solo arms' turns (1: answer at once)
    num_generations: int = 4          # G: MAGRPO's samples per agent per tree node; sets C, the completions per step
    prompts_per_step: int = 1         # P: MAGRPO's task trees per step
    steps: int = 20
    learning_rate: float = 2e-4
    kl_coef: float = 0.0
    temperature: float = 0.7
    top_p: float = 0.9
    max_new_tokens: int = 40
    counterfactual_samples: int = 2   # K: alternatives replayed per message by the counterfactual arm
    eval_tasks: int = 200
    transcripts: int = 5              # tasks whose turn-0 messages are kept, before and after training
    seed: int = 0
    arms: tuple[str, ...] = ARMS
    env_kwargs: dict[str, Any] = field(default_factory=dict)   # more make() arguments of the env (e.g. operators)
    # a team checkpoint whose LoRA adapters every arm starts from, seat agent_k from its agent_k (e.g. another
    # study's arms/full_view_solo/team); the untrained team is this start. None: fresh adapters
    warm_start: str | None = None
    # the base's layers MAPPO's critic runs (MAPPOConfig.critic_depth; None: all): part of the mappo arm's key only
    mappo_critic_depth: int | None = 8
    # held-out episodes an evaluation plays together: memory and time only (a team's play of 200 tasks peaks near
    # 12 GB at 128 on SmolLM2-135M), so it is in no arm's key
    eval_batch: int = EVAL_PARALLEL

    def __post_init__(self) -> None:
        self.arms = tuple(dict.fromkeys(self.arms))
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown:
            raise ValueError(f"unknown arm(s) {unknown}; choose from {ARMS}")
        if "untrained" not in self.arms:
            self.arms = ("untrained", *self.arms)     # every comparison is paired against the untrained team
        for name in ("num_turns", "solo_turns", "prompts_per_step", "steps", "max_new_tokens", "eval_tasks",
                     "counterfactual_samples", "eval_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_turns < 2:
            raise ValueError(f"a team must talk before it answers: num_turns >= 2, got {self.num_turns}")
        if self.num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (a group-relative baseline needs two samples), got "
                             f"{self.num_generations}")
        if self.mappo_critic_depth is not None and (isinstance(self.mappo_critic_depth, bool)
                                                    or not isinstance(self.mappo_critic_depth, int)
                                                    or self.mappo_critic_depth < 1):
            raise ValueError(f"mappo_critic_depth must be None (every layer) or an int >= 1, got "
                             f"{self.mappo_critic_depth!r}")
        if self.transcripts < 0 or self.kl_coef < 0 or not self.temperature > 0:
            raise ValueError(f"need transcripts >= 0, kl_coef >= 0 and temperature > 0, got {self.transcripts}, "
                             f"{self.kl_coef}, {self.temperature}")
        import llm_marl_envs
        from llm_marl_envs.envs.information_split import InformationSplitEnv

        probe = llm_marl_envs.make(self.env, split="test", **self.env_kwargs)
        if not isinstance(probe, InformationSplitEnv):
            raise ValueError(f"{self.env} is not an information-split env (view='split'|'full'|'own'); choose "
                             f"split_arithmetic-v0, reference_game-v0 or hidden_profile-v0")

        self._roles = len(probe.role_names)
        if self.warm_start is not None:
            warm_start_manifest(self)      # a checkpoint that cannot start every seat is refused here, not mid-run

    @property
    def num_agents(self) -> int:
        """N: one agent per role of the env."""
        return self._roles

    @property
    def num_tasks(self) -> int:
        return max(500, self.eval_tasks)

    @property
    def completions_per_step(self) -> int:
        """C: what MAGRPO's tree samples per step, and so what every trained arm samples per step."""
        g = self.num_generations
        return self.prompts_per_step * self.num_agents * sum(g ** k for k in range(1, self.num_turns + 1))

    def make_env(self, split: str, *, view: str = "split", agents: int | None = None, turns: int | None = None,
                 **kwargs: Any) -> Any:
        """The study's env: ``view="split"`` with one agent per role unless told otherwise; ``kwargs`` (``num_tasks``
        too) override the study's env arguments."""
        import llm_marl_envs

        n = agents if agents is not None else (self.num_agents if view == "split" else 1)
        return llm_marl_envs.make(self.env, view=view, split=split, num_agents=n, num_turns=turns or self.num_turns,
                                  **{"num_tasks": self.num_tasks, **self.env_kwargs, **kwargs})

    def key(self, arm: str | None = None) -> str:
        """A digest of every setting that changes what ``arm`` learns or how it is played (resuming checks it).

        The untrained team learns nothing and plays greedily: its key leaves out the seed, the training settings
        and the env arguments that change only the reward (:data:`REWARD_ONLY_ENV_ARGS`), so studies that differ
        in those alone share its play instead of repeating it.
        """
        return self._digest(arm, with_untrained_seed=False)

    def accepted_keys(self, arm: str) -> tuple[str, ...]:
        """The keys of a stored ``arm`` that match these settings: :meth:`key`, and for the untrained team also the
        key it had when it held the seed (folders written before it left the seed out)."""
        if arm != "untrained":
            return (self.key(arm),)
        return self.key(arm), self._digest(arm, with_untrained_seed=True)

    def _digest(self, arm: str | None, with_untrained_seed: bool) -> str:
        settings = {k: v for k, v in asdict(self).items() if k not in ("arms", "eval_batch")}
        if arm != "mappo" or self.mappo_critic_depth is None:   # only MAPPO has a critic; every layer: as before
            settings.pop("mappo_critic_depth")                     # the setting existed, so older arms still match
        if self.warm_start is not None:       # the weights, not the path: a start trained again is another study
            settings["warm_start"] = warm_start_digest(self)
        if arm == "untrained":
            dropped = TRAINING_SETTINGS if with_untrained_seed else (*TRAINING_SETTINGS, "seed")
            settings = {k: v for k, v in settings.items() if k not in dropped}
            settings["env_kwargs"] = {k: v for k, v in self.env_kwargs.items() if k not in REWARD_ONLY_ENV_ARGS}
        return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ warm start
def warm_start_manifest(config: StudyConfig) -> tuple[Path, dict[str, Any]]:
    """The checkpoint dir and ``team.json`` of ``config.warm_start``; ``ValueError`` unless it holds a LoRA adapter
    for every seat ``agent_0 … agent_{N-1}``, trained on the study's base model."""
    from llm_marl.team_checkpoint import check_models, find_checkpoint, read_manifest

    path = find_checkpoint(config.warm_start)
    manifest = read_manifest(path)
    check_models(path, manifest, [config.model])
    seats = [f"agent_{i}" for i in range(config.num_agents)]
    members = manifest["members"]
    unfit = [seat for seat in seats if members.get(seat, {}).get("weights") != "lora"]
    if unfit:
        raise ValueError(f"warm_start={config.warm_start!r}: the study's seats {seats} each start from the "
                         f"checkpoint's LoRA adapter of the same name, but it has none for {unfit} (it holds "
                         f"{ {a: m.get('weights') for a, m in members.items()} }); pass a team checkpoint of "
                         f"{config.num_agents} LoRA agents, e.g. another study's arms/full_view_solo/team")
    return path, manifest


def warm_start_digest(config: StudyConfig) -> str:
    """A digest of the warm start's adapter configs and weights, seat by seat."""
    from llm_marl.team_checkpoint import WEIGHT_FILES, agent_dir

    path, manifest = warm_start_manifest(config)
    digest = hashlib.sha256()
    for i in range(config.num_agents):
        folder = agent_dir(path, manifest, f"agent_{i}")
        for name in WEIGHT_FILES["lora"]:
            digest.update((folder / name).read_bytes())
    return digest.hexdigest()[:16]


def start_seats(config: StudyConfig, policy: Any, seats: Sequence[str]) -> None:
    """Give every seat's adapter of ``policy`` its starting weights: the warm start's (if any), else leave the
    fresh ones. ``ValueError`` when the checkpoint's LoRA settings differ from the seats' (another rank, scale or
    set of layers would not be the adapter that was trained; :func:`llm_marl.team_checkpoint.read_agent`)."""
    if config.warm_start is None:
        return
    from llm_marl.team_checkpoint import read_agent

    path, manifest = warm_start_manifest(config)
    for seat in seats:
        read_agent(path, manifest, seat, policy, seat)


# ------------------------------------------------------------------------------------------------ matching
def matched_batches(config: StudyConfig) -> dict[str, collaboration.ArmBatch]:
    """Each trained arm's per-step batch, all sampling ``config.completions_per_step`` completions per step.

    The team arms' batches are the collaboration study's; a shape that cannot be matched is a ``ValueError``.
    """
    n, g = config.num_agents, config.num_generations
    shape = collaboration.StudyConfig(num_agents=n, num_turns=config.num_turns, num_generations=g,
                                      prompts_per_step=config.prompts_per_step, steps=config.steps,
                                      counterfactual_samples=config.counterfactual_samples,
                                      arms=("solo", "magrpo", "mappo", "counterfactual"))
    shared = collaboration.matched_batches(shape)
    c = config.completions_per_step
    if c % (n * g):
        raise ValueError(f"own_view_solo cannot be matched: C={c} is not a multiple of N·G={n * g}")
    batches = {arm: shared[arm] for arm in TEAM_ARMS}
    # MAPPO plays MAGRPO's task trees (MAPPOConfig.num_generations): the same prompts, shared the same way
    batches["mappo"] = replace(shared["magrpo"], arm="mappo",
                               settings={"episodes_per_step": config.prompts_per_step, "num_generations": g})
    batches["full_view_solo"] = replace(shared["solo"], arm="full_view_solo",
                                        how=f"{c // g} prompts x G={g} answers (1 agent with every view, "
                                            f"{config.solo_turns} turn(s))")
    batches["own_view_solo"] = collaboration.ArmBatch(
        "own_view_solo", c, {"prompts_per_step": c // (n * g), "num_generations": g},
        f"{n} roles x {c // (n * g)} prompts x G={g} answers (one adapter per role, its own view only, "
        f"{config.solo_turns} turn(s))")
    return {arm: batches[arm] for arm in config.arms if arm in batches}


# ------------------------------------------------------------------------------------------------ training
# MAPPO's critic adapts the top layers of those it runs (StudyConfig.mappo_critic_depth; all of a shallower
# model) (MAPPOConfig.critic_layers)
MAPPO_CRITIC_LAYERS = 8


def team_trainer(arm: str, config: StudyConfig, batch: collaboration.ArmBatch, team: Any,
                 common: dict[str, Any], **overrides: Any) -> Any:
    """The trainer of a team arm (``magrpo``, ``mappo``, ``counterfactual``) on the study's train env; ``overrides``
    replace settings of MAPPO's config (``critic_layers``)."""
    from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

    env = config.make_env("train")
    if arm == "magrpo":
        trainer = MAGRPOTrainer(env, team, MAGRPOConfig(**common, **batch.settings, micro_batch_size=32))
    elif arm == "counterfactual":
        from trainers.experimental import ExperimentalMAGRPOConfig, ExperimentalMAGRPOTrainer

        cf = ExperimentalMAGRPOConfig(**common, credit="counterfactual",
                                      prompts_per_step=batch.settings["transcripts_per_step"],
                                      counterfactual_samples=batch.settings["counterfactual_samples"],
                                      num_generations=config.num_generations, micro_batch_size=32,
                                      kl_placement="loss" if config.kl_coef else "reward")
        trainer = ExperimentalMAGRPOTrainer(env, team, cf)
    elif arm == "mappo":
        from trainers.mappo import MAPPOConfig, MAPPOTrainer

        layers = team.policy(team.agents[0]).model.config.num_hidden_layers
        depth = layers if config.mappo_critic_depth is None else min(config.mappo_critic_depth, layers)
        # one minibatch of the whole step (a node's samples share their prompt in one pass, as in MAGRPO's loss)
        settings = {"ppo_epochs": 1, "minibatch_size": batch.completions_per_step, "critic_learning_rate": 1e-4,
                    "reward_rule": "last_turn", "critic_layers": min(MAPPO_CRITIC_LAYERS, depth),
                    "critic_depth": None if depth == layers else depth, **overrides}
        trainer = MAPPOTrainer(env, team, MAPPOConfig(**common, **batch.settings, **settings))
    else:
        raise ValueError(f"unknown trained arm {arm!r}; choose from {ARMS[1:]}")
    return trainer


class ArmProgress:
    """What one arm's training has sampled (a :class:`SamplingCounter`) and how long it has trained, carried in its
    trainers' checkpoints (under :data:`PROGRESS_KEY` of their extras), so an arm resumed from a checkpoint reports
    its whole training, not only the part after the interruption."""

    def __init__(self) -> None:
        self.counter = SamplingCounter()
        self.started = time.perf_counter()
        self.seconds_before = 0.0

    @property
    def seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self.started

    def restore(self, checkpoint: Path) -> None:
        """Take the counts and seconds a checkpoint carries (they include everything trained before it)."""
        import torch

        saved = torch.load(checkpoint / "trainer_state.pt", weights_only=False)["extra"].get(PROGRESS_KEY)
        if saved is None:
            raise ValueError(f"{checkpoint} carries no study progress; it was not written by this study")
        self.counter.completions, self.counter.answer_tokens, self.counter.calls = (
            saved["completions"], saved["answer_tokens"], saved["generate_calls"])
        self.seconds_before, self.started = saved["seconds"], time.perf_counter()

    def attach(self, trainer: Any) -> Any:
        """``trainer`` with its checkpoints carrying this progress."""
        own_extra = trainer.extra_state
        trainer.extra_state = lambda: {**own_extra(), PROGRESS_KEY: {**self.counter.to_dict(), "seconds": self.seconds}}
        return trainer


def resume_point(config: StudyConfig, arm: str, output_dir: Path) -> Path | None:
    """The newest checkpoint of an earlier, interrupted training of ``arm`` with these settings in ``output_dir``
    (a trainer's output folder), else ``None``; a folder that holds a training with other settings is emptied."""
    from trainers.common.run_dir import RunDirError, clear_run, prepare_run_dir, write_record

    record = {"command": "python -m studies.information_split.run", "study_key": config.key(arm), "arm": arm}
    try:
        return prepare_run_dir(output_dir, record).resume
    except RunDirError:
        clear_run(output_dir)
        write_record(output_dir, record)
        return None


def train_arm(arm: str, config: StudyConfig, batch: collaboration.ArmBatch, out: Path) -> TrainedArm:
    """Train one arm from the base model; its seats' adapter tensors come back named ``agent_0 … agent_{N-1}``.

    Each trainer checkpoints under ``out`` (every ``save_every_minutes``, and at its last step); run again after an
    interruption, the arm resumes from the newest checkpoint of a training with the same settings
    (:func:`resume_point`), with its counts, seconds and history so far."""
    import torch

    from llm_marl.backends.hf import rename_adapter
    from llm_marl.team import Team
    from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

    torch.manual_seed(config.seed)
    seats = [f"agent_{i}" for i in range(config.num_agents)]
    model, tokenizer = base_model(config)
    team = Team.adapter_per_agent(model, tokenizer, seats, name=config.model)
    policy = team.policy(seats[0])
    start_seats(config, policy, seats)
    progress = ArmProgress()

    def resumable(output_dir: Path) -> dict[str, Any]:
        """The trainer settings shared by every arm, resuming the training found in ``output_dir``."""
        resume = resume_point(config, arm, output_dir)
        if resume is not None:
            progress.restore(resume)
        return {**collaboration._trainer_config_kwargs(config, output_dir),
                "resume_from_checkpoint": None if resume is None else str(resume)}

    history: list[dict[str, Any]] = []
    if arm in SOLO_ARMS:
        roles = range(config.num_agents) if arm == "own_view_solo" else [0]
        for role in roles:        # own view: role k's adapter on role k's view; full view: agent_0's adapter
            env = (config.make_env("train", view="own", seat=role, turns=config.solo_turns) if arm == "own_view_solo"
                   else config.make_env("train", view="full", turns=config.solo_turns))
            solo = progress.attach(MAGRPOTrainer(env, Team.from_policies({"agent_0": (policy, seats[role])}),
                                                 MAGRPOConfig(**resumable(out / f"role_{role}"), **batch.settings,
                                                              micro_batch_size=32)))
            with progress.counter.active():
                solo.train()
            history += [{**row, "role": role} for row in solo.history]
        trained = seats if arm == "own_view_solo" else [seats[0]] * len(seats)
        seat_states = {seat: rename_adapter(policy.trainable_state_dict(source), source, seat)
                       for seat, source in zip(seats, trained)}
        return TrainedArm(seat_states, progress.counter.to_dict(), progress.seconds, history)
    trainer = progress.attach(team_trainer(arm, config, batch, team, resumable(out)))
    with progress.counter.active():
        trainer.train()
    seat_states = {seat: policy.trainable_state_dict(seat) for seat in seats}
    return TrainedArm(seat_states, progress.counter.to_dict(), progress.seconds, list(trainer.history))


# ------------------------------------------------------------------------------------------------ evaluation
class Evaluator:
    """One base model with one adapter per role: every arm's seats are loaded into it and played greedily."""

    def __init__(self, config: StudyConfig) -> None:
        from llm_marl.rollout import GreedyCache
        from llm_marl.team import Team

        self.config = config
        self.seats = [f"agent_{i}" for i in range(config.num_agents)]
        model, tokenizer = base_model(config)
        self.team = Team.adapter_per_agent(model, tokenizer, self.seats, name=config.model)
        self.policy = self.team.policy(self.seats[0])
        start_seats(config, self.policy, self.seats)
        self.untrained = {seat: self.policy.trainable_state_dict(seat) for seat in self.seats}
        self.greedy_cache = GreedyCache()
        self.envs = {"team": config.make_env("test"), "masked": config.make_env("test", mask_messages=True),
                     "full": config.make_env("test", view="full", turns=config.solo_turns)}
        if len(self.envs["team"].tasks) < config.eval_tasks:
            raise ValueError(f"{config.env}'s test split has {len(self.envs['team'].tasks)} tasks, fewer than "
                             f"eval_tasks={config.eval_tasks}")

    def load(self, seats: dict[str, dict[str, Any]]) -> None:
        """Put an arm's adapter tensors on the seats; its plays share one cache of greedy answers."""
        from llm_marl.rollout import GreedyCache

        for seat in self.seats:
            self.policy.load_trainable_state_dict(seat, seats[seat])
        self.greedy_cache = GreedyCache()   # the masked play takes the team's turn-0 answers (the same prompts)

    def play(self, setting: str, out: Path, label: str = "") -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Greedy per-task scores of one setting (:meth:`HeldOutScores.to_arrays`, with its report.html under
        ``out/<setting>``) and the episode records."""
        from llm_marl.policy import SamplingParams
        from llm_marl.rollout import RolloutEngine
        from llm_marl.team import Team
        from trainers.common.evaluation import evaluate_episodes, scores_from

        c, env = self.config, self.envs[setting]
        team = Team.from_policies({agent: (self.policy, self.seats[j]) for j, agent in enumerate(env.possible_agents)})
        tasks = list(range(c.eval_tasks))
        params = SamplingParams(max_new_tokens=c.max_new_tokens, temperature=0.0, top_p=c.top_p, seed=c.seed)
        self.policy.model.eval()
        engine = RolloutEngine(env, team, greedy_cache=self.greedy_cache)
        result = evaluate_episodes(engine, None, None, tasks, [c.seed + 1_000 * i for i in tasks], params,
                                   desc=f"{label} {setting}".strip(), report_path=out / setting / "report.html",
                                   parallel=c.eval_batch)
        return scores_from(result, tasks, 1, 0.0).to_arrays(), result.episodes


def transcripts(episodes: Sequence[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """The first ``count`` episodes' turn-0 messages, final answers and whether each seat was right."""
    return [{"task_id": e["task_id"], "gold": e["gold"], "turn0_messages": e["responses"][0],
             "final_answers": e["answers"][-1], "final_correct": e["correct"][-1]} for e in episodes[:count]]


def finished_arm(config: StudyConfig, out: Path, arm: str) -> dict[str, Any] | None:
    """The stored record of ``arm`` in ``out`` if it was run with these settings, else ``None``; its checkpoint is
    the one in ``out`` (the arm may have been run under another path and its folder copied here)."""
    path = out / "arms" / arm / "arm.json"
    if path.is_file():
        record = json.loads(path.read_text())
        if record.get("key") in config.accepted_keys(arm):
            if record.get("checkpoint"):
                name = Path(record["checkpoint"]).name
                record["checkpoint"] = str(out / "arms" / arm / "team" / "checkpoints" / name)
            return record
    return None


def record_training(config: StudyConfig, arm_dir: Path, arm: str, trained: TrainedArm, checkpoint: str) -> None:
    """Write ``arm_dir/trained.json`` once the arm's checkpoint is saved: a run stopped during the evaluation that
    follows resumes at the evaluation (:func:`trained_before`), not at training."""
    record = {"key": config.key(arm), "arm": arm, "checkpoint": Path(checkpoint).name, "counts": trained.counts,
              "seconds": trained.seconds, "history": trained.history}
    write_text_atomically(arm_dir / TRAINED_FILE, json.dumps(record, default=str))


def trained_before(config: StudyConfig, arm_dir: Path, arm: str,
                   evaluator: Evaluator) -> tuple[TrainedArm, str] | None:
    """The arm as an earlier run with these settings trained it (its seats read back from its checkpoint into
    ``evaluator``, counts, time and history from ``trained.json``) and its checkpoint path; ``None`` when no run
    finished training it with these settings."""
    from llm_marl.team_checkpoint import read_agent, read_manifest

    path = arm_dir / TRAINED_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    checkpoint = arm_dir / "team" / "checkpoints" / record["checkpoint"]
    if record.get("key") != config.key(arm) or not checkpoint.is_dir():
        return None
    manifest = read_manifest(checkpoint)
    for seat in evaluator.seats:
        read_agent(checkpoint, manifest, seat, evaluator.policy, seat)
    seats = {seat: evaluator.policy.trainable_state_dict(seat) for seat in evaluator.seats}
    evaluator.load(seats)                   # also a fresh cache of greedy answers
    return TrainedArm(seats, record["counts"], record["seconds"], record["history"]), str(checkpoint)


def run_arm(arm: str, config: StudyConfig, out: Path, evaluator: Evaluator, log: Any = print) -> dict[str, Any]:
    """Train (unless ``untrained``) and evaluate one arm; its record, also written to ``out/arms/<arm>/arm.json``."""
    arm_dir = out / "arms" / arm
    started = time.perf_counter()
    batch = matched_batches(config).get(arm)
    checkpoint = None
    if arm == "untrained":
        trained = TrainedArm(evaluator.untrained, {"completions": 0, "answer_tokens": 0, "generate_calls": 0}, 0.0, [])
        evaluator.load(trained.seats)
    else:
        found = trained_before(config, arm_dir, arm, evaluator)
        if found is not None:
            trained, checkpoint = found
            log(f"{arm}: trained by an earlier run that stopped before its evaluation; evaluating {checkpoint}")
        else:
            log(f"{arm}: training ({batch.how})")
            trained = train_arm(arm, config, batch, arm_dir / "train")
            evaluator.load(trained.seats)
            checkpoint = str(save_team(arm_dir / "team", config.steps, evaluator.team, env=evaluator.envs["team"]))
            record_training(config, arm_dir, arm, trained, checkpoint)
    eval_started = time.perf_counter()
    scores, kept = {}, []
    play_seconds = {}
    for setting in PLAYS[arm]:
        play_started = time.perf_counter()
        scores[setting], episodes = evaluator.play(setting, arm_dir, label=arm)
        play_seconds[setting] = time.perf_counter() - play_started
        if setting in ("team", "full"):
            kept = transcripts(episodes, config.transcripts)
    record = {"key": config.key(arm), "arm": arm, "counts": trained.counts, "train_seconds": trained.seconds,
              "eval_seconds": time.perf_counter() - eval_started, "play_seconds": play_seconds,
              "greedy_cache_hits": evaluator.greedy_cache.hits, "checkpoint": checkpoint,
              "matching": asdict(batch) if batch else None, "history": trained.history, "transcripts": kept,
              "scores": scores, "commit": _commit(),
              "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    write_text_atomically(arm_dir / "arm.json", json.dumps(record, default=str))
    main = scores["team" if "team" in scores else "full"]
    log(f"{arm}: done in {(time.perf_counter() - started) / 60:.1f} min; sampled {trained.counts}; greedy final "
        f"turn {np.mean(main['final']):.3f}" + (f", masked {np.mean(scores['masked']['final']):.3f}"
                                                if "masked" in scores else ""))
    return record


# ------------------------------------------------------------------------------------------------ summaries
def arm_summary(scores: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per setting played: accuracy per turn, final turn, team answer (with 95% CIs) and per seat."""
    out = {}
    for setting, arrays in scores.items():
        held = HeldOutScores.from_arrays(arrays)
        out[setting] = {**held.to_dict(), "seats": seat_summary(held) if held.agent_turns is not None else None}
    return out


def main_scores(arm_scores: dict[str, dict[str, Any]], arm: str) -> np.ndarray | None:
    """An arm's final-turn accuracy per task in its headline setting (the team's, or full_view_solo alone)."""
    if arm not in arm_scores:
        return None
    scores = arm_scores[arm]
    return np.asarray(scores["team" if "team" in scores else "full"]["final"], dtype=float)


def gap_closed(team: np.ndarray, base: np.ndarray, full: np.ndarray) -> float | None:
    """(team − base) / (full − base) of the mean accuracies; ``None`` when full is not above base."""
    denominator = float(full.mean() - base.mean())
    return float((team.mean() - base.mean()) / denominator) if denominator > 0 else None


def comparisons(arm_scores: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Paired differences by task of the final-turn accuracy (95% bootstrap intervals) and the gap shares."""
    out: dict[str, Any] = {}
    final = {arm: main_scores(arm_scores, arm) for arm in ARMS}
    for arm in SOLO_ARMS:
        if final[arm] is not None:
            out[f"{arm} - untrained"] = paired_interval(final[arm], final["untrained"])
    for arm in (a for a in TEAM_ARMS if final[a] is not None):
        out[f"{arm} - untrained"] = paired_interval(final[arm], final["untrained"])
        out[f"{arm} - masked {arm}"] = paired_interval(final[arm], arm_scores[arm]["masked"]["final"])
        for control in SOLO_ARMS:
            if final[control] is not None:
                out[f"{arm} - {control}"] = paired_interval(final[arm], final[control])
        if final["full_view_solo"] is not None:
            shares = {"from_untrained": gap_closed(final[arm], final["untrained"], final["full_view_solo"])}
            if final["own_view_solo"] is not None:
                shares["from_own_view_solo"] = gap_closed(final[arm], final["own_view_solo"], final["full_view_solo"])
            out[f"{arm} gap to full_view_solo closed"] = shares
    return out


def research_bar(paired: dict[str, Any]) -> dict[str, Any]:
    """Issue's bar per team (greedy): above the untrained team, ``own_view_solo`` and its masked self, CI lows > 0."""
    out = {}
    for arm in TEAM_ARMS:
        keys = {"above_untrained": f"{arm} - untrained", "above_own_view_solo": f"{arm} - own_view_solo",
                "above_masked": f"{arm} - masked {arm}"}
        if all(k in paired for k in keys.values()):
            checks = {name: paired[key]["low"] > 0 for name, key in keys.items()}
            out[arm] = {**checks, "met": all(checks.values())}
    return out


def summary_figure(summaries: dict[str, Any], path: Path, chance: float | None = None) -> Path:
    """Arms side by side: greedy final-turn accuracy with 95% CIs, each team's masked play beside it, and the
    accuracy of a uniform guess (``chance``, the env's ``chance_accuracy``) as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(summaries)
    fig, ax = plt.subplots(figsize=(1.6 * len(arms) + 2, 4.2))
    for offset, (setting, label, color) in enumerate((("main", "as played", "C0"), ("masked", "messages masked",
                                                                                     "0.6"))):
        xs, entries = [], []
        for i, arm in enumerate(arms):
            s = summaries[arm]
            entry = (s.get("team") or s.get("full")) if setting == "main" else s.get("masked")
            if entry is not None:
                xs.append(i + (offset - 0.5) * 0.38)
                entries.append(entry["final_turn_accuracy"])
        means = np.array([e["mean"] for e in entries])
        errors = [means - [e["low"] for e in entries], np.array([e["high"] for e in entries]) - means]
        ax.bar(xs, means, 0.38, yerr=errors, capsize=3, color=color, label=label)
    if chance is not None:
        ax.axhline(chance, color="0.3", linestyle="--", linewidth=1, label=f"chance ({chance:.2f})")
    ax.set_xticks(np.arange(len(arms)), arms, rotation=15)
    ax.set_ylim(0, 1)
    ax.set_ylabel("final-turn accuracy, greedy (95% CI)")
    ax.set_title("held-out tasks: each team, own_view_solo seated in the team, full_view_solo alone")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def training_curves(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, list]]:
    """Each trained arm's learning signal per step (per role for a solo arm trained once per role).

    ``last_turn_reward``: the mean over agents of the last turn's reward (MAPPO: its mean reward per response);
    ``zero_advantage_share``: the share of the last turn's sample groups whose rewards were all equal, so that they
    gave no gradient (MAGRPO's tree; ``None`` for MAPPO).
    """
    curves: dict[str, dict[str, list]] = {}
    for arm, record in records.items():
        for row in record.get("history") or []:
            if "step" not in row:
                continue
            label = arm if row.get("role") is None or arm != "own_view_solo" else f"{arm} (role {row['role']})"
            per_turn: dict[int, list[str]] = {}      # turn -> its per-agent "turn<t>/<agent>/reward_mean" keys
            for key in row:
                parts = key.split("/")
                if len(parts) == 3 and parts[0].startswith("turn") and parts[2] == "reward_mean":
                    per_turn.setdefault(int(parts[0][4:]), []).append(key)
            if per_turn:
                agents = per_turn[max(per_turn)]
                reward = float(np.mean([row[key] for key in agents]))
                zero = [row.get(key.replace("reward_mean", "zero_advantage_groups")) for key in agents]
                zero_share = float(np.mean(zero)) if all(z is not None for z in zero) else None
            elif "reward_mean" in row:
                reward, zero_share = float(row["reward_mean"]), None
            else:
                continue
            curve = curves.setdefault(label, {"step": [], "last_turn_reward": [], "zero_advantage_share": []})
            curve["step"].append(int(row["step"]))
            curve["last_turn_reward"].append(reward)
            curve["zero_advantage_share"].append(zero_share)
    return curves


def training_figure(curves: dict[str, dict[str, list]], path: Path) -> Path:
    """Two panels over training steps: each arm's last-turn reward, and the share of its groups with no gradient."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (reward_ax, zero_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    for label, curve in curves.items():
        reward_ax.plot(curve["step"], curve["last_turn_reward"], marker=".", label=label)
        points = [(s, z) for s, z in zip(curve["step"], curve["zero_advantage_share"]) if z is not None]
        if points:
            zero_ax.plot(*zip(*points), marker=".", label=label)
    reward_ax.set_xlabel("training step")
    reward_ax.set_ylabel("last-turn reward, mean over agents")
    reward_ax.set_title("reward while training (not a result: held-out accuracy is)", fontsize=9)
    zero_ax.set_xlabel("training step")
    zero_ax.set_ylabel("share of groups with zero advantage")
    zero_ax.set_ylim(-0.02, 1.02)
    zero_ax.set_title("groups whose samples all earned the same reward (no gradient)", fontsize=9)
    if curves:
        reward_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def format_table(summaries: dict[str, Any], paired: dict[str, Any]) -> str:
    """A Markdown table: one row per arm, its accuracy, its masked accuracy and its paired differences."""
    def ci(e: dict[str, Any] | None) -> str:
        return "" if e is None else f"{e['mean']:+.3f} [{e['low']:+.3f}, {e['high']:+.3f}]"

    lines = ["| arm | final turn | masked | − untrained | − own_view_solo | − masked | gap closed (from own view) |",
             "|---|---|---|---|---|---|---|"]
    for arm, s in summaries.items():
        main = (s.get("team") or s.get("full"))["final_turn_accuracy"]
        masked = s.get("masked", {}).get("final_turn_accuracy")
        share = paired.get(f"{arm} gap to full_view_solo closed", {}).get("from_own_view_solo")
        lines.append(f"| {arm} | {main['mean']:.3f} [{main['low']:.3f}, {main['high']:.3f}] | "
                     f"{'' if masked is None else format(masked['mean'], '.3f')} | "
                     f"{ci(paired.get(f'{arm} - untrained'))} | {ci(paired.get(f'{arm} - own_view_solo'))} | "
                     f"{ci(paired.get(f'{arm} - masked {arm}'))} | {'' if share is None else format(share, '.2f')} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ the study
def run_study(config: StudyConfig, out: str | os.PathLike, *, log: Any = print, jobs: int = 1,
              threads_per_job: int = 1, command: str | None = None) -> dict[str, Any]:
    """Train and evaluate every arm of ``config`` (reusing arms done in ``out``); write results.json and the figure.

    ``jobs > 1`` runs that many arms at once, each in its own process with ``threads_per_job`` torch threads (the
    dearest first); every arm's result is the same as in one process (each arm seeds itself).
    """
    check_jobs(jobs, threads_per_job)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    batches = matched_batches(config)
    log_matching(config, batches.values(), "roles", log)
    records = run_arms(config, out, finished_arm=finished_arm, run_arm=run_arm, make_evaluator=Evaluator,
                       in_workers=lambda pending: sorted(pending, key=ARM_COST_ORDER.index),
                       jobs=jobs, threads_per_job=threads_per_job, log=log)
    arm_scores = {arm: record.pop("scores") for arm, record in records.items()}
    summaries = {arm: arm_summary(arm_scores[arm]) for arm in config.arms}
    paired = comparisons(arm_scores)
    curves = training_curves(records)
    chance = config.make_env("test").chance_accuracy
    results = {
        "study": "information-split study", "command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                     time.gmtime()),
        "commit": _commit(), "config": asdict(config), "completions_per_step": config.completions_per_step,
        "chance_accuracy": chance,
        "matching": {arm: {**asdict(b), "sampled_in_training": records[arm]["counts"]} for arm, b in batches.items()},
        "arms": {arm: {**summaries[arm], "train_seconds": records[arm]["train_seconds"],
                       "eval_seconds": records[arm]["eval_seconds"],
                       "play_seconds": records[arm].get("play_seconds"), "checkpoint": records[arm]["checkpoint"],
                       "commit": records[arm].get("commit"), "finished": records[arm].get("finished")}
                 for arm in config.arms},
        "paired_differences": paired, "research_bar": research_bar(paired), "training": curves,
        "protocol": {arm: records[arm]["transcripts"] for arm in config.arms},
        "accuracy": "greedy; final-turn accuracy: fraction of the seats right at the last turn (one seat for "
                    "full_view_solo), per task; masked: the same team with every partner's message replaced by an "
                    "empty one; intervals: 95% percentile bootstrap over tasks, paired by task; gap closed: (team − "
                    "base) / (full_view_solo − base) of the mean accuracies",
        "machine": {"processor": collaboration._processor(), "python": platform.python_version(),
                    "cores": os.cpu_count()},
        "jobs": jobs, "threads_per_job": threads_per_job,
        "wall_time_s": {"this_call": time.perf_counter() - started,
                        "all_arms": sum(r["train_seconds"] + r["eval_seconds"] for r in records.values())},
    }
    write_text_atomically(out / "results.json", json.dumps(results, indent=2, default=str))
    summary_figure(summaries, out / "summary.png", chance)
    training_figure(curves, out / "training.png")
    log(format_table(summaries, paired))
    for arm, bar in results["research_bar"].items():
        log(f"research bar, {arm}: {'met' if bar['met'] else 'not met'} ({bar})")
    log(f"time: {results['wall_time_s']['all_arms'] / 60:.1f} min of training + evaluation summed over arms, this "
        f"call {results['wall_time_s']['this_call'] / 60:.1f} min wall with {jobs} job(s); wrote "
        f"{out / 'results.json'}, {out / 'summary.png'} and {out / 'training.png'}")
    return results


def share_untrained_play(config: StudyConfig, done: Sequence[Path], out: Path, log: Any = print) -> None:
    """Copy the untrained team's play from the first study folder in ``done`` that holds it for ``config`` into
    ``out``, unless ``out`` holds it already: its greedy play does not depend on the seed."""
    if "untrained" not in config.arms or finished_arm(config, out, "untrained") is not None:
        return
    for folder in done:
        if finished_arm(config, folder, "untrained") is not None:
            shutil.copytree(folder / "arms" / "untrained", out / "arms" / "untrained", dirs_exist_ok=True)
            log(f"untrained: its play in {folder} is this seed's too (greedy play does not depend on the seed)")
            return


def run_seeds(config: StudyConfig, out: str | os.PathLike, seeds: Sequence[int], *, log: Any = print,
              jobs: int = 1, threads_per_job: int = 1, command: str | None = None) -> dict[str, Any]:
    """The study once per seed in ``out/seed-<s>``, then the spread over seeds of each team − ``own_view_solo`` and
    of each arm's final-turn accuracy: ``seeds.json`` and ``seeds.png`` in ``out``."""
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    if len(seeds) < 2:
        raise ValueError(f"a seed repeat needs at least two distinct seeds, got {seeds}")
    out = Path(out)
    per_seed = {}
    for seed in seeds:
        seeded = replace(config, seed=seed)
        share_untrained_play(seeded, [out / f"seed-{s}" for s in per_seed], out / f"seed-{seed}", log)
        per_seed[seed] = run_study(seeded, out / f"seed-{seed}", log=log, jobs=jobs,
                                   threads_per_job=threads_per_job, command=command)
    spread: dict[str, Any] = {}
    for arm in config.arms:
        rows = {"final_turn_accuracy": [(per_seed[s]["arms"][arm].get("team") or per_seed[s]["arms"][arm]["full"])
                                        ["final_turn_accuracy"] for s in seeds]}
        for key in (f"{arm} - own_view_solo", f"{arm} - masked {arm}"):
            values = [per_seed[s]["paired_differences"].get(key) for s in seeds]
            if all(values):
                rows[key.replace(f"{arm} - ", "minus ")] = values
        spread[arm] = {name: seed_spread(seeds, values) for name, values in rows.items()}
    results = {"seeds": seeds, "config": {**asdict(config), "seed": None}, "arms": spread, "command": command,
               "spread": "per seed: mean and paired 95% CI over the held-out tasks; over seeds: mean, sample standard "
                         "deviation, min and max of the per-seed means"}
    write_text_atomically(out / "seeds.json", json.dumps(results, indent=2, default=str))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    teams = [a for a in TEAM_ARMS if "minus own_view_solo" in spread.get(a, {})]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for i, arm in enumerate(teams):
        plot_seed_points(ax, i, spread[arm]["minus own_view_solo"]["per_seed"], seeds, width=0.15, label=i == 0)
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xticks(range(len(teams)), teams)
    ax.set_ylabel("team − own_view_solo (95% CI)")
    if teams:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "seeds.png", dpi=120)
    plt.close(fig)
    log(f"wrote {out / 'seeds.json'} and {out / 'seeds.png'}")
    return results


def _commit() -> str | None:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


__all__ = ["ARMS", "Evaluator", "StudyConfig", "TEAM_ARMS", "arm_summary", "comparisons", "finished_arm",
           "format_table", "matched_batches", "research_bar", "run_arm", "run_seeds", "run_study", "summary_figure",
           "train_arm", "training_curves", "training_figure", "transcripts"]
