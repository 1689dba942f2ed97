"""`report.html`: one static, offline page per run — summary tables, plots and every episode's transcript.

The page needs nothing but a browser: CSS and JavaScript are inline, plots are inline SVG drawn by
matplotlib, and nothing is fetched. Every piece of model or task text is HTML-escaped.

What it shows, for one or several *runs* (:class:`RunView`: a label, the summary of
:func:`llm_marl.benchmark.summarize`, the episode records of
:func:`llm_marl.benchmark.episode_record`):

* summary tables (one per run, plus any extra table such as a baseline comparison);
* plots whose marks link to the episodes behind them (a bar or point to its run's episodes, a
  transition cell to the episodes with that transition);
* per episode, per turn and agent: the text, the extracted answer, correct or not, the reward.

Filters narrow the episode list; they read and write the URL hash, so a link (or a plot mark)
is a filter preset, e.g. ``report.html#run=debate&transition=C-I&disagree=1``:

==============  ======================================================================
``run``         a run's label
``transition``  ``C-I`` / ``I-C``: some agent went from correct to incorrect (or back)
                between consecutive turns
``disagree``    ``1``: at some turn the agents' extracted answers differ; ``0``: never
``outcome``     ``correct`` / ``incorrect``: the team answer (majority vote of the final
                answers) is right or wrong
==============  ======================================================================
"""
from __future__ import annotations

import html
import io
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llm_marl_envs import metrics

from .files import write_file_atomically, write_text_atomically

REPORT_HTML = "report.html"
TRANSITION_KEYS = {"c_to_i": "C-I", "i_to_c": "I-C"}   # transition -> URL value (ASCII, for the hash)
RATE_NAMES = {"fix_rate": "fix rate: I→C ÷ (I→C + I→I)", "break_rate": "break rate: C→I ÷ (C→C + C→I)"}


@dataclass
class RunView:
    """One run as the page shows it: a label (unique on the page), its summary and its episode records."""

    label: str
    summary: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def slug(self) -> str:
        """The label as an id-safe token (for anchors and the ``run`` filter)."""
        return slug(self.label)


@dataclass
class Table:
    """A table of plain strings (escaped when rendered)."""

    caption: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass
class Figure:
    """A plot for the page: inline SVG, a caption and filter presets linking to its episodes."""

    caption: str
    svg: str
    links: list[tuple[str, str]] = field(default_factory=list)    # (text, href)


def slug(text: str) -> str:
    """Lowercase letters, digits, ``-`` and ``_`` only."""
    return re.sub(r"[^a-z0-9_-]+", "-", str(text).lower()).strip("-") or "run"


def counted(count: int, noun: str) -> str:
    """``"1 turn"``, ``"2 turns"``: a count with its noun in the right number."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def format_ci(entry: dict[str, Any] | None, scale: float = 1.0, digits: int = 3) -> str:
    """``mean [low, high]`` of a ``{"mean", "ci95"}`` entry (``n/a`` when missing)."""
    if entry is None or entry.get("mean") is None:
        return "n/a"
    lo, hi = (x * scale if x is not None else float("nan") for x in entry["ci95"])
    return f"{entry['mean'] * scale:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def format_batch_share(entry: dict[str, Any] | None, digits: int = 2) -> str:
    """A per-episode share of batch wall times: ``mean [low, high]``, or the mean alone when every episode got the
    same share (one batch: the interval says nothing)."""
    if entry is None or entry.get("mean") is None:
        return "n/a"
    low, high = entry["ci95"]
    return f"{entry['mean']:.{digits}f}" if low == high else format_ci(entry, digits=digits)


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """``(metric, value [95% CI])`` rows of one run's summary (shared by report.md and report.html)."""
    label = "accuracy" if summary["metric"] == "accuracy" else "mean score"
    rows = [(f"{label}, turn {t} (mean over agents)", format_ci(e)) for t, e in enumerate(summary["accuracy_per_turn"])]
    rows += [
        ("final majority-vote accuracy", format_ci(summary.get("final_majority_accuracy"))),
        *((name, format_ci(summary["transitions"].get(key))) for key, name in RATE_NAMES.items()
          if "transitions" in summary),
        ("consensus rate (final turn)", format_ci(summary["consensus_rate"])),
        ("tokens generated per episode", format_ci(summary["tokens_per_episode"], digits=1)),
        ("wall time per episode (s; its share of its batch)", format_batch_share(summary["wall_time_per_episode_s"])),
        ("tokens generated (total)", str(summary["tokens_total"])),
        ("wall time (total, s)", f"{summary['wall_time_total_s']:.1f}"),
    ]
    return rows


