"""Before/after comparison of a team on held-out tasks: what a training example reports.

A training run counts only on tasks it never trained on, judged by the env's verifier.
:func:`train_and_compare` plays the trainer's held-out tasks through the trainer's own evaluation path
(:func:`~trainers.common.evaluation.held_out_scores`) before and after training, in each setting:

- **greedy**: one episode per task at temperature 0;
- **sampled**: ``samples`` episodes per task at the training temperature (fresh seeds), averaged per task;

and compares them paired by task (:func:`~trainers.common.evaluation.compare`: final-turn and team-answer
accuracy, per turn, the transitions with the fix rate's change, the collaboration gain and each seat's last
answers). :func:`run_in_dir` runs an example in its output directory without ever losing a run (the same
command resumes it or reports it finished, another config is refused, ``--overwrite`` starts over), and
:func:`repeat_over_seeds` runs it once per seed and reports the spread of its gains.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llm_marl.files import write_text_atomically

from .arguments import config_parser
from .checkpoint import resolve_checkpoint
from .evaluation import HeldOutScores, compare, format_comparison, held_out_scores
from .logging import read_metrics
from .run_dir import (
    RUN_OUTPUTS,
    RunDirError,
    differences,
    holds_run,
    interrupted_message,
    prepare_run_dir,
    read_record,
)

RESULTS_FILE = "results.json"
BEFORE_FILE = "before_scores.json"
# what an example's run writes under its output dir: --overwrite deletes these and nothing else
EXAMPLE_OUTPUTS = (*RUN_OUTPUTS, RESULTS_FILE, BEFORE_FILE, "learning_curve.png",
                   *(f"eval-{setting}-{when}" for setting in ("greedy", "sampled") for when in ("before", "after")))


def plot_learning_curve(history: Sequence[dict[str, Any]], evaluations: dict[str, dict[str, Any]],
                        path: str | os.PathLike, *, reward_key: str, title: str) -> Path:
    """Training reward per step (and its moving average) beside held-out final-turn accuracy before/after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history if reward_key in h]
    rewards = [h[reward_key] for h in history if reward_key in h]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    left.plot(steps, rewards, color="0.7", lw=1, label=f"{reward_key} (per step)")
    if len(rewards) >= 5:
        window = max(5, len(rewards) // 10)
        smooth = np.convolve(rewards, np.ones(window) / window, mode="valid")
        left.plot(steps[window - 1:], smooth, color="C0", lw=2, label=f"moving average ({window} steps)")
    left.set_xlabel("training step")
    left.set_ylabel("training reward (train split, sampled)")
    left.legend(loc="best", fontsize=8)
    left.set_title("training reward (not a result)")
    names = list(evaluations)
    for offset, (key, color) in enumerate((("before", "0.5"), ("after", "C2"))):
        means = [evaluations[n]["final_turn_accuracy"][key]["mean"] for n in names]
        lows = [m - evaluations[n]["final_turn_accuracy"][key]["low"] for n, m in zip(names, means)]
        highs = [evaluations[n]["final_turn_accuracy"][key]["high"] - m for n, m in zip(names, means)]
        x = np.arange(len(names)) + (offset - 0.5) * 0.35
        right.bar(x, means, 0.35, yerr=[lows, highs], color=color, capsize=4, label=key)
    right.set_xticks(np.arange(len(names)), names)
    right.set_ylabel("final-turn accuracy (held-out test tasks)")
    right.set_ylim(0, 1)
    right.legend(loc="upper right", fontsize=8)
    right.set_title("held out, 95% bootstrap CI")
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def history_before(checkpoint: Path) -> list[dict[str, Any]]:
    """The logged steps up to a checkpoint, from its run's ``metrics.jsonl`` (``[]`` if that log is gone)."""
    step = int(checkpoint.name.rsplit("-", 1)[-1])
    try:
        records = read_metrics(checkpoint.parent.parent)
    except FileNotFoundError:
        return []
    return [r for r in records if r.get("step", 0) <= step]


def merged_history(earlier: Sequence[dict[str, Any]], latest: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per step, in step order; ``latest`` wins (MAPPO's ``train()`` returns the history it restored)."""
    by_step = {record["step"]: record for record in [*earlier, *latest]}
    return [by_step[step] for step in sorted(by_step)]


def stored_before(out: str | os.PathLike, identity: dict[str, Any]) -> dict[str, HeldOutScores] | None:
    """The "before" scores :func:`train_and_compare` stored in ``out`` for the same tasks, seed and settings
    (``identity``), else ``None``."""
    path = Path(out) / BEFORE_FILE
    if not path.is_file():
        return None
    stored = json.loads(path.read_text(encoding="utf-8"))
    if {key: stored.get(key) for key in identity} != json.loads(json.dumps(identity)):
        return None
    return {name: HeldOutScores.from_arrays(arrays) for name, arrays in stored["scores"].items()}


def train_and_compare(trainer: Any, out: str | os.PathLike, *, eval_tasks: int, samples: int, temperature: float,
                      env_id: str, reward_key: str = "joint_reward_mean", extra: dict[str, Any] | None = None,
                      resume: str | os.PathLike | None = None, greedy: bool = True) -> dict[str, Any]:
    """Evaluate the trainer's team on ``eval_tasks`` held-out tasks, train it, evaluate again; write the results.

    Both settings (greedy, and ``samples`` draws per task at ``temperature``; ``samples=0``: greedy only;
    ``greedy=False``: the sampled one only) are played before and after on the same tasks with the same seeds.
    ``resume``: a checkpoint to load after the "before" evaluation (training continues from it up to
    ``max_steps``; one at ``max_steps`` is only evaluated). The "before" evaluation needs the untrained team:
    a trainer built with ``resume_from_checkpoint`` (an interrupted run continued) is accepted only where
    ``out`` holds its run's stored one (``before_scores.json``, same tasks, settings and seed), which it reuses.
    Writes ``out/before_scores.json`` (the per-task "before" scores), ``out/results.json`` (the dict returned),
    ``out/learning_curve.png`` and one ``report.html`` per evaluation under ``out/eval-<setting>-<before|after>/``.
    """
    import time

    out = Path(out)
    started = time.perf_counter()
    tasks = trainer.eval_tasks[:eval_tasks]
    if len(tasks) < eval_tasks:
        raise ValueError(f"asked for {eval_tasks} held-out tasks but the eval env has {len(tasks)}; "
                         f"lower eval_tasks or make the test split larger (num_tasks)")
    built_resumed = bool(getattr(trainer, "step", 0)) or trainer.config.resume_from_checkpoint is not None
    if built_resumed and resume is not None:
        raise ValueError("resume= loads a checkpoint into an untrained team; this trainer was built resumed")
    if samples < 0:
        raise ValueError(f"samples must be >= 0 (0: greedy only), got {samples}")
    settings = {"greedy": (1, 0.0), **({"sampled": (samples, temperature)} if samples else {})}
    if not greedy:
        if not samples:
            raise ValueError("greedy=False needs samples >= 1: nothing would be evaluated")
        del settings["greedy"]
    headline = "sampled" if samples else "greedy"

    def evaluate_all(when: str) -> dict[str, HeldOutScores]:
        return {name: held_out_scores(trainer, tasks, samples=k, temperature=t, seed=trainer.config.seed,
                                      report_path=out / f"eval-{name}-{when}" / "report.html",
                                      desc=f"{when} ({name})")
                for name, (k, t) in settings.items()}

    identity = {"tasks": list(tasks), "seed": trainer.config.seed,
                "settings": {name: [k, t] for name, (k, t) in settings.items()}}
    if built_resumed:
        before = stored_before(out, identity)
        if before is None:
            raise ValueError(f"train_and_compare evaluates the untrained team first and {out / BEFORE_FILE} holds no "
                             f"'before' evaluation of these tasks and settings: build the trainer without "
                             f"resume_from_checkpoint and pass the checkpoint as resume= instead")
        print(f"before: reused {out / BEFORE_FILE} (the untrained team's evaluation)", flush=True)
    else:
        before = evaluate_all("before")
        write_text_atomically(out / BEFORE_FILE, json.dumps(
            {**identity, "scores": {name: scores.to_arrays() for name, scores in before.items()}}))
    for name, scores in before.items():
        print(f"before ({name}): final-turn accuracy {scores.to_dict()['final_turn_accuracy']}", flush=True)
    eval_s = time.perf_counter() - started
    if resume is not None:
        resumed = resolve_checkpoint(resume, trainer.config.output_dir)
        trainer.load(resumed)
    restored = list(trainer.history)                                # the steps a resumed trainer's checkpoint holds
    history = merged_history(restored, trainer.train())
    if resume is not None:
        history = merged_history(history_before(resumed), history)
    train_s = time.perf_counter() - started - eval_s
    after = evaluate_all("after")
    evaluations = {name: compare(before[name], after[name]) for name in settings}
    checkpoint = trainer.latest_checkpoint()
    if checkpoint is None and resume is not None:                  # resumed at max_steps: no new one
        checkpoint = resumed
    results = {
        "env": env_id, "held_out_tasks": len(tasks), "split": "test",
        "accuracy": "final_turn_accuracy: fraction of agents right at the last turn (mean over agents; sampled: "
                    "also over samples), per task; team_answer_accuracy: majority vote of the final answers. "
                    "Intervals: 95% percentile bootstrap over tasks; differences paired by task.",
        # the headline fields: the sampled setting at the training temperature (greedy if samples=0)
        "final_turn_accuracy": evaluations[headline]["final_turn_accuracy"],
        "per_turn": evaluations[headline]["per_turn"],
        "transitions": evaluations[headline]["transitions"],
        **evaluations,
        "settings": {name: {"samples_per_task": k, "temperature": t} for name, (k, t) in settings.items()},
        "checkpoint": str(checkpoint) if checkpoint else None,
        "config": trainer.config.to_dict(), "train_history": history,
        "wall_time_s": {"evaluation_before": eval_s, "training": train_s,
                        "total": time.perf_counter() - started},
        **(extra or {}),
    }
    write_text_atomically(out / RESULTS_FILE, json.dumps(results, indent=2, default=str))
    plot_learning_curve(history, evaluations, out / "learning_curve.png", reward_key=reward_key,
                        title=f"{type(trainer).__name__} on {env_id}")
    for name in settings:
        print(format_comparison(name, evaluations[name]), flush=True)
    print(f"wall time {results['wall_time_s']['total'] / 60:.1f} min; wrote {out / RESULTS_FILE} and "
          f"{out / 'learning_curve.png'}", flush=True)
    return results


def seed_spread(seeds: Sequence[int], values: Sequence[dict[str, float]]) -> dict[str, Any]:
    """One number's per-seed ``{mean, low, high}`` and the spread of the means over seeds (sample std)."""
    means = np.array([v["mean"] for v in values], float)
    per_seed = {str(s): {"mean": v["mean"], "low": v["low"], "high": v["high"]} for s, v in zip(seeds, values)}
    return {"per_seed": per_seed, "mean": float(means.mean()), "std": float(means.std(ddof=1)) if len(means) > 1
            else 0.0, "min": float(means.min()), "max": float(means.max())}


def run_arguments(config: Any, args: argparse.Namespace) -> dict[str, Any]:
    """What decides a run's results, as JSON: the config's fields but ``output_dir`` (``resume_from_checkpoint``,
    where an interrupted run continued from, is ``None``), and the script's own flags but ``threads``, ``seeds``
    and ``overwrite``."""
    fields = {k: v for k, v in config.to_dict().items() if k != "output_dir"}
    fields["resume_from_checkpoint"] = None
    own = {k: v for k, v in vars(args).items() if k not in ("threads", "seeds", "overwrite")}
    return json.loads(json.dumps({**own, **fields}, sort_keys=True, default=str))


class RunInterrupted(KeyboardInterrupt):
    """An example's run interrupted; its message says what the output dir keeps and the command that resumes it."""


def example_command(script: str | os.PathLike, argv: Sequence[str]) -> str:
    """The command that runs ``script`` with ``argv`` again (without ``--overwrite``; with this process's
    ``PYTHONPATH`` when one is set): the one that resumes it."""
    path = Path(script).resolve()
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    prefix = [f"PYTHONPATH={os.environ['PYTHONPATH']}"] if os.environ.get("PYTHONPATH") else []
    return shlex.join([*prefix, "python", str(shown), *(a for a in argv if a != "--overwrite")])


def example_record(command: str, script: str | os.PathLike, config: Any, args: argparse.Namespace) -> dict[str, Any]:
    """What an example records in its output dir's ``run.json``: the command that resumes it, the example, the
    config and the example's own flags (those that name no checkpoint and no clearing)."""
    flags = {k: v for k, v in vars(args).items() if k not in ("seeds", "overwrite", "resume")}
    return {"command": command, "example": Path(script).name, "config": config.to_dict(), "flags": flags}


@contextlib.contextmanager
def clean_exits(script: str | os.PathLike | None = None) -> Iterator[None]:
    """An example's main without a traceback for what the user decides: an output dir holding another run
    (:class:`~trainers.common.run_dir.RunDirError`) exits with status 2 and its message, an interrupt
    (:class:`RunInterrupted`) with status 130 and the command that resumes."""
    name = Path(sys.argv[0] if script is None else script).name
    try:
        yield
    except RunDirError as refused:
        print(f"{name}: {refused}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    except RunInterrupted as interrupted:
        print(f"{name}: {interrupted}", file=sys.stderr, flush=True)
        raise SystemExit(130) from None


def finished_results(out: str | os.PathLike, arguments: dict[str, Any]) -> dict[str, Any] | None:
    """The ``results.json`` in ``out`` when it was written with ``arguments`` (a finished run), else ``None``."""
    path = Path(out) / RESULTS_FILE
    previous = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    return previous if previous is not None and previous.get("arguments") == arguments else None


def run_in_dir(run_one: Callable[[Any, argparse.Namespace], dict[str, Any]], config: Any, args: argparse.Namespace,
               *, script: str | os.PathLike | None = None, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """One run of a training example in ``config.output_dir``, which never loses work
    (:func:`trainers.common.run_dir.prepare_run_dir`):

    - a finished run of the same arguments (its ``results.json``) is reported and returned, not trained again;
    - an interrupted run of the same example and config resumes from its newest checkpoint (the untrained team's
      evaluation is reused);
    - a run of another config raises :class:`~trainers.common.run_dir.RunDirError` naming the differing fields and
      the commands to choose from; ``args.overwrite`` deletes the run's outputs and starts over; ``args.resume``
      (an explicit checkpoint) is run as given.

    ``script`` and ``argv``: the example's file and arguments (default: ``sys.argv``), for the command that resumes.
    An interrupt raises :class:`RunInterrupted` with that command.
    """
    script = sys.argv[0] if script is None else script
    argv = sys.argv[1:] if argv is None else list(argv)
    out, command = Path(config.output_dir), example_command(script, argv)
    overwrite = bool(getattr(args, "overwrite", False))
    explicit = getattr(args, "resume", None) is not None or config.resume_from_checkpoint is not None
    if not overwrite and (done := finished_results(out, run_arguments(config, args))) is not None:
        print(f"{out} holds this run, finished: reused {out / RESULTS_FILE} (--overwrite trains it again)", flush=True)
        return done
    plan = prepare_run_dir(out, example_record(command, script, config, args), overwrite=overwrite,
                           resume_given=explicit, outputs=EXAMPLE_OUTPUTS)
    if plan.message:
        print(plan.message, file=sys.stderr, flush=True)
    if plan.resume is not None:
        config = dataclasses.replace(config, resume_from_checkpoint=str(plan.resume))
    try:
        return run_one(config, args)
    except KeyboardInterrupt as interrupt:
        raise RunInterrupted(interrupted_message(out, command)) from interrupt


def repeat_over_seeds(run_one: Callable[[Any, argparse.Namespace], dict[str, Any]], config: Any,
                      args: argparse.Namespace, seeds: Sequence[int], *, title: str,
                      script: str | os.PathLike | None = None, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run a training example once per seed in ``config.output_dir/seed-<s>``, then write the spread of its gains.

    ``run_one(config, args)`` is the example's single run (it must return :func:`train_and_compare`'s results
    and record ``run_arguments(config, args)`` under ``"arguments"``); each seed runs with a copy of ``config``
    whose ``seed`` and ``output_dir`` are its own, through :func:`run_in_dir` (``script``, ``argv``: the command):
    a seed whose ``results.json`` was written with the same arguments is reused and an interrupted seed resumes
    from its newest checkpoint, so an interrupted repeat resumes. Writes ``seeds.json`` in ``config.output_dir``: per
    setting, each seed's held-out gain (after − before final-turn accuracy, paired 95% CI) and the mean, sample
    std, min and max over seeds; and ``seeds.png`` with one point and interval per seed.
    """
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    if len(seeds) < 2:
        raise ValueError(f"a seed repeat needs at least two distinct seeds, got {seeds}")
    if getattr(args, "resume", None):
        raise ValueError("--resume names one run's checkpoint; it cannot be combined with --seeds")
    out = Path(config.output_dir)
    per_seed: dict[int, dict[str, Any]] = {}
    for seed in seeds:
        seed_config = dataclasses.replace(config, seed=seed, output_dir=str(out / f"seed-{seed}"))
        print(f"seed {seed}: {seed_config.output_dir}", flush=True)
        per_seed[seed] = run_in_dir(run_one, seed_config, args, script=script, argv=argv)
    settings = [name for name in ("greedy", "sampled") if all(name in r for r in per_seed.values())]
    spread = {name: {"gain": seed_spread(seeds, [per_seed[s][name]["final_turn_accuracy"]["paired_difference"]
                                                 for s in seeds]),
                     "after": seed_spread(seeds, [per_seed[s][name]["final_turn_accuracy"]["after"]
                                                  for s in seeds])}
              for name in settings}
    summary = {"title": title, "seeds": seeds, "arguments": run_arguments(config, args),
               "gain": "after − before final-turn accuracy on the same held-out tasks, paired by task (95% "
                       "bootstrap CI); mean, std (sample), min and max over seeds",
               "settings": spread,
               "wall_time_s": {str(s): per_seed[s]["wall_time_s"]["total"] for s in seeds}}
    write_text_atomically(out / "seeds.json", json.dumps(summary, indent=2, default=str))
    seed_gains_figure(spread, seeds, out / "seeds.png", title=title)
    for name in settings:
        gain = spread[name]["gain"]
        cells = ", ".join(f"seed {s} {v['mean']:+.3f} [{v['low']:+.3f}, {v['high']:+.3f}]"
                          for s, v in gain["per_seed"].items())
        print(f"{name}: gain {cells}; mean {gain['mean']:+.3f} ± {gain['std']:.3f}", flush=True)
    print(f"wrote {out / 'seeds.json'} and {out / 'seeds.png'}", flush=True)
    return summary


def plot_seed_points(ax: Any, x: float, per_seed: dict[str, dict[str, float]], seeds: Sequence[int], *,
                     width: float, label: bool) -> None:
    """One point with its 95% CI per seed around ``x`` (``width`` apart, one colour per seed; ``label``: name them);
    the axis then spans at least ``x ± 0.5``."""
    for j, seed in enumerate(seeds):
        v = per_seed[str(seed)]
        ax.errorbar(x + (j - (len(seeds) - 1) / 2) * width, v["mean"],
                    yerr=[[v["mean"] - v["low"]], [v["high"] - v["mean"]]], fmt="o", color=f"C{j}", capsize=3,
                    label=f"seed {seed}" if label else None)
    # the group's slot is x ± 0.5 even when it is the only one (autoscale would spread its seeds over the axis)
    left, right = ax.get_xlim()
    ax.set_xlim(min(left, x - 0.5), max(right, x + 0.5))


def parse_seeds(text: str) -> list[int]:
    """The seeds of a ``--seeds 0,1,2`` option."""
    return [int(s) for s in text.split(",") if s.strip()]


def run_once_or_over_seeds(run_one: Callable[[Any, argparse.Namespace], dict[str, Any]], config: Any,
                           args: argparse.Namespace, *, title: str, script: str | os.PathLike | None = None,
                           argv: Sequence[str] | None = None) -> dict[str, Any]:
    """An example's ``main``: ``run_one(config, args)`` through :func:`run_in_dir`, or :func:`repeat_over_seeds`
    when ``args.seeds`` names seeds. ``script`` and ``argv``: the example's file and arguments (default:
    ``sys.argv``). A run directory that holds another run exits with status 2 and its message, an interrupt with
    status 130 and the command that resumes; neither prints a traceback."""
    with clean_exits(script):
        if args.seeds:
            return repeat_over_seeds(run_one, config, args, parse_seeds(args.seeds), title=title, script=script,
                                     argv=argv)
        return run_in_dir(run_one, config, args, script=script, argv=argv)


def run_from_start(train: Callable[[], dict[str, Any]], out: str | os.PathLike, config: Any,
                   args: argparse.Namespace, *, outputs: Sequence[str], script: str | os.PathLike | None = None,
                   argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The main of an example that trains in one go and cannot resume: ``train()`` (which writes ``results.json``
    with ``"arguments": run_arguments(config, args)``) in ``out``, which never loses a run.

    A finished run of the same arguments is reported and returned, not trained again. ``out`` holding a run of
    another config, or this run interrupted, is refused (exit status 2) naming the differing fields and the
    commands to choose from; ``args.overwrite`` deletes ``outputs`` (names under ``out``) and starts over. An
    interrupt exits with status 130 and the command that starts the run over. ``script``, ``argv``: the command
    (default: ``sys.argv``).
    """
    script = sys.argv[0] if script is None else script
    argv = sys.argv[1:] if argv is None else list(argv)
    out, command = Path(out), example_command(script, argv)
    overwrite = bool(getattr(args, "overwrite", False))
    with clean_exits(script):
        if not overwrite and (done := finished_results(out, run_arguments(config, args))) is not None:
            print(f"{out} holds this run, finished: reused {out / RESULTS_FILE} (--overwrite trains it again)",
                  flush=True)
            return done
        record = example_record(command, script, config, args)
        if not overwrite and holds_run(out) and not differences(read_record(out) or {}, record):
            raise RunDirError(f"{out} holds this run and {Path(script).name} does not resume a run\n"
                              f"  start over here:        {command} --overwrite   (deletes the run in {out})\n"
                              f"  or start elsewhere:     this command with another --out")
        plan = prepare_run_dir(out, record, overwrite=overwrite, outputs=outputs)
        if plan.message:
            print(plan.message, file=sys.stderr, flush=True)
        try:
            return train()
        except KeyboardInterrupt as interrupt:
            raise RunInterrupted(f"interrupted; {Path(script).name} does not resume a run; this command starts it "
                                 f"over:\n  {command} --overwrite") from interrupt


def seed_gains_figure(spread: dict[str, Any], seeds: Sequence[int], path: str | os.PathLike, *,
                      title: str) -> Path:
    """Per setting and seed: the held-out gain with its 95% CI, and the mean over seeds as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(spread)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.8 + 2.2 * len(settings)), 3.8))   # wide enough for the title
    for i, name in enumerate(settings):
        gain = spread[name]["gain"]
        plot_seed_points(ax, i, gain["per_seed"], seeds, width=0.18, label=i == 0)
        ax.hlines(gain["mean"], i - 0.35, i + 0.35, color="k", lw=1.5, label="mean over seeds" if i == 0 else None)
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xticks(range(len(settings)), settings)
    ax.set_xlim(-0.6, len(settings) - 0.4)
    ax.set_ylabel("after − before final-turn accuracy (95% CI)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def debate_experiment_parser(description: str, config_cls: type, recipe: str | os.PathLike) -> argparse.ArgumentParser:
    """The parser of a debate training example: ``--config`` (default: its ``recipe``), one flag per field of
    ``config_cls`` (``--steps`` and ``--out`` name ``max_steps`` and ``output_dir``) and the flags every such
    example has (env, turns, evaluation, seeds, model, resume). Read it with
    :func:`trainers.common.arguments.parse_config`."""
    parser = config_parser(config_cls, description, recipe=recipe,
                           flags={"max_steps": ["--max-steps", "--steps"], "output_dir": ["--output-dir", "--out"]})
    parser.add_argument("--env", default="arithmetic_debate-v0", help="debate env id (default: %(default)s)")
    parser.add_argument("--num-turns", type=int, default=2, help="debate turns (default: %(default)s)")
    parser.add_argument("--samples", type=int, default=4, help="sampled plays per held-out task at the training "
                        "temperature (0: greedy evaluation only; default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--seeds", default=None,
                        help="comma-separated seeds: the run once per seed in OUT/seed-<s>, then the spread of the "
                             "held-out gain over seeds in OUT/seeds.json and OUT/seeds.png (overrides --seed)")
    parser.add_argument("--model", default="smollm2-135m",
                        help="base model: the embedded name or a local HF model directory (default: %(default)s)")
    parser.add_argument("--no-greedy", dest="greedy", action="store_false",
                        help="skip the greedy evaluation (play only the --samples sampled ones)")
    parser.add_argument("--resume", default=None, metavar="CHECKPOINT",
                        help="resume training from a checkpoints/step-* dir this example wrote; one already at "
                        "--steps is only evaluated (before: the untrained team, after: the checkpoint). Without it, "
                        "the same command on an --out holding its interrupted run resumes from its newest checkpoint")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete the run already in --out (checkpoints, metrics, logs, evaluations, results) and "
                             "start over; without it, --out holding a run of another config is refused")
    return parser


def debate_team_and_envs(config: Any, args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """``(team, train env, test env)`` of a debate example: one LoRA adapter per agent on ``args.model``, its
    initialisation seeded by ``config.seed``."""
    import torch

    import llm_marl_envs
    from llm_marl.models import load
    from llm_marl.team import Team

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(config.seed)
    model, tokenizer = load(args.model)
    team = Team.adapter_per_agent(model, tokenizer, agents=2, name=args.model)
    env = llm_marl_envs.make(args.env, num_agents=2, num_turns=args.num_turns, split="train")
    eval_env = llm_marl_envs.make(args.env, num_agents=2, num_turns=args.num_turns, split="test")
    return team, env, eval_env


__all__ = [
    "BEFORE_FILE",
    "EXAMPLE_OUTPUTS",
    "RESULTS_FILE",
    "RunInterrupted",
    "clean_exits",
    "example_command",
    "example_record",
    "finished_results",
    "run_from_start",
    "run_in_dir",
    "stored_before",
    "merged_history",
    "history_before",
    "debate_experiment_parser",
    "debate_team_and_envs",
    "parse_seeds",
    "plot_seed_points",
    "repeat_over_seeds",
    "run_once_or_over_seeds",
    "run_arguments",
    "seed_gains_figure",
    "seed_spread",
    "train_and_compare",
    "plot_learning_curve",
]
