"""`EvalResult`: what every trainer's ``evaluate()`` returns, and the evaluation pass that fills it.

:func:`held_out_tasks` decides which tasks a trainer trains on and which it evaluates on (the same
rule for every trainer). A trainer picks the seeds and the sampling settings; :func:`evaluate_episodes` plays
them (each process its share under ``accelerate launch``) and summarises every process's
episodes the way the benchmark harness does: records from
:func:`llm_marl.benchmark.episode_record`, means with percentile-bootstrap CIs from
:func:`llm_marl_envs.metrics.bootstrap_ci`.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from llm_marl.benchmark import episode_record, summarize
from llm_marl.episode import Episode
from llm_marl.policy import SamplingParams
from llm_marl.report import RunView, write_html_report
from llm_marl.rollout import RolloutEngine
from llm_marl_envs import metrics

BOOTSTRAP_RESAMPLES = 10_000


@dataclass
class EvalResult:
    """Held-out episodes and their summary; CIs are 95% percentile-bootstrap intervals over episodes.

    Attributes:
        num_episodes: episodes played, every process's.
        team_reward, team_reward_ci: mean over episodes of the team reward (an episode's mean
            reward over agents and turns) and its ``(low, high)`` interval.
        rewards: each episode's team reward, in task order.
        accuracy_per_turn, accuracy_per_turn_ci: per turn, the mean over episodes of the fraction
            of agents judged correct (an episode that stopped early keeps its last answers), and its
            interval; ``None`` when the verifier judges no answer right or wrong (e.g. writing rewards).
        episodes: one JSON-ready record per episode, in task order (``episode_record`` of the
            benchmark: per turn and agent, correctness, scores, extracted answers, responses).
        num_turns: turns of the env the episodes ran in.
        wall_time_s: seconds the evaluation took (every process's share played at once), when measured;
            the report's total wall time (else the sum of the episodes' shares of their batches).
    """

    num_episodes: int
    team_reward: float
    team_reward_ci: tuple[float, float]
    rewards: list[float]
    accuracy_per_turn: list[float] | None
    accuracy_per_turn_ci: list[tuple[float, float]] | None
    episodes: list[dict[str, Any]] = field(repr=False)
    num_turns: int = 1
    wall_time_s: float | None = None

    @classmethod
    def from_episodes(cls, episodes: Sequence[Episode], num_turns: int, models: Sequence[str],
                      wall_time_s: float | None = None) -> EvalResult:
        """Summarise finished episodes of an env with ``num_turns`` turns played by ``models`` (one per agent)."""
        if not episodes:
            raise ValueError("an evaluation needs at least one episode; set eval_tasks >= 1")
        records = [episode_record(i, e, e.wall_time, models) for i, e in enumerate(episodes)]
        rewards = [float(e.team_reward) for e in episodes]
        mean, low, high = metrics.bootstrap_ci(rewards, num_resamples=BOOTSTRAP_RESAMPLES)
        accuracy = accuracy_ci = None
        if any(c is not None for r in records for turn in r["correct"] for c in turn):
            per_episode = [metrics.turn_accuracy(metrics.pad_turns(r["correct"], num_turns),
                                                 metrics.pad_turns(r["scores"], num_turns)) for r in records]
            means, lows, highs = metrics.bootstrap_ci(per_episode, num_resamples=BOOTSTRAP_RESAMPLES)
            accuracy = [float(m) for m in means]
            accuracy_ci = [(float(lo), float(hi)) for lo, hi in zip(lows, highs)]
        return cls(num_episodes=len(records), team_reward=float(mean), team_reward_ci=(float(low), float(high)),
                   rewards=rewards, accuracy_per_turn=accuracy, accuracy_per_turn_ci=accuracy_ci, episodes=records,
                   num_turns=num_turns, wall_time_s=wall_time_s)

    def metrics(self) -> dict[str, float]:
        """The scalars a metric sink takes: team reward with its CI, accuracy of each turn."""
        out = {"num_episodes": float(self.num_episodes), "team_reward": self.team_reward,
               "team_reward_ci_low": self.team_reward_ci[0], "team_reward_ci_high": self.team_reward_ci[1]}
        out.update({f"accuracy_turn{t}": value for t, value in enumerate(self.accuracy_per_turn or [])})
        return out

    def write_report(self, path: str | os.PathLike, title: str = "Evaluation") -> Path:
        """Write these episodes as ``report.html`` (:mod:`llm_marl.report`: tables, plots, transcripts, filters)."""
        summary = summarize(self.episodes, self.num_turns)
        if self.wall_time_s is not None:
            summary["wall_time_total_s"] = self.wall_time_s
        view = RunView("eval", summary, self.episodes)
        low, high = self.team_reward_ci
        meta = [f"{self.num_episodes} episodes; team reward {self.team_reward:.3f} [{low:.3f}, {high:.3f}] "
                "(bootstrap 95% CI)"]
        return write_html_report(path, title, [view], meta=meta)

def held_out_tasks(env: Any, eval_env: Any | None, eval_tasks: int) -> tuple[list[int], list[int]]:
    """``(training task indices of env, evaluation task indices)``: evaluation never sees a training task.

    With an ``eval_env`` (``llm-marl train`` passes the env's test split): every task of ``env`` trains
    and the first ``eval_tasks`` of ``eval_env`` evaluate. Without one: the last ``eval_tasks`` tasks of
    ``env`` are held out and never trained on; holding out all of them is a ``ValueError``.
    """
    n = len(env.tasks)
    if eval_env is not None:
        return list(range(n)), list(range(min(eval_tasks, len(eval_env.tasks))))
    if n - eval_tasks < 1:
        raise ValueError(f"the env has {n} tasks and eval_tasks={eval_tasks} would hold out all of them; "
                         f"lower eval_tasks or pass eval_env (e.g. the env made with split='test')")
    return list(range(n - eval_tasks)), list(range(n - eval_tasks, n))


def eval_report_path(output_dir: str | os.PathLike, step: int) -> Path:
    """Where a trainer writes the page of its evaluation at ``step``: ``<output_dir>/eval/step-<step>/report.html``."""
    return Path(output_dir) / "eval" / f"step-{step:06d}" / "report.html"


EVAL_PARALLEL = 128   # episodes an evaluation advances together (bounds the KV caches held at once)


def evaluate_episodes(engine: RolloutEngine, distributed: Any | None, accelerator: Any | None, tasks: Sequence[int],
                      seeds: Sequence[int], params: SamplingParams, *, desc: str = "evaluate",
                      report_path: str | os.PathLike | None = None,
                      parallel: int | None = EVAL_PARALLEL) -> EvalResult:
    """Play ``tasks`` (with ``seeds``) through ``engine``, each process its share, and summarise all of them.

    At most ``parallel`` episodes run together (``None``: all): their KV caches share memory, ~46 KB per
    token per row for SmolLM2-135M in fp32, so 800 sampled debates at once would need ~15 GB.

    ``distributed`` is the trainer's ``DistributedTraining``: every process must call this (gathering sharded
    weights is a collective) and every process gets the whole result; ``distributed=None`` and
    ``accelerator=None`` play everything in this process. The global RNG states are left as they
    were, so evaluating does not change the training that follows. With ``report_path``, the main
    process writes the episodes' ``report.html`` there.
    """
    local_tasks, local_seeds = ((distributed.shard(list(tasks)), distributed.shard(list(seeds))) if distributed
                                else (list(tasks), list(seeds)))
    local: list[Episode] = []
    started = time.perf_counter()
    with distributed.full_weights() if distributed else contextlib.nullcontext():
        if local_tasks:
            with torch.random.fork_rng(), accelerator.autocast() if accelerator else contextlib.nullcontext():
                local = engine.collect(task_indices=local_tasks, seeds=local_seeds, params=params, desc=desc,
                                       parallel=parallel)
    models = [engine.team.policy(agent).name for agent in engine.env.possible_agents]
    played = distributed.unshard(local) if distributed else local          # waits for the slowest process
    result = EvalResult.from_episodes(played, engine.env.num_turns, models, wall_time_s=time.perf_counter() - started)
    if report_path is not None and (distributed is None or distributed.is_main):
        result.write_report(report_path, title=f"{desc}: {engine.env_name}")
    return result


__all__ = [
    "EvalResult",
    "evaluate_episodes",
    "EVAL_PARALLEL",
    "eval_report_path",
    "held_out_tasks",
    "BOOTSTRAP_RESAMPLES",
]
