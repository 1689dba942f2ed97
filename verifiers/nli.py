"""Label verification for natural language inference (ANLI, SNLI/MNLI style).

``verify_label(response, gold)`` finds the label the model committed to and compares it with
the gold label. Labels are ``entailment``, ``neutral`` and ``contradiction``.

Gold may be the label name (any case), its first letter (``"e"``, ``"n"``, ``"c"``) or the
integer class id used by Hugging Face ``facebook/anli`` (and SNLI/MNLI): ``0`` entailment,
``1`` neutral, ``2`` contradiction (``"0"``/``"1"``/``"2"`` strings too). Anything else raises
``ValueError``.

Words read as a label (case-insensitive):

* entailment: ``entailment``, ``entail``, ``entails``, ``entailed``
* neutral: ``neutral``, ``undetermined``, ``indeterminate``, ``"cannot be determined"``,
  ``"neither entails nor contradicts"`` (any forms of the two verbs)
* contradiction: ``contradiction``, ``contradict``, ``contradicts``, ``contradicted``,
  ``contradictory``

A label word directly negated (``not``, ``no``, ``n't``, ``never``, ``cannot``, ``neither``,
``nor``, ``without`` among the three words before it, within the clause) does not count, so
"this is not entailment" names no label; so does a label answered "no" ("Entailment: No").

The committed label, first rule that applies:

1. a response that is just ``E``, ``N``, ``C`` or ``Neither`` (markup and punctuation aside);
2. the last answer the response marks, whichever of these starts later, so that a corrected
   answer beats the one it corrects (``"\\boxed{entailment}. Wait, the answer is neutral."`` is
   neutral, ``"The answer is neutral ... \\boxed{contradiction}"`` is contradiction):

   * the last ``\\boxed{...}``: it must name exactly one label (a bare ``E``/``N``/``C``/
     ``Neither`` is accepted inside a box), else the response is ``ambiguous`` or names no label;
   * the last explicit statement ("the answer is neutral", "Answer: contradiction",
     "final label: E", "Answer: Neither"), up to the end of its sentence, that names exactly one
     label (negated labels aside: "the answer is not entailment but neutral" is neutral). A
     statement naming several ("Answer: entailment, neutral or contradiction", an echo of
     the instructions) is skipped, and so is one inside the box;
3. the last sentence (or line) that names any label, if it names exactly one; if it
   names several the response is ``ambiguous``.

``details``: ``answer`` (the committed label or ``None``), ``gold`` (canonical gold label),
``source`` (``whole_response``/``boxed``/``statement``/``last_sentence``) and, when no label
was committed, ``reason`` (``"ambiguous"`` when several labels are named without committing).
"""
from __future__ import annotations

import numbers
import re

from verifiers import Verdict
from verifiers._text import final_statements, last_boxed_at, response_problem, tail

LABELS = ("entailment", "neutral", "contradiction")
"""Canonical labels in Hugging Face class-id order (0, 1, 2)."""

_GOLD_ALIASES = {
    **{label: label for label in LABELS},
    **{label[0]: label for label in LABELS},
    **{str(index): label for index, label in enumerate(LABELS)},
}
_SHORT_ANSWERS = {**{label[0]: label for label in LABELS}, "neither": "neutral"}
_MAX_SHORT_RESPONSE = 40

_NEITHER_NOR = r"neither\s+(?:an?\s+)?(?:entail|contradict)\w*\s+nor\s+(?:an?\s+)?(?:entail|contradict)\w*"
_CANNOT_BE_DETERMINED = r"\b(?:cannot|can't|can\s+not)\s+be\s+determined\b"
_LABEL_WORD_RE = re.compile(
    rf"(?P<neutral>{_NEITHER_NOR}|{_CANNOT_BE_DETERMINED}|\bneutral\b|\bundetermined\b|\bindeterminate\b)"
    r"|(?P<entailment>\bentail(?:ment|s|ed)?\b)"
    r"|(?P<contradiction>\bcontradict(?:ion|s|ed|ory)?\b)",
    re.IGNORECASE,
)
_NEGATORS = frozenset({"not", "no", "never", "cannot", "neither", "nor", "without", "isn't", "doesn't",
                       "aren't", "wasn't", "don't", "won't", "can't", "couldn't", "shouldn't"})
_NEGATION_WINDOW = 3
_ANSWERED_NO_RE = re.compile(r"\s*[:=\-]\s*(?:no|false)\b", re.IGNORECASE)  # "Entailment: No"
_CLAUSE_BREAK_RE = re.compile(r"[,;:.!?()\n]|\bbut\b", re.IGNORECASE)
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")


