"""TRL bridge: train ONE shared policy on any env of this library with TRL's ``GRPOTrainer`` (parameter sharing).

The standard single-policy GRPO recipe on this library's envs and verifiers: every agent of the env is the
same model, TRL owns the optimisation (loss, clipping, KL, scheduler, logging, checkpoints) and
the library's :class:`~llm_marl.rollout.RolloutEngine` plays the episodes through TRL's ``rollout_func``
hook (TRL >= 0.22; used here as TRL 1.16 ships it).

How one TRL generation batch maps onto episodes:

1. **dataset** — :func:`task_dataset`: one row per task; ``prompt`` is the first agent's turn-0
   conversation (TRL's sampler repeats each row ``num_generations`` times, consecutively).
2. **rollout** — :class:`EnvRollout`: each run of identical prompts is one task; with ``N``
   agents and ``T`` turns it plays ``E = num_generations / (N·T)`` full episodes of that task
   (all agents sampled from the shared model, every turn of all episodes in one batched
   generate call) and returns ONE ROW PER AGENT AND TURN: that turn's real prompt (the agent's
   own history with the other agents' answers), its completion and its sampling log-probs.
3. **reward** — :func:`env_reward`: each row's reward is the env's verifier reward, by default
   the episode's team reward (mean over agents and turns, the cooperative joint reward, so all
   rows of an episode share it), or the row's own turn reward (``reward="own"``).
4. **advantage / loss / update** — TRL's: group-relative over the ``num_generations`` rows of a
   task, its clipped surrogate, one optimizer for the one model.

What the installed TRL can and cannot do for a multi-agent episode (read from
``trl/trainer/grpo_trainer.py`` 1.16): ``rollout_func(prompts, trainer)`` receives only the
prompts (not the dataset rows: the task is found again from the prompt text) and must return
one ``prompt_ids``/``completion_ids``/``logprobs`` row per prompt; TRL then scores rows as
independent single-turn samples of ONE model. So it drives a multi-agent, multi-turn episode
only as parameter sharing, as above. It would need, for MAGRPO's separate agents:

* one model (or adapter) and optimizer per agent, with rows routed to their agent's loss —
  ``GRPOTrainer`` holds one ``model`` and one optimizer;
* groups keyed by (task, agent, tree node) instead of "``num_generations`` consecutive rows",
  so each agent's G samples are compared with each other (MAGRPO's per-agent advantage);
* returns over a tree of joint actions (``R = r + γ·mean(child returns)``): TRL has one scalar
  reward per row and no notion of a node's children, so every row here gets the episode's
  reward (γ = 1, no per-node baseline);
* a variable number of rows per task (episodes that stop early): TRL requires exactly
  ``num_generations`` rows per prompt, so envs with ``stop_on_consensus`` are refused.

``examples/grpo_vs_magrpo.py`` trains this baseline and MAGRPO at equal samples on the same env
and tasks and reports held-out accuracy side by side.
"""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from llm_marl.backends.hf import HFPolicy
from llm_marl.policy import SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.team import Team
from llm_marl_envs.core import TextEnv

from .common.evaluation import EvalResult, evaluate_episodes

REWARDS = ("team", "own")


def prompt_key(prompt: Any) -> str:
    """A hashable key of a dataset prompt (a conversation or a string)."""
    return json.dumps(prompt, sort_keys=True)


def task_dataset(env: TextEnv, tasks: Sequence[int] | None = None) -> Dataset:
    """One row per task (default: all of the env's): ``prompt`` = agent 0's turn-0 conversation, ``task_index``."""
    tasks = list(range(len(env.tasks))) if tasks is None else list(tasks)
    rows = []
    for index in tasks:
        env.reset(seed=0, options={"task_index": index})
        rows.append({"prompt": [dict(m) for m in env.messages[env.possible_agents[0]]], "task_index": index})
    return Dataset.from_list(rows)


