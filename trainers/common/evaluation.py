"""Held-out evaluation: :class:`EvalResult` (what every trainer's ``evaluate()`` returns), the pass that plays it,
and per-task scores compared with paired intervals.

:func:`held_out_tasks` decides which tasks a trainer trains on and which it evaluates on (the same
rule for every trainer). A trainer picks the seeds and the sampling settings; :func:`evaluate_episodes` plays
them (each process its share under ``accelerate launch``) and summarises every process's
episodes the way the benchmark harness does: records from
:func:`llm_marl.benchmark.episode_record`, means with percentile-bootstrap CIs from
:func:`llm_marl_envs.metrics.bootstrap_ci`.

Per-task scores (:class:`HeldOutScores`, from :func:`held_out_scores` or :func:`scores_from`) reduce each
held-out task's episodes (one greedy play, or ``samples`` sampled plays averaged) to numbers that two teams
played on the same tasks can be compared by, **paired by task** with a percentile bootstrap over tasks
(:func:`interval`, :func:`paired_interval`, :func:`compare`):

- ``final_turn_accuracy``: the fraction of agents whose last-turn answer is right (the mean over
  agents, not a vote); ``team_answer_accuracy``: the majority vote of the final answers
  (:func:`llm_marl_envs.metrics.majority_correct`); ``turn0_accuracy`` and ``per_turn``: the same
  fraction at the first and at every turn.
- ``collaboration_gain``: final-turn minus turn-0 accuracy of the same episodes, paired by task.
- ``transitions``: the counts of an agent's answer going from correct (C) or incorrect (I) at turn t
  to C or I at turn t+1, summed over agents and turns, with the fix and break rates
  (:func:`llm_marl_envs.metrics.transition_summary`).

Every interval is ``{"mean", "low", "high"}`` (95%, :data:`BOOTSTRAP_RESAMPLES` resamples, seed 0); a paired
difference adds the better/tie/worse task counts.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
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


# ---------------------------------------------------------------------------------- per-task scores
def interval(values: Sequence[float] | np.ndarray, statistic: Any = None) -> dict[str, float | None]:
    """``{"mean", "low", "high"}``: the estimate and its 95% percentile-bootstrap interval over tasks."""
    entry = metrics.with_ci(values, statistic, num_resamples=BOOTSTRAP_RESAMPLES)
    return {"mean": entry["mean"], "low": entry["ci95"][0], "high": entry["ci95"][1]}


def paired_interval(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """``a − b`` paired by task: the mean difference, its 95% bootstrap interval and the better/tie/worse counts."""
    diff = metrics.paired_difference(np.asarray(a, float), np.asarray(b, float), num_resamples=BOOTSTRAP_RESAMPLES)
    return {"mean": diff["mean"], "low": diff["ci95"][0], "high": diff["ci95"][1], "better": diff["wins"],
            "tie": diff["ties"], "worse": diff["losses"]}


def transition_summary(counts: np.ndarray) -> dict[str, Any]:
    """Summed transition counts and the fix and break rates with :func:`interval` over tasks (rows of ``counts``)."""
    return metrics.transition_summary(counts, interval=interval)


ARRAY_FIELDS = ("final", "team", "per_turn", "transitions", "agent_turns", "sources")


@dataclass
class HeldOutScores:
    """Per-task scores of one evaluation setting (rows: tasks, in task order).

    ``final``: final-turn accuracy (mean over agents, and over samples when sampled); ``team``: majority
    vote of the final answers; ``per_turn``: ``[tasks, turns]``; ``transitions``: ``[tasks, 4]`` counts
    C→C, C→I, I→C, I→I (:data:`~llm_marl_envs.metrics.TRANSITIONS`) summed over agents, turn pairs and
    samples; ``agent_turns``: ``[tasks, agents, turns]`` accuracy of each seat (mean over samples);
    ``sources``: ``[tasks, agents, 3]`` counts of where each seat's last answer came from
    (:data:`~llm_marl_envs.metrics.ANSWER_SOURCES`), summed over samples; ``episodes``: the episode records.
    """

    tasks: list[int]
    samples: int
    temperature: float
    final: np.ndarray
    team: np.ndarray
    per_turn: np.ndarray
    transitions: np.ndarray
    episodes: list[dict[str, Any]] = field(default_factory=list, repr=False)
    agent_turns: np.ndarray | None = None
    sources: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        """The summary of this setting, JSON-ready: means with 95% CIs over tasks (no per-task numbers)."""
        turns = self.per_turn.shape[1]
        out = {"tasks": len(self.tasks), "samples_per_task": self.samples, "temperature": self.temperature,
               "turn0_accuracy": interval(self.per_turn[:, 0]), "final_turn_accuracy": interval(self.final),
               "team_answer_accuracy": interval(self.team),
               "per_turn": [interval(self.per_turn[:, t]) for t in range(turns)]}
        if turns > 1:
            out["collaboration_gain"] = paired_interval(self.final, self.per_turn[:, 0])
            out["transitions"] = transition_summary(self.transitions)
        return out

    def to_arrays(self) -> dict[str, Any]:
        """The per-task numbers, JSON-ready (no episode records); :meth:`from_arrays` reads them back."""
        arrays = {name: getattr(self, name) for name in ARRAY_FIELDS}
        return {"tasks": list(self.tasks), "samples": self.samples, "temperature": self.temperature,
                **{name: value.tolist() for name, value in arrays.items() if value is not None}}

    @classmethod
    def from_arrays(cls, arrays: dict[str, Any]) -> HeldOutScores:
        """The scores :meth:`to_arrays` wrote (``agent_turns`` and ``sources`` stay ``None`` where absent)."""
        values = {name: np.asarray(arrays[name], dtype=float) if name in arrays else None for name in ARRAY_FIELDS}
        return cls(list(arrays["tasks"]), int(arrays["samples"]), float(arrays["temperature"]), **values)


def scores_from(result: EvalResult, tasks: Sequence[int], samples: int, temperature: float) -> HeldOutScores:
    """Reduce an evaluation whose episodes are ``samples`` consecutive plays of each task to per-task scores."""
    num_turns = result.num_turns
    finals, teams, turns, transitions, agent_turns, sources = [], [], [], [], [], []
    for record in result.episodes:
        correct = metrics.pad_turns(record["correct"], num_turns)
        answers = metrics.pad_turns(record["answers"], num_turns)
        by_seat = np.array([[bool(c) for c in turn] for turn in correct], dtype=float).T   # [agents, turns]
        agent_turns.append(by_seat)
        sources.append(metrics.answer_sources(answers))
        per_turn = by_seat.mean(axis=0)
        turns.append(per_turn)
        finals.append(per_turn[-1])
        teams.append(float(bool(metrics.majority_correct(answers[-1], correct[-1]))))
        transitions.append(metrics.transition_counts(correct).ravel())

    def per_task(values: list) -> np.ndarray:
        array = np.asarray(values, dtype=float)
        return array.reshape(len(tasks), samples, *array.shape[1:])

    return HeldOutScores(list(tasks), samples, temperature, per_task(finals).mean(1), per_task(teams).mean(1),
                         per_task(turns).mean(1), per_task(transitions).sum(1), result.episodes,
                         per_task(agent_turns).mean(1), per_task(sources).sum(1))


def held_out_scores(trainer: Any, tasks: Sequence[int], *, samples: int = 1, temperature: float = 0.0,
                    seed: int = 0, report_path: str | os.PathLike | None = None,
                    desc: str = "evaluate", parallel: int | None = EVAL_PARALLEL) -> HeldOutScores:
    """Play each held-out task ``samples`` times at ``temperature`` with the trainer's team; per-task scores.

    Greedy (``temperature=0``) needs ``samples=1``. Sampled plays of a task get distinct seeds, so they
    are independent draws; the same ``seed`` (and ``parallel``: the episodes advanced together) replays
    the same episodes.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if temperature == 0 and samples != 1:
        raise ValueError(f"greedy decoding (temperature=0) gives one answer per task; got samples={samples}")
    cfg = trainer.config
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=temperature, top_p=cfg.top_p, seed=seed)
    played = [task for task in tasks for _ in range(samples)]
    seeds = [seed + 1_000 * i + s for i in range(len(tasks)) for s in range(samples)]
    result = evaluate_episodes(trainer.eval_engine, trainer.distributed, trainer.accelerator, played, seeds, params,
                               desc=desc, report_path=report_path, parallel=parallel)
    return scores_from(result, tasks, samples, temperature)