# ---------------------------------------------------------------------------------- episode facts
def episode_facts(record: dict[str, Any]) -> dict[str, Any]:
    """What the filters test: transitions C→I / I→C, disagreement at some turn, the team answer and its outcome."""
    counts = metrics.transition_counts(record["correct"])
    answers = record.get("answers") or [[None] * len(turn) for turn in record["correct"]]
    disagree = any(len({(a or "").strip() for a in turn}) > 1 for turn in answers if len(turn) > 1)
    voted = record.get("answers_reported", True)            # no details["answer"]: no vote, the outcome is unjudged
    team_correct = metrics.majority_correct(answers[-1], record["correct"][-1]) if voted else None
    return {"C-I": bool(counts[0, 1]), "I-C": bool(counts[1, 0]), "disagree": disagree,
            "team_answer": metrics.majority_answer(answers[-1]),
            "outcome": "unjudged" if team_correct is None else ("correct" if team_correct else "incorrect")}


# ---------------------------------------------------------------------------------- figures
def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_png(fig: Any, path: str | os.PathLike) -> None:
    """Write ``fig`` as PNG (atomically: a reader never sees half a file)."""
    write_file_atomically(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))


def svg_of(fig: Any) -> str:
    """``fig`` as an inline ``<svg>`` element (no XML prolog); marks with ``set_url`` become links."""
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _errorbars(entries: Sequence[dict[str, Any] | None]) -> tuple[np.ndarray, np.ndarray]:
    means = np.array([np.nan if e is None or e["mean"] is None else e["mean"] for e in entries], dtype=float)
    lows = np.array([np.nan if e is None or e["ci95"][0] is None else e["ci95"][0] for e in entries], dtype=float)
    highs = np.array([np.nan if e is None or e["ci95"][1] is None else e["ci95"][1] for e in entries], dtype=float)
    return means, np.nan_to_num(np.stack([means - lows, highs - means]))


