"""Episode-level metrics of multi-agent text episodes, with bootstrap confidence intervals.

Shared by the benchmark harness and the trainers' evaluation (e.g. the MAPPO example): every
function works on plain per-episode lists as recorded in ``infos[agent]["correct"]`` /
``["scores"]`` (one list per completed turn, one entry per agent) and on the extracted answers
of the verifier verdicts (``Verdict.details["answer"]``).

Conventions:

* correctness transitions are counted per agent between consecutive turns, as a 2×2 matrix
  ``[[C→C, C→I], [I→C, I→I]]`` (rows: before, columns: after); ``None`` entries are skipped.
  Flattened, the four counts are keyed :data:`TRANSITIONS` (``c_to_c``, ``c_to_i``, ``i_to_c``,
  ``i_to_i``); the **fix rate** is I→C / (I→C + I→I), the share of incorrect answers the next turn
  makes correct, and the **break rate** C→I / (C→C + C→I), the share of correct answers it makes
  incorrect (:func:`transition_summary`);
* the majority answer is the most frequent non-empty answer, ties going to the answer given
  by the lowest-indexed agent; it is correct when an agent giving it was judged correct;
* an episode that stopped early (e.g. on consensus) keeps its last answers for the remaining
  turns (:func:`pad_turns`), so per-turn means compare the same episodes at every turn.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

TRANSITIONS = ("c_to_c", "c_to_i", "i_to_c", "i_to_i")   # the counts' keys, in transition_counts().ravel() order
TRANSITION_LABELS = {"c_to_c": "C→C", "c_to_i": "C→I", "i_to_c": "I→C", "i_to_i": "I→I"}   # how tables print them
ANSWER_SOURCES = ("kept", "partner", "new")


def normalised_answers(answers: Sequence[str | None]) -> list[str]:
    """The answers stripped of surrounding whitespace; a missing answer becomes ``""``."""
    return [a.strip() if isinstance(a, str) else "" for a in answers]


def pad_turns(per_turn: Sequence[Sequence[Any]], num_turns: int) -> list[list[Any]]:
    """Repeat the last turn's entries until there are ``num_turns`` turns (early-stopped episodes)."""
    if not per_turn:
        raise ValueError("an episode needs at least one completed turn to be scored")
    if len(per_turn) > num_turns:
        raise ValueError(f"episode has {len(per_turn)} turns but num_turns={num_turns}; pass the env's num_turns")
    rows = [list(row) for row in per_turn]
    return rows + [list(rows[-1]) for _ in range(num_turns - len(rows))]


def turn_accuracy(correct: Sequence[Sequence[bool | None]], scores: Sequence[Sequence[float]]) -> list[float]:
    """Per turn: the fraction of agents judged correct, or the mean score where correctness is undefined."""
    out = []
    for flags, turn_scores in zip(correct, scores):
        known = [bool(c) for c in flags if c is not None]
        out.append(float(np.mean(known)) if known else float(np.mean(turn_scores)))
    return out


def transition_counts(correct: Sequence[Sequence[bool | None]]) -> np.ndarray:
    """2×2 counts ``[[C→C, C→I], [I→C, I→I]]`` over agents and consecutive turn pairs of one episode."""
    counts = np.zeros((2, 2), dtype=np.int64)
    for before, after in zip(correct[:-1], correct[1:]):
        for b, a in zip(before, after):
            if b is None or a is None:
                continue
            counts[0 if b else 1, 0 if a else 1] += 1
    return counts


