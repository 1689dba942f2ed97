"""Benchmark harness: baseline LLM teams on any registered env, with resumable runs and a report.

Baselines on the same tasks (``baseline=``):

* ``single`` — one agent, one turn;
* ``majority`` — ``k = N·T`` independent samples (``k`` agents, one turn), the token budget of an
  ``N``-agent ``T``-turn debate, scored by majority vote over the extracted answers;
* ``debate`` — ``N`` agents × ``T`` turns (the env's protocol); ``team`` is the same run under the name that
  fits envs whose agents do not debate (the information-split envs);
* ``own_view`` — on an env whose agents hold private views (one that takes ``view=``, see
  :mod:`llm_marl_envs.envs.information_split`): each of the ``N`` roles played by one agent alone with
  its own view only, one turn (``view="own"``);
* ``full_view`` — there: one agent holding every view, one turn (``view="full"``);
* ``checkpoint`` — the trained team of a training checkpoint (``checkpoint=``, see
  :mod:`llm_marl.team_checkpoint`) in the debate's ``N × T``, each agent with its own trained
  weights; the other baselines then run its untrained base model(s), so trained and untrained
  play the same tasks;
* a *mixed team* is any baseline with several models (``models=[m0, m1, ...]``, one per agent).

Episodes run through the shared :class:`~llm_marl.rollout.RolloutEngine` (the
same rollout path as training). Run directory::

    run.json            settings, seed, package versions (a resumed run must match them)
    episodes.jsonl      one record per finished episode, appended as episodes finish
    summary.json        metrics with bootstrap 95% CIs (see :func:`summarize`)
    report.md           the summary as tables, with the plots below
    report.html         the same plus every episode's transcript, with filters (:mod:`llm_marl.report`)
    accuracy_per_turn.png, transitions.png

An interrupted run resumes where it stopped: finished episodes (by index) are skipped.
"""
from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from llm_marl_envs import metrics
from llm_marl_envs.registry import make, spec

from . import report
from .files import write_text_atomically
from .report import RunView

if TYPE_CHECKING:
    from .team import Team

BASELINES = ("single", "majority", "debate", "team", "own_view", "full_view", "checkpoint")
VIEW_BASELINES = {"own_view": "own", "full_view": "full"}      # baseline -> the env's view=
TEAM_BASELINES = ("debate", "team", "own_view")                # one model per agent allowed (a mixed team)
RUN_FILE, EPISODES_FILE, SUMMARY_FILE, REPORT_FILE = "run.json", "episodes.jsonl", "summary.json", "report.md"
ACCURACY_PLOT, TRANSITIONS_PLOT = "accuracy_per_turn.png", "transitions.png"