class EnvRollout:
    """TRL ``rollout_func``: plays whole episodes of ``env`` with the trainer's model in every seat (see module doc)."""

    def __init__(self, env: TextEnv, dataset: Dataset, reward: str = "team", seed: int = 0) -> None:
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        if getattr(env, "stop_on_consensus", False):
            raise ValueError("TRL needs exactly num_generations rows per task, but stop_on_consensus=True ends "
                             "episodes early (fewer rows); make the env with stop_on_consensus=False")
        self.env, self.reward, self.seed = env, reward, seed
        self.rows_per_episode = len(env.possible_agents) * env.num_turns
        self.task_of = {}
        for row in dataset:
            self.task_of.setdefault(prompt_key(row["prompt"]), int(row["task_index"]))
        self.calls = 0
        self._policy: HFPolicy | None = None

    def check_config(self, args: GRPOConfig) -> None:
        """``num_generations`` must hold whole episodes: a multiple of agents × turns."""
        if args.num_generations % self.rows_per_episode:
            n, t = len(self.env.possible_agents), self.env.num_turns
            raise ValueError(f"num_generations must be a multiple of agents × turns = {n} × {t} = "
                             f"{self.rows_per_episode} (one row per agent and turn of whole episodes), got "
                             f"{args.num_generations}; set it to {self.rows_per_episode}·E for E episodes per task")

    def policy(self, trainer: GRPOTrainer) -> HFPolicy:
        """The trainer's (unwrapped) model as a sampling policy, built once."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        if self._policy is None or self._policy.model is not model:
            was_training = model.training
            self._policy = HFPolicy(model, trainer.processing_class, name="shared")
            model.train(was_training)
        return self._policy

    @contextlib.contextmanager
    def seated(self, trainer: GRPOTrainer, env: TextEnv) -> Iterator[Team]:
        """The trainer's model in every seat of ``env``, sampling in eval mode without gradients (mode restored)."""
        policy = self.policy(trainer)
        adapter = policy.model.active_adapter if policy.is_peft else None
        was_training = policy.model.training
        policy.model.eval()
        try:
            with torch.no_grad():
                yield Team.from_policies({agent: (policy, adapter) for agent in env.possible_agents})
        finally:
            policy.model.train(was_training)

    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, list]:
        groups = self._groups(prompts)
        tasks = [task for task, count in groups for _ in range(count // self.rows_per_episode)]
        seeds = [self.seed * 1_000_003 + self.calls * 100_003 + i for i in range(len(tasks))]
        self.calls += 1
        args = trainer.args
        params = SamplingParams(max_new_tokens=args.max_completion_length, temperature=args.temperature,
                                top_p=args.top_p, seed=seeds[0] if seeds else None)
        with self.seated(trainer, self.env) as team:
            episodes = RolloutEngine(self.env, team, params, progress=False).collect(
                task_indices=tasks, seeds=seeds, params=params)
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_reward": [],
                                "agent": [], "turn": []}
        for episode in episodes:
            if len(episode.turns) != self.env.num_turns:
                raise ValueError(f"an episode of task {episode.task_index} ended after {len(episode.turns)} of "
                                 f"{self.env.num_turns} turns; TRL needs num_generations rows per task")
            for turn in episode.turns:
                for agent, step in turn.items():
                    out["prompt_ids"].append(list(step.prompt_ids))
                    out["completion_ids"].append(list(step.completion_ids))
                    out["logprobs"].append([float(x) for x in step.logprobs])
                    out["env_reward"].append(episode.team_reward if self.reward == "team" else float(step.reward))
                    out["agent"].append(agent)
                    out["turn"].append(step.turn)
        return out

    def _groups(self, prompts: list[Any]) -> list[tuple[int, int]]:
        """``(task index, copies)`` of each run of identical consecutive prompts; each must hold whole episodes."""
        groups: list[tuple[str, int]] = []
        for prompt in prompts:
            key = prompt_key(prompt)
            if groups and groups[-1][0] == key:
                groups[-1] = (key, groups[-1][1] + 1)
            else:
                groups.append((key, 1))
        out = []
        for key, count in groups:
            if key not in self.task_of:
                raise ValueError("rollout_func got a prompt that is not in the dataset of this bridge; build the "
                                 "trainer with make_grpo_trainer (its dataset and rollout belong together)")
            if count % self.rows_per_episode:
                raise ValueError(f"this process got {count} copies of a task, not a multiple of agents × turns = "
                                 f"{self.rows_per_episode}; make per_device_train_batch_size a multiple of "
                                 f"num_generations so every process gets whole tasks")
            out.append((self.task_of[key], count))
        return out


def env_reward(prompts: list[Any], completions: list[Any], env_reward: list[float], **_: Any) -> list[float]:
    """The reward the rollout computed with the env's verifier (TRL passes rollout fields by name)."""
    return [float(r) for r in env_reward]


def make_grpo_trainer(env: TextEnv, model: Any, tokenizer: Any, args: GRPOConfig, *,
                      tasks: Sequence[int] | None = None, reward: str = "team", **trainer_kwargs: Any) -> GRPOTrainer:
    """A ``GRPOTrainer`` that trains ``model`` as the shared policy of every agent of ``env`` on ``tasks``.

    ``trainer_kwargs`` go to ``GRPOTrainer`` (e.g. ``peft_config`` for one shared LoRA adapter).
    """
    dataset = task_dataset(env, tasks)
    rollout = EnvRollout(env, dataset, reward=reward, seed=args.seed)
    rollout.check_config(args)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")   # rollout_func is marked experimental in TRL
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return GRPOTrainer(model=model, reward_funcs=[env_reward], args=args, train_dataset=dataset,
                       processing_class=tokenizer, rollout_func=rollout, **trainer_kwargs)


def evaluate_shared_policy(trainer: GRPOTrainer, env: TextEnv, tasks: Sequence[int], seeds: Sequence[int],
                           params: SamplingParams, report_path: str | os.PathLike | Path | None = None) -> EvalResult:
    """Play ``tasks`` of ``env`` with the trained model in every seat; the trainers' :class:`EvalResult`."""
    rollout: EnvRollout = trainer.rollout_func
    with rollout.seated(trainer, env) as team:
        return evaluate_episodes(RolloutEngine(env, team, progress=False), None, None, tasks, seeds, params,
                                 desc="evaluate shared policy", report_path=report_path)


__all__ = ["EnvRollout", "env_reward", "evaluate_shared_policy", "make_grpo_trainer", "task_dataset"]
