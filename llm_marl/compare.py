"""Several baselines on the same tasks, side by side: one bench run per baseline, one comparison report.

:func:`compare_baselines` runs :func:`llm_marl.benchmark.run_benchmark` once per baseline (the
same env, tasks, seed, sampling and loaded models; only ``baseline`` differs), then
:func:`write_comparison` puts the runs side by side. Run directory::

    compare.json        the baselines compared (each sub-run checks its own settings on resume)
    single/ majority/ debate/ checkpoint/    one ordinary bench run directory per baseline
    comparison.json     per baseline: headline metrics with bootstrap 95% CIs (the fix and break rates of
                        :func:`llm_marl_envs.metrics.transition_summary` among them);
                        per pair: the paired difference of team-answer accuracy on the same tasks
    comparison.md       the same as tables, with comparison.png
    report.html         every baseline's tables, plots and episodes on one page (:mod:`llm_marl.report`)

The *team answer* of an episode is the majority vote over the final answers: the one answer of
``single``, the vote over ``N·T`` independent samples of ``majority`` (the debate's token
budget) and the vote over the ``N`` agents' last-turn answers of ``debate`` and ``checkpoint`` (a
trained team; the other baselines then run its untrained base model). Because episode
``i`` of every baseline plays the same task, differences are paired: the bootstrap resamples
tasks and takes both baselines' outcomes on each, which is tighter than comparing two
independent intervals.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llm_marl_envs import metrics

from . import report
from .benchmark import BASELINES, BenchConfig, load_policies, make_env, run_benchmark, run_view, write_report
from .files import write_text_atomically
from .report import RunView, Table, counted, format_batch_share, format_ci

COMPARE_FILE, COMPARISON_FILE = "compare.json", "comparison.json"
COMPARISON_REPORT, COMPARISON_PLOT = "comparison.md", "comparison.png"


def parse_baselines(text: str | Sequence[str]) -> list[str]:
    """``"single,majority,debate"`` (or a list) -> validated, de-duplicated baseline names in order."""
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else [str(n).strip() for n in text]
    unknown = [n for n in names if n not in BASELINES]
    if not names or unknown:
        raise ValueError(f"unknown baseline(s) {unknown or names!r}; choose from {list(BASELINES)}, "
                         "comma-separated, e.g. single,majority,debate")
    return list(dict.fromkeys(names))


def is_comparison(out_dir: str | os.PathLike) -> bool:
    """Whether ``out_dir`` holds a comparison (rather than one bench run)."""
    return (Path(out_dir) / COMPARE_FILE).is_file()


def compare_baselines(config: BenchConfig, baselines: Sequence[str], out_dir: str | os.PathLike, *,
                      policies: dict[str, Any] | None = None, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) ``config`` once per baseline into ``out_dir/<baseline>`` and write the comparison.

    Models are loaded once and shared by every baseline. A ``checkpoint`` baseline's team is loaded
    first (a checkpoint that does not fit fails before any episode runs); the base under its LoRA
    adapters, with the adapters off, is the untrained model of the other baselines. Returns the
    comparison (see :func:`comparison`).
    """
    from .team_checkpoint import load_team, shared_bases

    baselines = parse_baselines(baselines)
    configs = [dataclasses.replace(config, baseline=b) for b in baselines]   # validates each (e.g. single + mixed team)
    out = Path(out_dir)
    write_text_atomically(out / COMPARE_FILE, json.dumps({"baselines": baselines, "env_id": config.env_id}, indent=2)
                          + "\n")
    loaded, trained = dict(policies or {}), None
    checkpoint = next((sub for sub in configs if sub.baseline == "checkpoint"), None)
    if checkpoint is not None:
        trained = load_team(checkpoint.checkpoint, make_env(checkpoint).possible_agents, checkpoint.models,
                            base_model=checkpoint.base_model)
        loaded = {**shared_bases(trained), **loaded}
    for sub in configs:
        loaded = load_policies(sub, loaded)
        run_benchmark(sub, out / sub.baseline, policies=loaded, trained=trained, progress=progress)
    return write_comparison(out)