def compare(before: HeldOutScores, after: HeldOutScores) -> dict[str, Any]:
    """Before, after and the paired after − before difference (bootstrap over tasks) of one setting."""
    if before.tasks != after.tasks:
        raise ValueError("before and after must be evaluated on the same tasks in the same order to be paired")

    rows = np.concatenate([before.transitions, after.transitions], axis=1)
    fix_change = interval(rows, lambda r: metrics.fix_rate(r[:, 4:]) - metrics.fix_rate(r[:, :4]))
    debate = {}
    if before.per_turn.shape[1] > 1:
        # the same episodes' final turn against their own first answers, and what each seat's last answer was
        debate = {"collaboration_gain": {when: paired_interval(s.final, s.per_turn[:, 0])
                                         for when, s in (("before", before), ("after", after))},
                  "seats": {when: seat_summary(s) for when, s in (("before", before), ("after", after))}}
    return {
        "final_turn_accuracy": {"before": interval(before.final), "after": interval(after.final),
                                "paired_difference": paired_interval(after.final, before.final)},
        "team_answer_accuracy": {"before": interval(before.team), "after": interval(after.team),
                                 "paired_difference": paired_interval(after.team, before.team)},
        "per_turn": [{"turn": t, "before": interval(before.per_turn[:, t]), "after": interval(after.per_turn[:, t]),
                      "paired_difference": paired_interval(after.per_turn[:, t], before.per_turn[:, t])}
                     for t in range(before.per_turn.shape[1])],
        "transitions": {"before": transition_summary(before.transitions),
                        "after": transition_summary(after.transitions), "fix_rate_change": fix_change},
        **debate,
    }