def accuracy_figure(views: Sequence[RunView], title: str) -> Any:
    """Accuracy (or mean score) per turn with 95% CIs, one line per run; each point links to its run's episodes."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    metric = views[0].summary["metric"]
    for view in views:
        means, err = _errorbars(view.summary["accuracy_per_turn"])
        turns = np.arange(len(means))
        line = ax.errorbar(turns, means, yerr=err, marker="o", capsize=4, label=f"{view.label}: per agent")
        line.lines[0].set_url(f"#run={view.slug}")
        majority = view.summary.get("final_majority_accuracy")
        if majority and majority["mean"] is not None and len(views) == 1:
            ax.axhline(majority["mean"], linestyle="--", color="gray", label="final majority")
    ax.set_xticks(range(max(len(v.summary["accuracy_per_turn"]) for v in views)))
    ax.set_xlabel("turn")
    ax.set_ylabel("accuracy" if metric == "accuracy" else "mean score")
    if metric == "accuracy":
        ax.set_ylim(-0.03, 1.03)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="best", fontsize=7)
    fig.tight_layout()
    return fig


def transitions_figure(view: RunView) -> Any:
    """The 2×2 correctness-transition heatmap of one run; the C→I and I→C cells link to those episodes."""
    plt = pyplot()
    transitions = view.summary["transitions"]
    counts = np.array([transitions[key] for key in metrics.TRANSITIONS]).reshape(2, 2)
    total = max(int(counts.sum()), 1)
    fig, ax = plt.subplots(figsize=(4, 3.5))
    image = ax.imshow(counts / total, cmap="Blues", vmin=0, vmax=1)
    for (row, col), count in np.ndenumerate(counts):
        text = ax.text(col, row, f"{count}\n{count / total:.0%}", ha="center", va="center",
                       color="white" if count / total > 0.5 else "black")
        key = TRANSITION_KEYS.get(metrics.TRANSITIONS[row * 2 + col])
        if key:
            text.set_url(f"#run={view.slug}&transition={key}")
    ax.set_xticks([0, 1], ["correct", "incorrect"])
    ax.set_yticks([0, 1], ["correct", "incorrect"])
    ax.set_xlabel("turn t+1")
    ax.set_ylabel("turn t")
    ax.set_title(f"{view.label}: correctness transitions", fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    return fig


def run_figures(views: Sequence[RunView], title: str) -> list[tuple[str, Any, list[tuple[str, str]]]]:
    """``(caption, matplotlib figure, filter links)`` of the per-run plots (accuracy per turn, transitions)."""
    out = [(f"{'Accuracy' if views[0].summary['metric'] == 'accuracy' else 'Mean score'} per turn, mean over "
            "agents, with bootstrap 95% CIs. Click a line to show its run's episodes.",
            accuracy_figure(views, title), [(f"all {v.label} episodes", f"#run={v.slug}") for v in views])]
    for view in views:
        if "transitions" in view.summary:
            links = [(f"{view.label}: {metrics.TRANSITION_LABELS[name]}", f"#run={view.slug}&transition={key}")
                     for name, key in TRANSITION_KEYS.items()]
            out.append((f"{view.label}: how each agent's correctness changed between consecutive turns "
                        "(counts and share). Click C→I or I→C to see those episodes.", transitions_figure(view), links))
    return out


def embed(figures: Sequence[tuple[str, Any, list[tuple[str, str]]]]) -> list[Figure]:
    """Turn matplotlib figures into page figures (SVG) and close them."""
    plt = pyplot()
    out = []
    for caption, fig, links in figures:
        out.append(Figure(caption, svg_of(fig), links))
        plt.close(fig)
    return out


# ---------------------------------------------------------------------------------- page
def write_html_report(path: str | os.PathLike, title: str, views: Sequence[RunView], *,
                      meta: Sequence[str] = (), tables: Sequence[Table] = (),
                      figures: Sequence[Figure] | None = None) -> Path:
    """Write the page for ``views`` to ``path``: ``tables`` first, then each run's summary table, then ``figures``
    (default: :func:`run_figures` of ``views``)."""
    if not views:
        raise ValueError("a report needs at least one run")
    labels = [v.slug for v in views]
    if len(set(labels)) != len(labels):
        raise ValueError(f"run labels must be distinct, got {[v.label for v in views]}")
    run_tables = [Table(f"{v.label}", ["metric", "value [95% CI]"], [list(r) for r in summary_rows(v.summary)])
                  for v in views]
    if figures is None:
        figures = embed(run_figures(views, title))
    return write_text_atomically(path, render_html(title, views, meta=meta, tables=[*tables, *run_tables],
                                                   figures=figures))


def render_html(title: str, views: Sequence[RunView], *, meta: Sequence[str] = (), tables: Sequence[Table] = (),
                figures: Sequence[Figure] = ()) -> str:
    """The page as one string (see the module docstring)."""
    e = html.escape
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{e(title)}</title>",
             f"<style>{_CSS}</style></head><body>",
             f"<header><h1>{e(title)}</h1>",
             *(f"<p class=\"meta\">{e(line)}</p>" for line in meta),
             "<nav><a href=\"#summary\">Summary</a> · <a href=\"#plots\">Plots</a> · <a href=\"#episodes\">Episodes</a>"
             "</nav></header>",
             "<section id=\"summary\"><h2>Summary</h2>",
             "<p class=\"meta\">Intervals are bootstrap 95% CIs over episodes.</p>"]
    parts += [_table(t) for t in tables]
    parts.append("</section><section id=\"plots\"><h2>Plots</h2>")
    for fig in figures:
        links = " · ".join(f"<a href=\"{e(href)}\">{e(text)}</a>" for text, href in fig.links)
        parts.append(f"<figure>{fig.svg}<figcaption>{e(fig.caption)}"
                     f"{'<br>Episodes: ' + links if links else ''}</figcaption></figure>")
    parts.append("</section>")
    parts.append(_episodes_section(views))
    parts.append(f"<script>{_JS}</script></body></html>\n")
    return "\n".join(parts)


def _table(table: Table) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in table.header)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in table.rows)
    note = f"<p class=\"meta\">{e(table.note)}</p>" if table.note else ""
    return (f"<table><caption>{e(table.caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
            f"</table>{note}")


def _episodes_section(views: Sequence[RunView]) -> str:
    e = html.escape
    runs = "".join(f"<option value=\"{v.slug}\">{e(v.label)}</option>" for v in views)
    total = sum(len(v.records) for v in views)
    parts = ["<section id=\"episodes\"><h2>Episodes</h2>",
             "<form id=\"filters\" onsubmit=\"return false\">",
             f"<label>run <select name=\"run\"><option value=\"\">all</option>{runs}</select></label>",
             "<label>transition <select name=\"transition\"><option value=\"\">any</option>"
             "<option value=\"C-I\">some agent C→I</option>"
             "<option value=\"I-C\">some agent I→C</option></select></label>",
             "<label>disagreement <select name=\"disagree\"><option value=\"\">any</option>"
             "<option value=\"1\">agents disagree at some turn</option>"
             "<option value=\"0\">never</option></select></label>",
             "<label>team answer <select name=\"outcome\"><option value=\"\">any</option>"
             "<option value=\"correct\">correct</option>"
             "<option value=\"incorrect\">incorrect</option></select></label>",
             "<a href=\"#episodes\" id=\"clear\">clear filters</a></form>",
             f"<p id=\"shown\">{total} of {total} episodes shown</p>"]
    for view in views:
        for record in view.records:
            parts.append(_episode(view, record))
    parts.append("</section>")
    return "\n".join(parts)


def _episode(view: RunView, record: dict[str, Any]) -> str:
    e = html.escape
    facts = episode_facts(record)
    anchor = f"ep-{view.slug}-{record['episode']}"
    mark = {"correct": "✓", "incorrect": "✗"}.get(facts["outcome"], "–")
    head = (f"{e(view.label)} · episode {record['episode']} · task {e(str(record.get('task_index')))} "
            f"({e(str(record.get('task_id')))}) · team answer {e(str(facts['team_answer']))} {mark}")
    flags = [name for name in ("C-I", "I-C") if facts[name]] + (["disagree"] if facts["disagree"] else [])
    agents = [f"agent_{i}" for i in range(len(record["correct"][0]))]
    rewards = record.get("rewards") or record["scores"]
    answers = record.get("answers") or [[None] * len(agents) for _ in record["correct"]]
    rows = []
    for t, turn in enumerate(record["correct"]):
        for i, agent in enumerate(agents):
            correct = turn[i]
            cls = "unjudged" if correct is None else ("ok" if correct else "bad")
            rows.append(f"<tr class=\"{cls}\"><td>{t}</td><td>{e(agent)}</td>"
                        f"<td class=\"answer\">{e(str(answers[t][i]))}</td>"
                        f"<td>{'–' if correct is None else ('yes' if correct else 'no')}</td>"
                        f"<td>{rewards[t][i]:.3g}</td>"
                        f"<td><pre class=\"text\">{e(str(record['responses'][t][i]))}</pre></td></tr>")
    question = (f"<details><summary>task</summary><pre class=\"text\">{e(str(record['question']))}</pre>"
                f"{'<p>gold answer: ' + e(str(record['gold'])) + '</p>' if record.get('gold') is not None else ''}"
                "</details>") if record.get("question") else ""
    return (f"<article class=\"episode\" id=\"{anchor}\" data-run=\"{view.slug}\" data-c-i=\"{int(facts['C-I'])}\" "
            f"data-i-c=\"{int(facts['I-C'])}\" data-disagree=\"{int(facts['disagree'])}\" "
            f"data-outcome=\"{facts['outcome']}\">"
            f"<h3><a href=\"#{anchor}\">{head}</a> <span class=\"flags\">{e(' '.join(flags))}</span></h3>{question}"
            "<table class=\"transcript\"><thead><tr><th>turn</th><th>agent</th><th>answer</th><th>correct</th>"
            f"<th>reward</th><th>text</th></tr></thead><tbody>{''.join(rows)}</tbody></table></article>")


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;margin-top:1.5em}h3{font-size:1em;margin:.3em 0}
.meta{color:#555;margin:.2em 0}table{border-collapse:collapse;margin:.6em 0}
caption{text-align:left;font-weight:600;padding:.2em 0}
td,th{border:1px solid #ddd;padding:.25em .5em;vertical-align:top;text-align:left}
figure{display:inline-block;margin:.5em;vertical-align:top;max-width:560px}figure svg{max-width:100%;height:auto}
figcaption{font-size:.9em;color:#444}form label{margin-right:1em}
article.episode{border:1px solid #ccc;border-radius:4px;padding:.4em .6em;margin:.6em 0}
article.episode[hidden]{display:none}
tr.ok td:nth-child(4){color:#080;font-weight:600}tr.bad td:nth-child(4){color:#b00;font-weight:600}
pre.text{white-space:pre-wrap;margin:0;max-height:18em;overflow:auto;font-size:.9em}
td.answer{font-family:monospace}.flags{color:#a50;font-size:.85em}
"""