def comparison(views: Sequence[RunView]) -> dict[str, Any]:
    """Headline metrics per baseline and paired differences of team-answer accuracy for every pair."""
    tasks = [[r["task_index"] for r in v.records] for v in views]
    n = min(len(t) for t in tasks)
    if any(t[:n] != tasks[0][:n] for t in tasks):
        raise ValueError("the runs did not play the same tasks in the same order (different seed or env "
                         "settings?); compare runs made with one `llm-marl bench --baseline a,b,...` command")
    seed = views[0].summary["seed"]
    team = {v.label: [team_score(r) for r in v.records[:n]] for v in views}
    rows = {}
    for view in views:
        s = view.summary
        rows[view.label] = {
            "num_episodes": s["num_episodes"],
            "env_shape": s["env_shape"],
            "first_answer_accuracy": s["accuracy_per_turn"][0],
            "final_turn_accuracy": s["accuracy_per_turn"][-1],
            "team_answer_accuracy": metrics.with_ci(team[view.label], seed=seed),
            "consensus_rate": s["consensus_rate"],
            "fix_rate": s.get("transitions", {}).get("fix_rate"),
            "break_rate": s.get("transitions", {}).get("break_rate"),
            "tokens_per_episode": s["tokens_per_episode"],
            "wall_time_per_episode_s": s["wall_time_per_episode_s"],
            "tokens_total": s["tokens_total"],
            "wall_time_total_s": s["wall_time_total_s"],
        }
    pairs = [{"a": b.label, "b": a.label, "num_tasks": n,
              **metrics.paired_difference(team[b.label], team[a.label], seed=seed)}
             for a, b in itertools.combinations(views, 2)]
    first = views[0].summary
    checkpoint = next((v.summary["checkpoint"] for v in views if v.summary.get("checkpoint")), None)
    return {"env_id": first["env_id"], "models": first["models"], "backend": first["backend"], "seed": seed,
            "debate_shape": first["debate_shape"], "metric": first["metric"], "num_paired_tasks": n,
            **({"checkpoint": checkpoint} if checkpoint else {}),
            "baselines": rows, "paired_team_answer_difference": pairs}


def team_score(record: dict[str, Any]) -> float:
    """1/0 for a right/wrong team answer (majority vote of the final answers); the mean final score if unjudged."""
    final_correct = record["correct"][-1]
    correct = metrics.majority_correct(record["answers"][-1], final_correct)
    if correct is None:
        return float(np.mean(record["scores"][-1]))
    return float(correct)


def write_comparison(out_dir: str | os.PathLike) -> dict[str, Any]:
    """(Re)build every baseline's report and the comparison files of a comparison directory."""
    out = Path(out_dir)
    if not is_comparison(out):
        raise ValueError(f"{out} holds no comparison ({COMPARE_FILE} missing); pass the --out of "
                         "`llm-marl bench --baseline a,b,...`")
    baselines = json.loads((out / COMPARE_FILE).read_text(encoding="utf-8"))["baselines"]
    views, runs = [], []
    for name in baselines:
        write_report(out / name)
        view, run = run_view(out / name, label=name)
        views.append(view)
        runs.append(run)
    result = comparison(views)
    write_text_atomically(out / COMPARISON_FILE, json.dumps(result, indent=2) + "\n")
    fig = comparison_figure(result, views)
    report.save_png(fig, out / COMPARISON_PLOT)
    write_text_atomically(out / COMPARISON_REPORT, render_comparison(result, runs[0]))
    title = f"{result['env_id']}: {' vs '.join(baselines)}"
    figures = [(f"Accuracy of each baseline on the same {result['num_paired_tasks']} tasks (bootstrap 95% CIs). "
                "Click a bar to show that baseline's episodes.", fig, [(f"{v.label} episodes", f"#run={v.slug}")
                                                                        for v in views])]
    figures += report.run_figures(views, title)
    report.write_html_report(out / report.REPORT_HTML, f"Comparison: {title}", views,
                             meta=comparison_meta(result, runs[0]), tables=comparison_tables(result),
                             figures=report.embed(figures))
    return result