def verify_label(response: str, gold: str | int) -> Verdict:
    """Score 1.0 if the label ``response`` commits to equals ``gold``, else 0.0."""
    gold_label = canonical_gold_label(gold)
    problem = response_problem(response)
    if problem is not None:
        return _unjudged(problem, gold_label, source=None)
    label, source, reason = committed_label(response)
    if label is None:
        return _unjudged(reason, gold_label, source=source)
    correct = label == gold_label
    details = {"answer": label, "gold": gold_label, "source": source}
    return Verdict(score=1.0 if correct else 0.0, correct=correct, details=details)


def canonical_gold_label(gold: str | int) -> str:
    """``entailment``/``neutral``/``contradiction`` from a name, a letter or a class id 0/1/2."""
    if isinstance(gold, bool) or not isinstance(gold, (str, numbers.Integral)):
        raise ValueError(f"gold label must be a label name or class id 0/1/2, got {gold!r}")
    label = _GOLD_ALIASES.get(str(gold).strip().lower())
    if label is None:
        raise ValueError(
            f"unknown gold label {gold!r}: use one of {', '.join(LABELS)}, e/n/c, "
            "or the facebook/anli class ids 0 (entailment), 1 (neutral), 2 (contradiction)"
        )
    return label


def committed_label(text: str) -> tuple[str | None, str | None, str]:
    """``(label, source, reason)``: the label ``text`` commits to, where, or why there is none."""
    whole = _short_answer(text) if len(text) <= _MAX_SHORT_RESPONSE else None
    if whole is not None:
        return whole, "whole_response", ""
    boxed = last_boxed_at(text)
    box_start, box_end = (boxed[0], text.index(boxed[1], boxed[0]) + len(boxed[1])) if boxed else (-1, -1)
    statement = next(((start, labels[0]) for start, span in final_statements(text)
                      if len(labels := _answer_labels(span)) == 1 and not box_start <= start < box_end), None)
    if statement is not None and statement[0] > box_start:    # the later of the two marked answers wins
        return statement[1], "statement", ""
    if boxed is not None:
        labels = _answer_labels(boxed[1])
        if len(labels) == 1:
            return labels[0], "boxed", ""
        return None, "boxed", "ambiguous" if labels else f"boxed answer {boxed[1][:50]!r} names no label"
    for sentence in reversed(_SENTENCE_SPLIT_RE.split(tail(text))):
        labels = _distinct(labels_named(sentence))
        if len(labels) == 1:
            return labels[0], "last_sentence", ""
        if labels:
            return None, "last_sentence", "ambiguous"
    return None, None, "no label found in response"


def labels_named(text: str) -> list[str]:
    """Labels that ``text`` names without negating them, in order of appearance."""
    labels = []
    for match in _LABEL_WORD_RE.finditer(text):
        phrase = match.group(0).lower()
        negation_in_phrase = phrase.startswith(("neither", "can"))
        answered_no = _ANSWERED_NO_RE.match(text, match.end()) is not None
        if not negation_in_phrase and (answered_no or _negated(text, match.start())):
            continue
        labels.append(match.lastgroup)
    return labels


def _answer_labels(answer: str) -> list[str]:
    """Distinct labels in an answer span (box content, statement), a bare ``E``/``N``/``C`` included."""
    short = _short_answer(answer)
    return [short] if short else _distinct(labels_named(answer))


def _short_answer(answer: str) -> str | None:
    """The label a bare ``E``/``N``/``C``/``Neither`` answer stands for, else ``None``."""
    return _SHORT_ANSWERS.get(_strip_markup(answer).lower())


def _negated(text: str, start: int) -> bool:
    """Whether one of the few words before ``start`` (same clause) is a negator."""
    before = text[max(0, start - 80):start]
    clause = _CLAUSE_BREAK_RE.split(before)[-1]
    words = re.findall(r"[a-z']+", clause.lower().replace("\u2019", "'"))
    return any(word in _NEGATORS or word.endswith("n't") for word in words[-_NEGATION_WINDOW:])


def _distinct(labels: list[str]) -> list[str]:
    """``labels`` without repeats, order kept."""
    return list(dict.fromkeys(labels))


def _strip_markup(text: str) -> str:
    """``text`` without LaTeX ``\\text{}``, markdown emphasis, quotes and trailing punctuation."""
    text = re.sub(r"\\text\w*\s*\{([^{}]*)\}", r"\1", text)
    return text.strip().strip("*_`'\"$()[] .,;:!").strip()


def _unjudged(reason: str, gold: str, source: str | None) -> Verdict:
    """Score-0 verdict for a response that commits to no single label."""
    return Verdict(score=0.0, correct=False,
                   details={"answer": None, "gold": gold, "source": source, "reason": reason})


__all__ = ["LABELS", "canonical_gold_label", "committed_label", "labels_named", "verify_label"]