def seat_summary(scores: HeldOutScores) -> list[dict[str, Any]]:
    """Per seat: its first-turn and last-turn accuracy and where its last answers came from (counts)."""
    if scores.agent_turns is None or scores.sources is None:
        raise ValueError("these scores hold no per-seat numbers (agent_turns, sources); make them with scores_from")
    totals = scores.sources.sum(axis=0)
    return [{"agent": seat, "turn0_accuracy": interval(scores.agent_turns[:, seat, 0]),
             "final_turn_accuracy": interval(scores.agent_turns[:, seat, -1]),
             "final_answer_from": {name: int(n) for name, n in zip(metrics.ANSWER_SOURCES, totals[seat])}}
            for seat in range(scores.agent_turns.shape[1])]


def format_comparison(name: str, comparison: dict[str, Any]) -> str:
    """One terminal line per setting: final-turn accuracy before, after and the paired difference."""
    acc = comparison["final_turn_accuracy"]

    def ci(entry: dict[str, Any]) -> str:
        return f"{entry['mean']:.3f} [{entry['low']:.3f}, {entry['high']:.3f}]"

    change = comparison["transitions"]["fix_rate_change"]
    fix = "n/a" if change["mean"] is None else ci(change)
    gain = comparison.get("collaboration_gain")
    own = f"  final - turn 0 after {ci(gain['after'])}" if gain else ""
    return (f"{name:>8}: before {ci(acc['before'])}  after {ci(acc['after'])}  "
            f"after - before {ci(acc['paired_difference'])}  fix rate change {fix}{own}")


__all__ = [
    "EvalResult",
    "evaluate_episodes",
    "EVAL_PARALLEL",
    "eval_report_path",
    "held_out_tasks",
    "BOOTSTRAP_RESAMPLES",
    "HeldOutScores",
    "compare",
    "format_comparison",
    "held_out_scores",
    "interval",
    "paired_interval",
    "scores_from",
    "seat_summary",
    "transition_summary",
]