@dataclass
class BenchConfig:
    """What to run: env, team (models + backend), baseline, episodes, sampling and seed."""

    env_id: str
    models: list[str] = field(default_factory=lambda: ["smollm2-135m"])
    backend: str = "llamacpp"
    base_url: str | None = None
    baseline: str = "debate"
    num_agents: int | None = None      # debate size N (None: the env's default)
    num_turns: int | None = None       # debate turns T (None: the env's default)
    episodes: int = 20
    seed: int = 0
    max_new_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.9
    episodes_per_batch: int = 4        # episodes the rollout engine advances together
    threads: int | None = None         # llamacpp threads (None: the free cores)
    weights: str | None = None         # llamacpp weights: shipped|f16|q8_0|f32 (None: f16 for an embedded model)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None      # a trained team's checkpoint dir: the team of the "checkpoint" baseline
    base_model: str | None = None      # where the checkpoint's base model is now, when its directory moved

    def __post_init__(self) -> None:
        if self.baseline not in BASELINES:
            raise ValueError(f"unknown baseline {self.baseline!r}; choose one of {list(BASELINES)}")
        if not self.models or not all(isinstance(m, str) and m for m in self.models):
            raise ValueError(f"models must be a non-empty list of model names, got {self.models!r}")
        for name, value in (("episodes", self.episodes), ("episodes_per_batch", self.episodes_per_batch)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name, value in (("num_agents", self.num_agents), ("num_turns", self.num_turns)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1 or None (env default), got {value!r}")
        spec(self.env_id)  # unknown env id -> ValueError listing the registered ones
        if self.baseline == "checkpoint" and not self.checkpoint:
            raise ValueError("the 'checkpoint' baseline runs a trained team: give its checkpoint directory "
                             "(--checkpoint DIR)")
        if self.base_model and not self.checkpoint:
            raise ValueError("base_model (--base-model) says where a checkpoint's base model moved; give the "
                             "checkpoint too (--checkpoint DIR), or name the model with --model")
        if self.checkpoint and self.backend != "hf":
            raise ValueError(f"a checkpoint's trained weights load into transformers models: --checkpoint needs "
                             f"--backend hf, got --backend {self.backend}")
        if self.baseline in ("single", "full_view") and len(self.models) > 1:
            raise ValueError(f"the {self.baseline} baseline runs one model, got {len(self.models)}: {self.models}; "
                             "pass one --model or use --baseline debate/majority for a mixed team")
        if self.baseline in VIEW_BASELINES:
            if "view" not in spec(self.env_id).parameters():
                raise ValueError(f"the {self.baseline} baseline needs an env whose agents hold private views (one "
                                 f"that takes view='own'/'full', e.g. split_arithmetic-v0); {self.env_id} has none: "
                                 "use single, majority or team")
            if {"view", "seat"} & set(self.env_kwargs):
                raise ValueError(f"the {self.baseline} baseline sets the env's view itself; drop view/seat from "
                                 f"env_kwargs ({self.env_kwargs})")

    def debate_shape(self) -> tuple[int, int]:
        """``(N, T)`` of the debate this run is matched to (arguments, else mixed-team size, else env defaults)."""
        env_spec = spec(self.env_id)
        agents = self.num_agents or (len(self.models) if len(self.models) > 1 else env_spec.default("num_agents"))
        turns = self.num_turns or env_spec.default("num_turns")
        return int(agents), int(turns)

    def env_shape(self) -> tuple[int, int]:
        """``(agents, turns)`` of the env episodes run in, for this baseline."""
        agents, turns = self.debate_shape()
        if self.baseline in ("single", "full_view"):
            return 1, 1
        if self.baseline == "majority":
            return agents * turns, 1
        if self.baseline == "own_view":
            return agents, 1
        return agents, turns

    def env_options(self) -> dict[str, Any]:
        """The env keyword arguments of this baseline's episodes (``env_kwargs``, its view, agents and turns)."""
        agents, turns = self.env_shape()
        view = {"view": VIEW_BASELINES[self.baseline]} if self.baseline in VIEW_BASELINES else {}
        return {**self.env_kwargs, **view, "num_agents": agents, "num_turns": turns}

    def agent_models(self) -> list[str]:
        """The model of each agent: one shared model, or the mixed team's models in turn."""
        agents, _ = self.env_shape()
        if self.baseline in TEAM_BASELINES and len(self.models) not in (1, agents):
            raise ValueError(f"a mixed team needs one model per agent: {agents} agents but {len(self.models)} "
                             f"models {self.models}; pass {agents} models or set --num-agents {len(self.models)}")
        return [self.models[i % len(self.models)] for i in range(agents)]

    def settings(self) -> dict[str, Any]:
        """The settings a resumed run must share (everything but the number of episodes)."""
        out = asdict(self)
        out.pop("episodes")
        if out["base_model"] is None:        # runs written before the field existed resume
            out.pop("base_model")
        return out


# ---------------------------------------------------------------------------------- episodes
def task_schedule(num_tasks: int, episodes: int, seed: int) -> list[int]:
    """Task index of each episode: a seeded permutation of the tasks, repeated if episodes > tasks."""
    if num_tasks < 1:
        raise ValueError("the env has no tasks; check its data (split, data_dir or LLM_MARL_DATA_DIR)")
    rng = np.random.default_rng(seed)
    rounds = -(-episodes // num_tasks)
    return [int(i) for _ in range(rounds) for i in rng.permutation(num_tasks)][:episodes]


def episode_record(index: int, episode: Any, wall_time_s: float, models: Sequence[str]) -> dict[str, Any]:
    """The JSON record of a finished :class:`~llm_marl.episode.Episode` (per turn, per agent lists)."""
    agents = episode.agents

    def per_turn(value: Callable[[Any], Any]) -> list[list[Any]]:
        return [[value(turn[a]) for a in agents] for turn in episode.turns]

    return {
        "episode": index,
        "task_index": episode.task_index,
        "task_id": episode.task_id,
        "seed": episode.seed,
        "models": list(models),
        "question": _question_of(episode),
        "gold": next((g for turn in per_turn(_gold_of) for g in turn if g is not None), None),
        "correct": per_turn(lambda t: t.correct),
        "scores": per_turn(lambda t: float(t.verdict["score"]) if t.verdict else float(t.reward)),
        "rewards": per_turn(lambda t: float(t.reward)),
        "answers": per_turn(_answer_of),
        "answers_reported": any(_reports(turn[a], "answer") for turn in episode.turns for a in agents),
        "responses": per_turn(lambda t: t.text),
        "tokens": int(episode.num_tokens),
        "wall_time_s": float(wall_time_s),
    }


def _detail_of(agent_turn: Any, key: str) -> str | None:
    """A verdict detail (``details[key]``) as text, if the verifier reports it."""
    details = (agent_turn.verdict or {}).get("details") or {}
    value = details.get(key) if isinstance(details, dict) else None
    return None if value is None else str(value)


def _reports(agent_turn: Any, key: str) -> bool:
    """Whether the verifier's verdict carries ``details[key]`` (``None`` included: reported, not extracted)."""
    details = (agent_turn.verdict or {}).get("details")
    return isinstance(details, dict) and key in details


def _answer_of(agent_turn: Any) -> str | None:
    """The verifier's extracted answer (``details["answer"]``), if it reports one."""
    return _detail_of(agent_turn, "answer")


def _gold_of(agent_turn: Any) -> str | None:
    """The gold answer the verifier compared with (``details["gold"]``), if it reports one."""
    return _detail_of(agent_turn, "gold")


def _question_of(episode: Any) -> str | None:
    """The first agent's first user message: the task as the team saw it."""
    if not episode.turns:
        return None
    first = next(iter(episode.turns[0].values()))
    return next((m["content"] for m in first.messages if m.get("role") == "user"), None)


def read_episodes(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Finished episode records of a run (a torn last line from an interrupted write is dropped)."""
    path = Path(path)
    if not path.is_file():
        return []
    records, lines = [], path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines) - 1:
                break  # the process died mid-write; that episode runs again
            raise ValueError(f"{path}:{number + 1} is not valid JSON; the run directory is damaged") from None
    return records


# ---------------------------------------------------------------------------------- run
def load_policies(config: BenchConfig, policies: dict[str, Any] | None = None) -> dict[str, Any]:
    """Model name -> policy for every model of ``config``'s team: those in ``policies`` as given, others loaded."""
    from llm_marl.backends import load_policy

    loaded = dict(policies or {})
    if config.baseline == "checkpoint":
        return loaded                      # the trained team brings its own (see build_team)
    for model in dict.fromkeys(config.agent_models()):
        if model not in loaded:
            options = {}
            if config.backend == "llamacpp":
                options = {"weights": config.weights, **({"n_threads": config.threads} if config.threads else {})}
            loaded[model] = load_policy(config.backend, model, config.base_url, seed=config.seed, **options)
    return loaded


def build_team(config: BenchConfig, agents: Sequence[str], policies: dict[str, Any] | None = None,
               trained: Team | None = None) -> Team:
    """One policy per distinct model (loaded once, shared by the agents that use it), seated per agent; for the
    ``checkpoint`` baseline, ``trained`` or else the checkpoint's team loaded for ``agents``."""
    from llm_marl.team import Team  # torch and transformers load only when a run needs them
    from llm_marl.team_checkpoint import load_team

    if config.baseline == "checkpoint":
        return trained if trained is not None else load_team(config.checkpoint, agents, config.models,
                                                             base_model=config.base_model)
    loaded = load_policies(config, policies)
    return Team.from_policies({agent: loaded[model] for agent, model in zip(agents, config.agent_models())})


def make_env(config: BenchConfig) -> Any:
    """The env ``config``'s episodes run in (its baseline's agents and turns)."""
    return make(config.env_id, **config.env_options())


def _start_run(config: BenchConfig, out: Path) -> dict[str, Any]:
    """Write ``run.json`` for a new run, or check that a resumed run has the same settings."""
    run_file = out / RUN_FILE
    if run_file.is_file():
        run = json.loads(run_file.read_text(encoding="utf-8"))
        previous = {k: v for k, v in run["config"].items() if k != "episodes"}
        changed = sorted(k for k in set(previous) | set(config.settings())
                         if previous.get(k) != config.settings().get(k))
        if changed:
            details = ", ".join(f"{k}: {previous.get(k)!r} -> {config.settings().get(k)!r}" for k in changed)
            raise ValueError(f"{out} holds a run with other settings ({details}); pass a new --out, "
                             f"or the same settings to resume it")
        run["config"]["episodes"] = max(run["config"]["episodes"], config.episodes)
    else:
        import importlib.metadata as md
        run = {"config": asdict(config), "env_id": config.env_id, "baseline": config.baseline,
               "models": config.agent_models(), "backend": config.backend, "seed": config.seed,
               "env_shape": list(config.env_shape()), "debate_shape": list(config.debate_shape()),
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "python": platform.python_version(), "cpu_count": os.cpu_count(),
               "versions": {p: _version(md, p) for p in ("llm-marl-envs", "torch", "transformers",
                                                           "llama_cpp_python")}}
    write_text_atomically(run_file, json.dumps(run, indent=2) + "\n")
    return run


def _version(md: Any, package: str) -> str | None:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return None


def run_benchmark(config: BenchConfig, out_dir: str | os.PathLike, *, policies: dict[str, Any] | None = None,
                  trained: Team | None = None, progress: bool = True) -> dict[str, Any]:
    """Run the episodes of ``config`` not yet in ``out_dir`` (appending each batch as it finishes), then report.

    ``policies`` maps model names to ready :class:`~llm_marl.policy.Policy` objects (else
    they are loaded with :func:`~llm_marl.backends.load_policy`); ``trained``: the ready team
    of the ``checkpoint`` baseline (else loaded from ``config.checkpoint``). Episodes run through the
    shared :class:`~llm_marl.rollout.RolloutEngine`, ``episodes_per_batch`` at a time (one
    generate call per policy per turn). Returns the summary.
    """
    from tqdm.auto import tqdm

    from llm_marl.policy import SamplingParams
    from llm_marl.rollout import RolloutEngine

    out = Path(out_dir)
    models = config.agent_models()
    env = make_env(config)
    schedule = task_schedule(len(env.tasks), config.episodes, config.seed)  # loads the data: fails early
    _start_run(config, out)
    episodes_file = out / EPISODES_FILE
    finished = read_episodes(episodes_file)
    _rewrite_complete(episodes_file, finished)
    done = {r["episode"] for r in finished}
    # fixed batches [0, B), [B, 2B), ...: a batch cut short by a crash runs again whole (its sampling
    # depends on the batch), and only its missing episodes are written
    batches = [list(range(start, min(start + config.episodes_per_batch, config.episodes)))
               for start in range(0, config.episodes, config.episodes_per_batch)]
    batches = [batch for batch in batches if not done.issuperset(batch)]
    if batches:
        engine = RolloutEngine(env, build_team(config, env.possible_agents, policies, trained), progress=False,
                               env_name=config.env_id)
        bar = tqdm(total=config.episodes, initial=len(done & set(range(config.episodes))), unit="episode",
                   desc=f"{config.env_id} {config.baseline}", disable=not progress, smoothing=0)
        with open(episodes_file, "a", encoding="utf-8") as sink, bar:
            for batch in batches:
                params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                                        top_p=config.top_p, seed=config.seed * 1_000_003 + batch[0])
                began = time.perf_counter()
                episodes = engine.collect(seeds=[config.seed + i for i in batch],
                                          task_indices=[schedule[i] for i in batch], params=params)
                per_episode_s = (time.perf_counter() - began) / len(batch)  # batched: the batch's time, shared
                missing = [(i, episode) for i, episode in zip(batch, episodes) if i not in done]
                for i, episode in missing:
                    sink.write(json.dumps(episode_record(i, episode, per_episode_s, models)) + "\n")
                sink.flush()
                bar.update(len(missing))
    return write_report(out)


def _rewrite_complete(path: Path, records: list[dict[str, Any]]) -> None:
    """Drop a torn last line so appended records start on a fresh line."""
    if path.is_file() and len(path.read_text(encoding="utf-8").splitlines()) != len(records):
        write_text_atomically(path, "".join(json.dumps(r) + "\n" for r in records))


# ---------------------------------------------------------------------------------- summary
def summarize(records: Sequence[dict[str, Any]], num_turns: int, *, seed: int = 0,
              num_resamples: int = 1000) -> dict[str, Any]:
    """Metrics over episode records, each with a bootstrap 95% CI (resampling episodes, seeded).

    ``accuracy_per_turn`` (fraction of agents correct, or mean score where the verifier has no
    notion of correct), ``final_majority_accuracy``, ``transitions`` between consecutive turns (the counts
    and the fix and break rates of :func:`llm_marl_envs.metrics.transition_summary`),
    ``consensus_rate`` on the final turn, ``tokens_per_episode``, ``wall_time_per_episode_s``. The
    vote and the consensus need the verifier's extracted answers (``Verdict.details["answer"]``):
    without them both are ``None`` (n/a in the reports), not 0.
    """
    if not records:
        raise ValueError("no finished episodes to summarize; run the benchmark first")
    ci = {"seed": seed, "num_resamples": num_resamples}
    correct = [metrics.pad_turns(r["correct"], num_turns) for r in records]
    scores = [metrics.pad_turns(r["scores"], num_turns) for r in records]
    final_answers = [r["answers"][-1] for r in records]
    judged = any(c is not None for episode in correct for turn in episode for c in turn)
    per_turn = np.array([metrics.turn_accuracy(c, s) for c, s in zip(correct, scores)])
    # the vote needs the verifier's extracted answers (details["answer"]): without them it did not run (n/a)
    voted = all(r.get("answers_reported", True) for r in records)
    majority = [metrics.majority_correct(a, c[-1]) if voted else None for a, c in zip(final_answers, correct)]
    counts = np.stack([metrics.transition_counts(c) for c in correct])
    summary: dict[str, Any] = {
        "num_episodes": len(records),
        "metric": "accuracy" if judged else "mean_score",
        "accuracy_per_turn": metrics.with_ci(per_turn, **ci),
        "final_majority_accuracy": (metrics.with_ci([float(m) for m in majority], **ci)
                                    if all(m is not None for m in majority) else None),
        "consensus_rate": (metrics.with_ci([float(metrics.consensus(a)) for a in final_answers], **ci)
                           if voted else None),
        "tokens_per_episode": metrics.with_ci([r["tokens"] for r in records], **ci),
        "tokens_total": int(sum(r["tokens"] for r in records)),
        "wall_time_per_episode_s": metrics.with_ci([r["wall_time_s"] for r in records], **ci),
        "wall_time_total_s": float(sum(r["wall_time_s"] for r in records)),
    }
    if num_turns > 1 and judged:
        summary["transitions"] = metrics.transition_summary(
            counts, interval=lambda rows, statistic: metrics.with_ci(rows, statistic, **ci))
    return summary


# ---------------------------------------------------------------------------------- report
def run_view(out_dir: str | os.PathLike, label: str | None = None) -> tuple[RunView, dict[str, Any]]:
    """The summary (recomputed from the episodes) and records of a run directory, and its ``run.json``."""
    out = Path(out_dir)
    run_file = out / RUN_FILE
    if not run_file.is_file():
        raise ValueError(f"{out} is not a benchmark run directory (no {RUN_FILE}); pass the --out of a bench run")
    run = json.loads(run_file.read_text(encoding="utf-8"))
    records = sorted(read_episodes(out / EPISODES_FILE), key=lambda r: r["episode"])
    _, num_turns = run["env_shape"]
    summary = {**{k: run[k] for k in ("env_id", "baseline", "models", "backend", "seed", "env_shape", "debate_shape")},
               **({"checkpoint": run["config"]["checkpoint"]} if run["config"].get("checkpoint") else {}),
               **summarize(records, num_turns, seed=run["seed"])}
    return RunView(label or run["baseline"], summary, records), run


def write_report(out_dir: str | os.PathLike) -> dict[str, Any]:
    """(Re)build ``summary.json``, ``report.md``, ``report.html`` and the plots of a run directory from its episodes."""
    out = Path(out_dir)
    view, run = run_view(out)
    summary = view.summary
    write_text_atomically(out / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    title = f"{summary['env_id']} — {summary['baseline']} (95% CI)"
    figures = report.run_figures([view], title)
    for (_, fig, _), name in zip(figures, (ACCURACY_PLOT, TRANSITIONS_PLOT)):
        report.save_png(fig, out / name)
    write_text_atomically(out / REPORT_FILE, render_report(summary, run))
    report.write_html_report(out / report.REPORT_HTML, f"Benchmark: {summary['env_id']} — {summary['baseline']}",
                             [view], meta=run_meta(summary, run), figures=report.embed(figures))
    return summary


def run_meta(summary: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """The settings lines of a run (models, env shape, episodes, sampling, start, checkpoint)."""
    agents, turns = summary["env_shape"]
    lines = [
        f"models: {', '.join(summary['models'])} (backend {summary['backend']})",
        f"env: {agents} agent(s) × {turns} turn(s); matched debate: {summary['debate_shape'][0]} × "
        f"{summary['debate_shape'][1]}",
        f"episodes: {summary['num_episodes']}, seed {summary['seed']}, sampling: "
        f"max_new_tokens={run['config']['max_new_tokens']}, temperature={run['config']['temperature']}, "
        f"top_p={run['config']['top_p']}",
        f"started {run['started']}; python {run['python']}",
    ]
    if summary.get("checkpoint"):
        role = "its trained team plays" if summary["baseline"] == "checkpoint" else "this baseline runs its base model"
        lines.append(f"checkpoint: {summary['checkpoint']} ({role})")
    return lines


def render_report(summary: dict[str, Any], run: dict[str, Any]) -> str:
    """The markdown report of a summary."""
    label = "accuracy" if summary["metric"] == "accuracy" else "mean score"
    lines = [
        f"# Benchmark: {summary['env_id']} — {summary['baseline']}",
        "",
        *(f"- {line}" for line in run_meta(summary, run)),
        "",
        "All intervals are bootstrap 95% CIs over episodes. Episodes run in batches through the rollout "
        "engine; an episode's wall time is its batch's time divided by the batch size. Every episode's "
        f"transcript is in [{report.REPORT_HTML}]({report.REPORT_HTML}).",
        "",
        "| metric | value [95% CI] |",
        "| --- | --- |",
        *(f"| {name} | {value} |" for name, value in report.summary_rows(summary)),
        "",
        f"![{label} per turn]({ACCURACY_PLOT})",
    ]
    if "transitions" in summary:
        transitions = summary["transitions"]
        lines += [
            "",
            "## Correctness transitions between consecutive turns (per agent)",
            "",
            "| transition | count |",
            "| --- | ---: |",
            *(f"| {metrics.TRANSITION_LABELS[key]} | {transitions[key]} |" for key in metrics.TRANSITIONS),
            "",
            f"![transitions]({TRANSITIONS_PLOT})",
        ]
    return "\n".join(lines) + "\n"
