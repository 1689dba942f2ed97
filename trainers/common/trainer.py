"""`Trainer`: what every trainer shares, written once: train, evaluate, save, load, resume, seeding, optimizers.

An algorithm subclasses :class:`Trainer` and writes its step (:meth:`Trainer.run_step`: collect,
update, return the step's metrics) and its own state; the shell does the rest (as TRL's
``trl/trainer/base_trainer.py`` does for its trainers):

1. **build** — check that every agent's policy can be trained, split the tasks into training and
   held-out ones (:func:`~trainers.common.evaluation.held_out_tasks`), seed the run
   (:meth:`Trainer.seed_run`), add the algorithm's own models (:meth:`Trainer.build_models`, e.g.
   MAPPO's critic), place and synchronise everything over the processes
   (:func:`~trainers.common.distributed.prepare_training`), build the optimizers
   (:meth:`Trainer.build_optimizers`), resume from ``resume_from_checkpoint`` when it is set (the
   one resume point: a trainer built to resume starts at the checkpoint's step) and open the
   metric sinks.
2. **train** — :meth:`Trainer.train_step` until ``max_steps``: evaluate every ``eval_every`` steps,
   log every ``logging_every``, checkpoint every ``save_every`` steps, every ``save_every_minutes`` and at
   the last step (:meth:`Trainer.checkpoint_due`), keeping the newest ``save_total_limit``.
3. **evaluate, save, load** — the same for every algorithm; an algorithm adds its own checkpoint
   state with :meth:`Trainer.extra_state` and :meth:`Trainer.load_extra_state`.

Seeding: a run that starts fresh draws the LoRA weights of the adapters it trains from
``config.seed`` (:func:`initialise_adapters`), whatever the global RNG did before the team was
built, so two runs of the same seeded command train the same weights. Then every process seeds
python, numpy and torch with ``seed + process index`` (its own sampling noise).
"""
from __future__ import annotations

import os
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.distributed.tensor import DTensor
from tqdm.auto import tqdm
from transformers import get_scheduler

from llm_marl.backends.hf import HFPolicy
from llm_marl.policy import SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.team import Team
from llm_marl_envs.core import TextEnv

from .checkpoint import (
    checkpoint_dir,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    resolve_checkpoint,
    save_checkpoint,
)
from .config import TrainerConfig
from .distributed import build_accelerator, prepare_training
from .evaluation import EvalResult, eval_report_path, evaluate_episodes, held_out_tasks
from .logging import MetricsLogger


def step_seed(seed: int, step: int, salt: int = 0, process: int = 0) -> int:
    """A deterministic 31-bit seed for ``(seed, step, salt)`` (and the process index, when not the main one)."""
    entropy = [seed, step, salt] + ([process] if process else [])
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] & 0x7FFFFFFF)