def comparison_meta(result: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """The settings every baseline shares (``run``: one baseline's ``run.json``)."""
    n, t = result["debate_shape"]
    config = run["config"]
    shape = f"{counted(n, 'agent')} × {counted(t, 'turn')}"
    trained = [f"checkpoint: the trained team of {result['checkpoint']}, {shape}; the other "
               "baselines run its untrained base model"] if result.get("checkpoint") else []
    views = {"own_view": f"own_view: each of the {n} roles alone with its own view, 1 turn",
             "full_view": "full_view: 1 agent with every view, 1 turn"}
    ran = result["baselines"]
    shapes = {"debate": f"debate: {shape}", "team": f"team: {shape}",
              "majority": f"majority: vote over {counted(n * t, 'independent sample')} (the debate's token budget)",
              "single": "single: 1 agent, 1 turn"}
    return [f"models: {', '.join(dict.fromkeys(result['models']))} (backend {result['backend']})",
            "; ".join(line for name, line in shapes.items() if name in ran),
            *(line for name, line in views.items() if name in result["baselines"]),
            *trained,
            f"{result['num_paired_tasks']} paired tasks, seed {result['seed']}; sampling: max_new_tokens="
            f"{config['max_new_tokens']}, temperature={config['temperature']}, top_p={config['top_p']}; "
            "intervals are bootstrap 95% CIs over tasks"]


def comparison_tables(result: dict[str, Any]) -> list[Table]:
    """The side-by-side table and the paired-difference table."""
    header = ["baseline", "agents × turns", "first answer", "final turn", "team answer (vote)", "fix rate",
              "break rate", "tokens / episode", "wall s / episode (batch share)"]
    rows = []
    for name, row in result["baselines"].items():
        rows.append([name, "{} × {}".format(*row["env_shape"]), format_ci(row["first_answer_accuracy"]),
                     format_ci(row["final_turn_accuracy"]), format_ci(row["team_answer_accuracy"]),
                     format_ci(row["fix_rate"]), format_ci(row["break_rate"]),
                     format_ci(row["tokens_per_episode"], digits=0),
                     format_batch_share(row["wall_time_per_episode_s"], digits=2)])
    side = Table("Baselines on the same tasks (mean [95% CI])", header, rows,
                 note="first answer: per-sample accuracy at turn 0; final turn: mean over agents at the last turn; "
                      "team answer: majority vote of the final answers; fix rate: I→C ÷ (I→C + I→I), the share of an "
                      "agent's incorrect answers its next turn makes correct; break rate: C→I ÷ (C→C + C→I), the "
                      "share of its correct answers its next turn makes incorrect.")
    pairs = Table("Paired differences of team-answer accuracy (same tasks)",
                  ["comparison", "difference [95% CI]", "better / tie / worse (tasks)"],
                  [[f"{p['a']} − {p['b']}", format_ci(p, digits=3), f"{p['wins']} / {p['ties']} / {p['losses']}"]
                   for p in result["paired_team_answer_difference"]])
    return [side, pairs]


def render_comparison(result: dict[str, Any], run: dict[str, Any]) -> str:
    """The markdown comparison report."""
    lines = [f"# Comparison: {result['env_id']}", ""]
    lines += [f"- {line}" for line in comparison_meta(result, run)]
    for table in comparison_tables(result):
        lines += ["", f"## {table.caption}", "", "| " + " | ".join(table.header) + " |",
                  "|" + " --- |" * len(table.header), *("| " + " | ".join(row) + " |" for row in table.rows)]
        if table.note:
            lines += ["", table.note]
    lines += ["", f"![comparison]({COMPARISON_PLOT})", "",
              f"Every episode of every baseline, with filters: [{report.REPORT_HTML}]({report.REPORT_HTML})."]
    return "\n".join(lines) + "\n"


def comparison_figure(result: dict[str, Any], views: Sequence[RunView]) -> Any:
    """Grouped bars per baseline: first-answer, final-turn and team-answer accuracy with CIs; tokens noted above."""
    plt = report.pyplot()
    names = list(result["baselines"])
    kinds = [("first_answer_accuracy", "first answer"), ("final_turn_accuracy", "final turn"),
             ("team_answer_accuracy", "team answer (vote)")]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    width = 0.8 / len(kinds)
    slugs = {v.label: v.slug for v in views}
    for k, (key, label) in enumerate(kinds):
        entries = [result["baselines"][name][key] for name in names]
        means = np.array([e["mean"] if e["mean"] is not None else np.nan for e in entries])
        lows = np.array([e["ci95"][0] if e["ci95"][0] is not None else np.nan for e in entries])
        highs = np.array([e["ci95"][1] if e["ci95"][1] is not None else np.nan for e in entries])
        x = np.arange(len(names)) + (k - (len(kinds) - 1) / 2) * width
        bars = ax.bar(x, means, width, yerr=np.nan_to_num([means - lows, highs - means]), capsize=3, label=label)
        for bar, name in zip(bars, names):
            bar.set_url(f"#run={slugs[name]}")
    for i, name in enumerate(names):
        tokens = result["baselines"][name]["tokens_per_episode"]["mean"]
        ax.annotate(f"{tokens:.0f} tok/ep", (i, 1.0), ha="center", va="bottom", fontsize=7, color="#444",
                    annotation_clip=False)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("accuracy" if result["metric"] == "accuracy" else "mean score")
    ax.set_title(f"{result['env_id']}: {result['num_paired_tasks']} tasks (95% CI)", fontsize=10)
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    return fig


def format_comparison(result: dict[str, Any], out: Path) -> str:
    """A few lines for the terminal: one line per baseline, the paired differences and where the reports are."""
    n, t = result["debate_shape"]
    models = ", ".join(dict.fromkeys(result["models"]))
    shapes = [f"debate {n}x{t}"] if {"debate", "team", "checkpoint"} & set(result["baselines"]) else []
    shapes += [f"majority of {n * t}"] if "majority" in result["baselines"] else []
    lines = [" | ".join([f"{result['env_id']}", models, f"{result['num_paired_tasks']} tasks",
                         f"seed {result['seed']}", *([", ".join(shapes)] if shapes else [])])]
    width = max(len(name) for name in result["baselines"])
    for name, row in result["baselines"].items():
        lines.append(f"  {name:<{width}}  first {format_ci(row['first_answer_accuracy'])}  "
                     f"final {format_ci(row['final_turn_accuracy'])}  team {format_ci(row['team_answer_accuracy'])}  "
                     f"tokens/ep {row['tokens_per_episode']['mean']:.0f}  wall {row['wall_time_total_s']:.0f} s")
    for p in result["paired_team_answer_difference"]:
        lines.append(f"  team answer {p['a']} - {p['b']}: {format_ci(p)} "
                     f"(better/tie/worse on {p['wins']}/{p['ties']}/{p['losses']} tasks)")
    if result.get("checkpoint"):
        lines.append(f"  checkpoint: {result['checkpoint']}")
    lines.append(f"  report: {out / report.REPORT_HTML}  ({out / COMPARISON_REPORT})")
    return "\n".join(lines)