def answer_sources(answers: Sequence[Sequence[str | None]]) -> np.ndarray:
    """Where each agent's last-turn answer came from: ``[agents, 3]`` one-hot rows over :data:`ANSWER_SOURCES`.

    ``kept``: the agent's own answer at the turn before; ``partner``: another agent's answer at the turn
    before (and not its own); ``new``: neither (an empty answer counts as new). Answers are compared after
    stripping whitespace. A one-turn episode has no earlier turn: all zeros.
    """
    if not answers:
        raise ValueError("an episode needs at least one completed turn to trace its answers")
    last = normalised_answers(answers[-1])
    counts = np.zeros((len(last), len(ANSWER_SOURCES)), dtype=np.int64)
    if len(answers) < 2:
        return counts
    earlier = normalised_answers(answers[-2])
    for agent, answer in enumerate(last):
        others = {a for j, a in enumerate(earlier) if j != agent and a}
        source = 0 if answer and answer == earlier[agent] else 1 if answer in others else 2
        counts[agent, source] = 1
    return counts


def majority_answer(answers: Sequence[str | None]) -> str | None:
    """The most frequent non-empty answer; ties go to the answer of the lowest-indexed agent."""
    normalised = normalised_answers(answers)
    votes = Counter(a for a in normalised if a)
    if not votes:
        return None
    best = max(votes.values())
    return next(a for a in normalised if a and votes[a] == best)


def majority_correct(answers: Sequence[str | None], correct: Sequence[bool | None]) -> bool | None:
    """Whether the majority answer is correct (``False`` when nobody answered, ``None`` if unjudged)."""
    if all(c is None for c in correct):
        return None
    winner = majority_answer(answers)
    if winner is None:
        return False
    return any(bool(c) for a, c in zip(answers, correct) if isinstance(a, str) and a.strip() == winner)


def consensus(answers: Sequence[str | None]) -> bool:
    """Whether every agent gave the same non-empty answer."""
    normalised = normalised_answers(answers)
    return all(normalised) and len(set(normalised)) == 1