def adamw(params: Sequence[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``params``, fused (one pass over the weights per step) when they sit on the CPU or a CUDA GPU and
    are all sharded or all whole (the fused kernel refuses a mix, e.g. a sharded critic adapter and its head)."""
    fused = (all(p.device.type in ("cpu", "cuda") for p in params)
             and len({isinstance(p, DTensor) for p in params}) <= 1)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)


# PEFT models a trainer has been built on: their adapters are where that run started, no longer PEFT's draw
_STARTED_MODELS: weakref.WeakSet = weakref.WeakSet()


def initialise_adapters(team: Team, agents: Sequence[str], seed: int) -> list[str]:
    """Draw again, from ``seed``, the LoRA weights of the agents' adapters that no trainer has started from yet and
    that do not change their base; the names of the adapters drawn.

    An adapter at PEFT's initialisation (``init_lora_weights`` True or ``"gaussian"``) has a zero factor in every
    layer (``lora_B``; ``lora_embedding_A`` for embeddings), so its other factor only decides where training
    starts; PEFT drew it from whatever the global RNG held when the team was built. It is drawn again here with
    PEFT's own initialiser after ``torch.manual_seed(seed)``, adapter by adapter in the agents' order. Left as they
    are: an adapter that already changes its base (trained, or loaded from a checkpoint), every other
    initialisation (which may have changed the base weights), and every adapter of a model a trainer has been
    built on before, resumed or not (a later phase of a curriculum starts where the earlier one left its adapters).
    """
    from peft.tuners.lora import LoraLayer

    torch.manual_seed(seed)
    drawn: list[str] = []
    models = _peft_models(team, agents)
    fresh = {key for key, model in models.items() if model not in _STARTED_MODELS}
    seen: set[tuple[int, str]] = set()
    for agent in agents:
        policy, adapter = team.policy(agent), team.adapter(agent)
        if adapter is None or id(policy.model) not in fresh or (id(policy.model), adapter) in seen:
            continue
        seen.add((id(policy.model), adapter))
        init = policy.model.peft_config[adapter].init_lora_weights
        layers = [m for m in policy.model.modules()
                  if isinstance(m, LoraLayer) and (adapter in m.lora_A or adapter in m.lora_embedding_A)]
        if not (init is True or init == "gaussian") or not layers or any(_changes_base(m, adapter) for m in layers):
            continue
        with torch.no_grad():
            for layer in layers:
                layer.reset_lora_parameters(adapter, init)
        drawn.append(adapter)
    _STARTED_MODELS.update(models.values())
    return drawn


def _peft_models(team: Team, agents: Sequence[str]) -> dict[int, Any]:
    """The PEFT models the agents' policies act with, by ``id``."""
    return {id(p.model): p.model for p in (team.policy(a) for a in agents) if getattr(p, "is_peft", False)}


def _changes_base(layer: Any, adapter: str) -> bool:
    """Whether ``adapter``'s update ``B·A`` of this LoRA layer can be nonzero (neither zero factor is zero)."""
    if adapter in layer.lora_A:
        return bool(layer.lora_B[adapter].weight.any())
    return bool(layer.lora_embedding_A[adapter].any())


def check_trainable(team: Team, agents: Sequence[str], kl_coef: float) -> None:
    """``ValueError`` unless every agent's policy can be trained here (and, with a KL term, carries LoRA adapters)."""
    for agent in agents:
        policy = team.policy(agent)
        if not isinstance(policy, HFPolicy):
            raise ValueError(f"{agent}'s policy {policy.name!r} cannot be trained (inference-only backend); "
                             f"train HFPolicy members (Team.adapter_per_agent / Team.separate)")
        if kl_coef > 0 and not policy.is_peft:
            raise ValueError(f"kl_coef={kl_coef} needs a LoRA policy (the reference is the base with the adapter "
                             f"disabled); {agent} is fully fine-tuned: set kl_coef=0 or use LoRA")


class Trainer:
    """Base of the trainers: the loop, evaluation, checkpoints, seeding and optimizers (see the module docstring).

    Subclasses set :attr:`name` (the progress bar's label), :attr:`batch_field` (the config field of the
    global batch, split over processes) and :attr:`progress_metric` (the metric shown on the bar), and
    implement :meth:`run_step`.
    """

    name = "train"
    batch_field = ""
    progress_metric: str | None = None

    def __init__(self, env: TextEnv, team: Team, config: TrainerConfig, *, eval_env: TextEnv | None = None,
                 accelerator: Accelerator | None = None) -> None:
        self.config = config
        team.check_covers(env.possible_agents)
        self.env, self.team, self.agents = env, team, list(env.possible_agents)
        self.eval_env = env if eval_env is None else eval_env
        check_trainable(team, self.agents, config.kl_coef)
        self.train_tasks, self.eval_tasks = held_out_tasks(env, eval_env, config.eval_tasks)
        accelerator = build_accelerator(config, accelerator)
        self.seed_run(accelerator.process_index)
        extra_parameters = self.build_models()
        self.distributed = prepare_training(config, team, self.agents, getattr(config, self.batch_field),
                                            self.batch_field, accelerator, extra_parameters=extra_parameters)
        self.accelerator = self.distributed.accelerator
        self.eval_engine = RolloutEngine(self.eval_env, team, progress=config.progress and self.distributed.is_main)
        self.step = 0
        self.history: list[dict[str, float]] = []
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.schedulers: dict[str, Any] = {}
        self.parameters: dict[str, list[torch.nn.Parameter]] = {}
        # agents that act with the same weights (one policy and adapter) share one optimizer: an update group
        self.update_groups: dict[str, list[str]] = {}
        self.build_optimizers()
        if config.resume_from_checkpoint is not None:
            self.load(resolve_checkpoint(config.resume_from_checkpoint, config.output_dir))
        self.logger = MetricsLogger(config.output_dir, config.report_to, enabled=self.distributed.is_main,
                                    run_config=config.to_dict(), first_step=self.step + 1)
        self._last_save = time.monotonic()

    # ------------------------------------------------------------------ set-up
    def seed_run(self, process_index: int) -> None:
        """The run's one seeding call: a fresh run (no ``resume_from_checkpoint``) draws its untrained adapters from
        ``config.seed`` (:func:`initialise_adapters`); then python, numpy and torch are seeded with ``seed +
        process_index``. A resumed run gets its weights and RNG states from the checkpoint."""
        if self.config.resume_from_checkpoint is None:
            initialise_adapters(self.team, self.agents, self.config.seed)
        else:       # built on as a fresh run is: a later trainer on these models keeps their adapters either way
            _STARTED_MODELS.update(_peft_models(self.team, self.agents).values())
        set_seed(self.config.seed + process_index)

    def build_models(self) -> list[torch.nn.Parameter]:
        """Models the algorithm adds beside the team, built after seeding and before the team is placed, synchronised
        and sharded; returns their trainable parameters (none here)."""
        return []

    def build_optimizers(self) -> None:
        """The optimizers of the run: here one per update group (:meth:`add_agent_optimizers`)."""
        self.add_agent_optimizers()

    def add_agent_optimizers(self, learning_rates: Mapping[str, float] | None = None,
                             schedule: tuple[str, int, int] | None = None) -> None:
        """One AdamW (:func:`adamw`, ``config.weight_decay``) per update group: agents that act with one policy and
        adapter share it. ``learning_rates``: ``{agent: lr}`` (others: ``config.learning_rate``); ``schedule``:
        ``(transformers scheduler name, warm-up steps, total steps)`` of a scheduler per optimizer."""
        config, team = self.config, self.team
        rates = {a: (learning_rates or {}).get(a, config.learning_rate) for a in self.agents}
        for agent in self.agents:
            leader = next((first for first in self.update_groups if team.policy(first) is team.policy(agent)
                           and team.adapter(first) == team.adapter(agent)), None)
            if leader is not None:
                pair = {a: rates[a] for a in (leader, agent)}
                if len(set(pair.values())) > 1:
                    raise ValueError(f"{leader} and {agent} share one adapter ({team.adapter(agent)!r}) and so one "
                                     f"optimizer, but agent_learning_rates gives them {pair}")
                self.update_groups[leader].append(agent)
                for table in (self.optimizers, self.schedulers, self.parameters):
                    if leader in table:
                        table[agent] = table[leader]
                continue
            self.update_groups[agent] = [agent]
            self.parameters[agent] = team.policy(agent).trainable_parameters(team.adapter(agent))
            self.optimizers[agent] = adamw(self.parameters[agent], rates[agent], config.weight_decay)
            if schedule is not None:
                name, warmup_steps, total_steps = schedule
                self.schedulers[agent] = get_scheduler(name, self.optimizers[agent], num_warmup_steps=warmup_steps,
                                                       num_training_steps=total_steps)

    # ------------------------------------------------------------------ the loop
    def run_step(self, step: int) -> dict[str, float]:
        """Train step ``step`` (collect, update); the step's metrics, merged over processes."""
        raise NotImplementedError

    def train_step(self) -> dict[str, float]:
        """Train the next step; its metrics (merged over processes), ``step`` first."""
        step = self.step + 1
        metrics = {"step": step, **self.run_step(step)}
        self.step = step
        return metrics

    def train(self) -> list[dict[str, float]]:
        """Train up to ``max_steps`` (from the checkpoint's step when resumed); the records of the steps this call
        trained (:attr:`history` holds the whole run's, those a checkpoint restored included)."""
        cfg, first = self.config, len(self.history)
        with tqdm(total=cfg.max_steps, initial=self.step, desc=self.name,
                  disable=not (cfg.progress and self.distributed.is_main)) as bar:
            while self.step < cfg.max_steps:
                record = self.train_step()
                if cfg.eval_every and self.step % cfg.eval_every == 0:
                    record.update({f"eval/{k}": v for k, v in self.evaluate().metrics().items()})
                self.history.append(record)
                if self.step % cfg.logging_every == 0:
                    self.logger.log({k: v for k, v in record.items() if k != "step"}, self.step)
                if self.progress_metric in record:
                    bar.set_postfix({self.progress_metric: f"{record[self.progress_metric]:.3f}"})
                bar.update(1)
                if self.checkpoint_due():
                    self.save()
        return self.history[first:]

    def checkpoint_due(self) -> bool:
        """Whether the step just trained is checkpointed: every ``save_every`` steps, at the last step, and after a
        step that ends ``save_every_minutes`` or more after the last checkpoint (the main process's clock decides
        for every process)."""
        cfg = self.config
        if (cfg.save_every and self.step % cfg.save_every == 0) or self.step >= cfg.max_steps:
            return True
        late = bool(cfg.save_every_minutes) and time.monotonic() - self._last_save >= 60 * cfg.save_every_minutes
        return bool(self.distributed.max(int(late and self.distributed.is_main)))

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, num_tasks: int | None = None) -> EvalResult:
        """Play the first ``num_tasks`` held-out tasks (default: all of them) at ``eval_temperature``; the team
        reward and each turn's accuracy with their CIs.

        Held out (:func:`~trainers.common.evaluation.held_out_tasks`): the eval env's tasks, else the training
        env's last ``eval_tasks``, which training never draws. Task ``i`` plays with env seed ``seed + i`` and the
        sampling noise follows ``seed``, so an evaluation replays. Under ``accelerate launch`` each process plays
        its share; every process gets all episodes. The episodes' page is written to
        ``<output_dir>/eval/step-<step>/report.html``.
        """
        cfg, held_out = self.config, len(self.eval_tasks)
        if not held_out:
            raise ValueError("no held-out tasks: set eval_tasks >= 1 or pass eval_env")
        n = held_out if num_tasks is None else num_tasks
        if not 1 <= n <= held_out:
            raise ValueError(f"num_tasks must be between 1 and the {held_out} held-out tasks, got {num_tasks}; "
                             f"ask for fewer or raise eval_tasks")
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.eval_temperature, top_p=cfg.top_p,
                                seed=step_seed(cfg.seed, 0, 1, self.distributed.rank))
        return evaluate_episodes(self.eval_engine, self.distributed, self.accelerator, self.eval_tasks[:n],
                                 [cfg.seed + i for i in range(n)], params,
                                 report_path=eval_report_path(cfg.output_dir, self.step))

    # ------------------------------------------------------------------ checkpoints
    def extra_state(self) -> dict[str, Any]:
        """The algorithm's own checkpoint state beside the agents' weights and optimizers (tensors may be sharded:
        they are gathered whole)."""
        return {}

    def load_extra_state(self, extra: Mapping[str, Any], path: Path) -> None:
        """Restore what :meth:`extra_state` saved (``path``: the checkpoint, for error messages)."""

    def save(self) -> Path:
        """Write the checkpoint of the current step atomically; its path.

        Every process calls it (sharded weights are gathered); the main process writes, with every process's RNG
        states, the run's records so far and :meth:`extra_state`.
        """
        process_rng = self.distributed.rng_states()
        gathered = self.distributed.checkpoint_tensors(self.team, self.optimizers, extra=self.extra_state())
        path = checkpoint_dir(self.config.output_dir, self.step)
        if self.distributed.is_main:
            weights, optimizer_states, extra = gathered
            path = save_checkpoint(self.config.output_dir, self.step, self.team, self.optimizers, self.schedulers,
                                   self.config.to_dict(), {**extra, "history": self.history},
                                   process_rng=process_rng, tensors=(weights, optimizer_states), env=self.env)
            if self.config.save_total_limit:
                prune_checkpoints(self.config.output_dir, self.config.save_total_limit)
        self.distributed.barrier()
        self._last_save = time.monotonic()
        return path

    def load(self, path: str | os.PathLike) -> None:
        """Restore a checkpoint written by :meth:`save` (every process reads it); training continues after its
        step."""
        path = Path(path)
        state = load_checkpoint(path, self.team, self.optimizers, self.schedulers, process_index=self.distributed.rank,
                                num_processes=self.distributed.num_processes)
        self.load_extra_state(state["extra"], path)
        self.history = list(state["extra"].get("history", []))
        self.step = int(state["step"])

    def latest_checkpoint(self) -> Path | None:
        """The newest checkpoint under ``output_dir`` (``None`` if none)."""
        return latest_checkpoint(self.config.output_dir)


__all__ = ["Trainer", "adamw", "check_trainable", "initialise_adapters", "step_seed"]