# Filters: the URL hash is the state, the form mirrors it; episodes that do not match get `hidden`.
_JS = """
(function(){
  var form=document.getElementById('filters'), names=['run','transition','disagree','outcome'];
  function state(){var s={};
    new URLSearchParams(location.hash.replace(/^#/,'')).forEach(function(v,k){s[k]=v;});return s;}
  function matches(el,s){
    if(s.run&&el.dataset.run!==s.run)return false;
    if(s.transition==='C-I'&&el.dataset.cI!=='1')return false;
    if(s.transition==='I-C'&&el.dataset.iC!=='1')return false;
    if(s.disagree&&el.dataset.disagree!==s.disagree)return false;
    if(s.outcome&&el.dataset.outcome!==s.outcome)return false;
    return true;}
  function apply(){
    var s=state(), eps=document.querySelectorAll('article.episode'), shown=0;
    names.forEach(function(n){form.elements[n].value=s[n]||'';});
    eps.forEach(function(el){var ok=matches(el,s);el.hidden=!ok;if(ok)shown++;});
    document.getElementById('shown').textContent=shown+' of '+eps.length+' episodes shown';}
  form.addEventListener('change',function(){
    var p=new URLSearchParams();names.forEach(function(n){if(form.elements[n].value)p.set(n,form.elements[n].value);});
    location.hash=p.toString()||'episodes';});
  function show(){apply();
    if(names.some(function(n){return state()[n];}))document.getElementById('episodes').scrollIntoView();}
  window.addEventListener('hashchange',show);
  show();
})();
"""