def bootstrap_ci(
    data: Sequence[Any] | np.ndarray,
    statistic: Callable[[np.ndarray], Any] | None = None,
    *,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Percentile bootstrap over episodes (rows of ``data``): ``(estimate, low, high)`` of ``statistic``.

    ``statistic`` maps an array of episode rows to a scalar or array (default: the column mean,
    computed for all resamples at once); a ratio of sums such as a transition rate is resampled
    as a whole, not averaged per episode.
    """
    rows = np.asarray(data, dtype=float)
    if rows.shape[0] == 0:
        raise ValueError("bootstrap_ci needs at least one episode, got an empty array")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if num_resamples < 1:
        raise ValueError(f"num_resamples must be >= 1, got {num_resamples}")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, rows.shape[0], size=(num_resamples, rows.shape[0]))
    if statistic is None:
        estimate, samples = rows.mean(axis=0), rows[draws].mean(axis=1)
    else:
        estimate = np.asarray(statistic(rows), dtype=float)
        samples = np.stack([np.asarray(statistic(rows[idx]), dtype=float) for idx in draws])
    tail = (1 - confidence) / 2 * 100
    # a statistic undefined in every resample (a rate whose denominator is always 0) has no interval: NaN bounds
    columns = samples.reshape(num_resamples, -1)
    defined = ~np.isnan(columns).all(axis=0)
    low, high = np.full(columns.shape[1], np.nan), np.full(columns.shape[1], np.nan)
    if defined.any():
        low[defined], high[defined] = np.nanpercentile(columns[:, defined], [tail, 100 - tail], axis=0)
    shape = np.shape(estimate)          # [()]: a scalar statistic's bounds come back as numpy scalars
    return estimate, low.reshape(shape)[()], high.reshape(shape)[()]


def transition_totals(counts: np.ndarray | Sequence[Any]) -> np.ndarray:
    """The four counts C→C, C→I, I→C, I→I summed over a stack of episodes' (or tasks') 2×2 or flattened counts."""
    return np.asarray(counts, dtype=float).reshape(-1, 4).sum(axis=0)


def fix_rate(counts: np.ndarray | Sequence[Any]) -> float:
    """I→C / (I→C + I→I) over the summed counts: the share of incorrect answers the next turn makes correct.

    NaN when no answer was incorrect. ``counts``: one 2×2 matrix, a stack of them, or rows of four counts.
    """
    _, _, fixed, kept = transition_totals(counts)
    return float(fixed / (fixed + kept)) if fixed + kept else float("nan")


def break_rate(counts: np.ndarray | Sequence[Any]) -> float:
    """C→I / (C→C + C→I) over the summed counts: the share of correct answers the next turn makes incorrect.

    NaN when no answer was correct. ``counts`` as in :func:`fix_rate`.
    """
    kept, broken, _, _ = transition_totals(counts)
    return float(broken / (kept + broken)) if kept + broken else float("nan")


def transition_summary(counts: np.ndarray | Sequence[Any],
                       interval: Callable[[np.ndarray, Callable[[np.ndarray], float]], Any] | None = None
                       ) -> dict[str, Any]:
    """The summed counts keyed :data:`TRANSITIONS`, and ``fix_rate`` and ``break_rate`` with a bootstrap interval.

    ``counts``: one row (or 2×2 matrix) per episode or task; the rates are ratios of sums, resampled by row.
    ``interval(rows, statistic)`` gives each rate's entry (default :func:`with_ci`); the rates are left out when
    there is no transition at all.
    """
    rows = np.asarray(counts, dtype=float).reshape(-1, 4)
    totals = rows.sum(axis=0)
    out: dict[str, Any] = {key: int(n) for key, n in zip(TRANSITIONS, totals)}
    if totals.sum():
        interval = interval or with_ci
        out["fix_rate"] = interval(rows, fix_rate)
        out["break_rate"] = interval(rows, break_rate)
    return out


def with_ci(data: Sequence[Any] | np.ndarray, statistic: Callable[[np.ndarray], Any] | None = None,
            *, seed: int = 0, num_resamples: int = 1000) -> Any:
    """``{"mean", "ci95": [low, high]}`` for a scalar statistic, or a list of those for a vector one."""
    kwargs = {"seed": seed, "num_resamples": num_resamples}
    estimate, low, high = bootstrap_ci(data, statistic, **kwargs)

    def entry(e: float, lo: float, hi: float) -> dict[str, Any]:
        return {"mean": _finite(e), "ci95": [_finite(lo), _finite(hi)]}

    if estimate.ndim == 0:
        return entry(estimate, low, high)
    return [entry(e, lo, hi) for e, lo, hi in zip(estimate, low, high)]


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def paired_difference(a: Sequence[float], b: Sequence[float], *, seed: int = 0,
                      num_resamples: int = 1000) -> dict[str, Any]:
    """Mean of ``a - b`` over paired episodes (the same tasks) with a bootstrap 95% CI, and win/tie/loss counts."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired_difference needs two equal-length 1-D sequences, got shapes {a.shape} and {b.shape}")
    out = with_ci(a - b, seed=seed, num_resamples=num_resamples)
    out.update(wins=int((a > b).sum()), ties=int((a == b).sum()), losses=int((a < b).sum()))
    return out


def rouge_l(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L F1 of each prediction against its reference (Google's ``rouge_score``, Porter-stemmed).

    A metric for writing envs that no reward reads: logged beside the training reward it shows whether
    a rising reward is better writing or reward hacking. An empty prediction or reference scores 0.
    """
    if len(predictions) != len(references):
        raise ValueError(f"rouge_l needs one reference per prediction, got {len(predictions)} predictions "
                         f"and {len(references)} references")
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return [float(scorer.score(reference, prediction)["rougeL"].fmeasure)
            for prediction, reference in zip(predictions, references)]


def distinct_word_ratio(text: str) -> float:
    """Distinct words ÷ words (lower-cased, split on whitespace); 0 for an empty text.

    A degenerate, repetitive output (``"SUBREDDIT: SUBREDDIT: ..."``) has a ratio near 0; fluent
    prose of a few dozen words stays above ~0.6.
    """
    words = text.lower().split()
    return len(set(words)) / len(words) if words else 0.0
