"""Multiple-choice verification: which of K lettered options did the response pick?

``verify_choice(response, gold, num_choices, names=())`` finds the option the model committed to and
compares it with the gold letter. Options are the letters ``A`` .. the ``num_choices``-th letter
(at most 8: ``A`` .. ``H``, so the pronoun "I" is never an option). Where ``names`` are given (one
per option, e.g. candidates' names), an option may also be picked by its name; without them only
letters count, which is what a task needs when knowing the name is not knowing the letter (a
reference game: the speaker knows the target, not the listener's lettering).

What counts as naming an option, inside an answer span (a box or a statement):

* the span is just a letter, in any case and with markup or punctuation around it
  (``B``, ``(b)``, ``**B.**``);
* else: a standalone capital letter in range, ``option b`` / ``choice b`` / ``candidate b`` /
  ``letter b`` / ``(b)`` in any case, or one of ``names`` as a whole word (any case).

The committed option, first rule that applies:

1. the whole response names one option as a span would (``"B"``, ``"Dana."``);
2. the last answer the response marks, whichever starts later: the last ``\\boxed{...}`` or the
   last statement ("the answer is ...", "answer: ...") up to the end of its sentence. It must name
   exactly one option; naming several is a hedge (``reason`` ``"ambiguous"``), naming none lets an
   earlier rule-2 marker of the other kind, and then rule 3, decide;
3. the last line naming any option in free text, where only ``option b``-style mentions, ``(b)``
   and names count (a capital ``A`` in prose is an article); it must name exactly one.

Gold is a letter in range (any case); anything else, or a ``num_choices`` outside 2..8, or
``names`` of the wrong length or with repeats, raises ``ValueError``.

``details``: ``answer`` (the committed letter or ``None``), ``gold`` (the gold letter), ``source``
(``whole_response``/``boxed``/``statement``/``last_line``) and, when nothing was committed, ``reason``.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from verifiers import Verdict
from verifiers._text import final_statements, last_boxed_at, response_problem, tail

MAX_CHOICES = 8
LETTERS = "ABCDEFGH"

_MARKUP = " \t\n*_`$\"'.,:;!?()[]{}"
_OPTION_WORD_RE = re.compile(r"\b(?:option|choice|candidate|letter)\s+\(?([a-h])\b\)?", re.IGNORECASE)
_PARENTHESISED_RE = re.compile(r"\(([a-hA-H])\)")
_CAPITAL_RE = re.compile(r"(?<![\w'’])([A-H])(?![\w'’])")


def check_options(num_choices: int, names: Sequence[str] = ()) -> None:
    """Refuse option sets the verifier cannot judge (``ValueError`` naming the problem)."""
    if not isinstance(num_choices, int) or not 2 <= num_choices <= MAX_CHOICES:
        raise ValueError(f"num_choices must be an int in [2, {MAX_CHOICES}], got {num_choices!r}")
    if names:
        if len(names) != num_choices:
            raise ValueError(f"names must give one name per option: {num_choices} options, got {len(names)} names")
        lowered = [str(n).strip().lower() for n in names]
        if not all(lowered) or len(set(lowered)) != len(lowered):
            raise ValueError(f"names must be non-empty and distinct (case-insensitive), got {list(names)}")


def verify_choice(response: str, gold: str, num_choices: int, names: Sequence[str] = ()) -> Verdict:
    """Score 1.0 if ``response`` commits to the option lettered ``gold`` (see the module docstring), else 0.0."""
    check_options(num_choices, names)
    letters = LETTERS[:num_choices]
    gold_letter = str(gold).strip().upper()
    if len(gold_letter) != 1 or gold_letter not in letters:
        raise ValueError(f"gold must be one of the letters {list(letters)}, got {gold!r}")
    problem = response_problem(response)
    if problem is not None:
        return _verdict(None, gold_letter, None, problem)
    picked = _just_a_choice(response, letters, names)
    if picked is not None:
        return _verdict(picked, gold_letter, "whole_response")
    for source, span in _marked_spans(response):
        found = _options_in(span, letters, names, capitals=True)
        if len(found) > 1:
            return _verdict(None, gold_letter, source, "ambiguous")
        if found:
            return _verdict(found.pop(), gold_letter, source)
    for line in reversed(tail(response).splitlines()):
        found = _options_in(line, letters, names, capitals=False)
        if len(found) > 1:
            return _verdict(None, gold_letter, "last_line", "ambiguous")
        if found:
            return _verdict(found.pop(), gold_letter, "last_line")
    return _verdict(None, gold_letter, None, "no option named")


def _verdict(answer: str | None, gold: str, source: str | None, reason: str | None = None) -> Verdict:
    details = {"answer": answer, "gold": gold, "source": source}
    if reason is not None:
        details["reason"] = reason
    correct = answer == gold
    return Verdict(score=1.0 if correct else 0.0, correct=correct, details=details)


def _just_a_choice(text: str, letters: str, names: Sequence[str]) -> str | None:
    """The option ``text`` is, markup aside: a lone letter (any case) or a name."""
    core = text.strip(_MARKUP)
    boxed = re.fullmatch(r"\\(?:boxed|fbox)\s*\{(.*)\}", core, re.S)
    if boxed:
        core = boxed.group(1).strip(_MARKUP)
    if len(core) == 1 and core.upper() in letters:
        return core.upper()
    for letter, name in zip(letters, names):
        if core.lower() == str(name).strip().lower():
            return letter
    return None


def _marked_spans(text: str) -> list[tuple[str, str]]:
    """``(source, span)`` of the last box and the last statement, the one starting later first."""
    marked = []
    boxed = last_boxed_at(text)
    if boxed is not None:
        marked.append((boxed[0], "boxed", boxed[1]))
    statements = final_statements(text)
    if statements:
        start, span = statements[0]
        if "\\boxed" not in span and "\\fbox" not in span:     # "the answer is \\boxed{B}" is the box
            marked.append((start, "statement", span))
    return [(source, span) for _, source, span in sorted(marked, reverse=True)]


def _options_in(span: str, letters: str, names: Sequence[str], *, capitals: bool) -> set[str]:
    """Letters of the options ``span`` names (see the module docstring)."""
    lone = _just_a_choice(span, letters, names)
    if lone is not None:
        return {lone}
    found = {m.group(1).upper() for m in _OPTION_WORD_RE.finditer(span)}
    found |= {m.group(1).upper() for m in _PARENTHESISED_RE.finditer(span)}
    if capitals:
        found |= {m.group(1) for m in _CAPITAL_RE.finditer(span)}
    for letter, name in zip(letters, names):
        if re.search(rf"(?<!\w){re.escape(str(name).strip())}(?!\w)", span, re.IGNORECASE):
            found.add(letter)
    return {letter for letter in found if letter in letters}


__all__ = ["LETTERS", "MAX_CHOICES", "check_options", "verify_choice"]
