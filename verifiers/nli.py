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

A commitment does not stand (score 0, ``reason`` says why) when another label sits right beside it
with only punctuation, ``or``/``and`` or answer prefixes between (``"Entailment. Neutral.
Contradiction."``, ``"Answer: entailment; neutral"``, ``"\\boxed{E}\\boxed{N}"``), or when the
answer or the text after it takes it back: the same label negated or answered "no" (``"The answer
is entailment. Not entailment."``) or a retraction (``"just kidding"``, ``"that label is wrong"``).

The label judged is the speaker's own: a clause that attributes a label to another agent is not
read ("Agent 2 said contradiction, but I think the answer is entailment" -> entailment; "the
other agent claims neutral" alone commits to no label and scores 0). An agent that agrees and
states the label commits to it ("I agree with Agent 1: the answer is neutral"). The cues and the
clause they cover are those of :func:`verifiers._text.own_text`.

``details``: ``answer`` (the committed label or ``None``), ``gold`` (canonical gold label),
``source`` (``whole_response``/``boxed``/``statement``/``last_sentence``) and, when no label
was committed, ``reason`` (``"ambiguous"`` when several labels are named without committing).
"""
from __future__ import annotations

import numbers
import re

from verifiers import Verdict
from verifiers._text import final_statements, last_boxed_at, own_text, response_problem, tail

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
    own = own_text(response)
    label, source, reason = _committed(own)
    if label is None:
        if own != response and _committed(response)[0] is not None:
            reason = "no label of its own: the response only states labels it attributes to other agents"
        return _unjudged(reason, gold_label, source=source)
    hedge = hedged_label(own, label, source)
    if hedge is not None:
        return _unjudged(hedge, gold_label, source=source)
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
    """``(label, source, reason)``: the label ``text`` commits to, where, or why there is none.

    The speaker's own label: clauses that attribute a label to another agent are not read
    (:func:`verifiers._text.own_text`).
    """
    return _committed(own_text(text))


def _committed(text: str) -> tuple[str | None, str | None, str]:
    """:func:`committed_label` on text whose attributed clauses are already blanked."""
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


_FILLER = r"(?:[\s,;/|.:!?()*_`'\"$-]|\b(?:or|and|maybe|perhaps|possibly|the|final|answer|label|is|it|its|it's)\b)*"
_LABEL_OR_BOX = (r"(?:\\(?:boxed|fbox)\s*\{(?P<box>[^{}]{1,40})\}|(?P<word>" + _LABEL_WORD_RE.pattern
                 + r"|\b[ENC]\b))")
_LABEL_BEFORE_RE = re.compile(r"(?:^|[\n.!?;,/|}])\s*(?:\b(?:the|final|answer|label|is)\b\s*:?\s*)*" + _LABEL_OR_BOX
                              + _FILLER + r"$", re.IGNORECASE)
_BARE_SENTENCE_WORDS = 3   # a sentence of a label and at most this many other words is a bare label
_LABEL_AFTER_RE = re.compile(r"^\s*(?:[,;/|]|\bor\b|\band\b)" + _FILLER + _LABEL_OR_BOX, re.IGNORECASE)
_RETRACTION_RE = re.compile(
    r"\b(?:just\s+kidding|i\s+take\s+(?:it|that)\s+back|scratch\s+that|(?:that|this)(?:'s|\s+is)\s+(?:wrong|incorrect|false)"
    r"|(?:that|this|the)\s+(?:label|answer)\s+is\s+(?:wrong|incorrect|false)|it\s+is\s+false\s+that"
    r"|(?:it|that)\s+is(?:\s+not|n't)(?:\s+(?:it|so|true|right|correct))?\s*[.!]|(?:it|that)'s\s+not(?:\s+(?:it|so|true|right|correct))?\s*[.!])",
    re.IGNORECASE)


def hedged_label(text: str, label: str, source: str | None) -> str | None:
    """Why the commitment to ``label`` does not stand, or ``None``.

    It does not stand when another label sits right beside it with only punctuation or connectors
    between (``"Entailment. Neutral. Contradiction."``, ``"Answer: entailment; neutral"``,
    ``"\\boxed{E}\\boxed{N}"``), or when the text after it takes it back: the same label
    negated or answered "no" (``"The answer is entailment. Not entailment."``) or a retraction
    (``"just kidding"``, ``"that is wrong"``).
    """
    where = _commitment_span(text, label, source)
    if where is None:
        return None
    start, end = where
    bare = source != "last_sentence" or len(re.findall(r"[A-Za-z']+", text[start:end])) <= _BARE_SENTENCE_WORDS
    for found in (
        _LABEL_BEFORE_RE.search(text[max(0, start - 200) : start]),
        _LABEL_AFTER_RE.search(text[end : end + 200]),
    ):
        if found is None or not bare:
            continue
        beside = _answer_labels(found.group("box")) if found.group("box") else _answer_labels(found.group("word"))
        if beside and beside != [label]:
            return "ambiguous: several labels offered side by side"
    after = text[start:]   # the answer itself and what follows
    for match in _LABEL_WORD_RE.finditer(after):
        negation_in_phrase = match.group(0).lower().startswith(("neither", "can"))
        if match.lastgroup == label and not negation_in_phrase and (
                _ANSWERED_NO_RE.match(after, match.end()) or _negated(after, match.start())):
            return f"the response takes back its label: it later negates {label!r}"
    if _RETRACTION_RE.search(text[end:]):
        return "the response takes back its label after stating it"
    return None


def _commitment_span(text: str, label: str, source: str | None) -> tuple[int, int] | None:
    """``(start, end)`` in ``text`` of the answer that committed to ``label`` (``None`` for a whole-response answer)."""
    if source == "boxed":
        found = last_boxed_at(text)
        if found is None:
            return None
        content_at = text.find(found[1], found[0])
        return found[0], content_at + len(found[1]) + 1
    if source == "statement":
        for start, span in final_statements(text):
            if _answer_labels(span) == [label]:
                at = text.find(span, start)
                return (start, at + len(span)) if at >= 0 else None
        return None
    if source == "last_sentence":
        for sentence in reversed(_SENTENCE_SPLIT_RE.split(tail(text))):
            if _distinct(labels_named(sentence)) == [label]:
                at = text.rfind(sentence)
                return (at, at + len(sentence)) if at >= 0 else None
    return None


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


__all__ = ["LABELS", "canonical_gold_label", "committed_label", "hedged_label", "labels_named", "verify_label"]
