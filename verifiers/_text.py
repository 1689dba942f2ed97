"""Text helpers shared by the answer verifiers: final-answer spans, boxes, bad-input checks."""
from __future__ import annotations

import re

TAIL_CHARS = 2000
"""Regex-based extraction looks only at this many trailing characters of a response."""

MAX_BOX_CHARS = 1000
"""A ``\\boxed{...}`` whose content is longer than this is ignored (runaway generation)."""

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_MAX_BOX_ATTEMPTS = 20

_FINAL_STATEMENT_RE = re.compile(  # "final answer:", "the answer is", "label:" all end this way
    r"(?:answer|label)\s*(?:is\s*:?|:|=)\s*(?P<span>[^\n]{1,200})",
    re.IGNORECASE,
)
_SENTENCE_END_RE = re.compile(r"\.(?!\d)|[!?](?!\S)|;")


def response_problem(response: object) -> str | None:
    """Why a model response cannot be judged at all (not a string, empty), else ``None``."""
    if not isinstance(response, str):
        return f"response is not a string (got {type(response).__name__})"
    if not response.strip():
        return "empty response"
    return None


def tail(text: str) -> str:
    """The last :data:`TAIL_CHARS` characters of ``text`` (where final answers live)."""
    return text[-TAIL_CHARS:]


def last_boxed(text: str) -> str | None:
    """Content of the last closed, non-empty ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces).

    ``\\boxed 5`` (no braces) gives ``"5"``. Unclosed or over-long boxes are skipped in favour
    of an earlier one; ``None`` when there is no usable box.
    """
    found = last_boxed_at(text)
    return found[1] if found else None


def last_boxed_at(text: str) -> tuple[int, str] | None:
    """``(where its command starts, content)`` of the box :func:`last_boxed` returns, or ``None``."""
    end = len(text)
    for _ in range(_MAX_BOX_ATTEMPTS):
        start = max(text.rfind(command, 0, end) for command in _BOX_COMMANDS)
        if start < 0:
            return None
        content = _box_content(text, start)
        if content:
            return start, content
        end = start
    return None


def _box_content(text: str, start: int) -> str | None:
    """Content of the box command starting at ``start``, or ``None`` if unclosed/empty/too long."""
    pos = text.index("\\", start) + 1
    while pos < len(text) and text[pos].isalpha():
        pos += 1
    while pos < len(text) and text[pos] == " ":
        pos += 1
    if pos >= len(text):
        return None
    if text[pos] != "{":
        token = re.match(r"[^\s$}]+", text[pos:pos + MAX_BOX_CHARS])
        return token.group(0) if token else None
    depth = 0
    limit = min(len(text), pos + MAX_BOX_CHARS + 2)
    for index in range(pos, limit):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[pos + 1:index].strip() or None
    return None


def final_statement_spans(text: str) -> list[str]:
    """Spans after "the answer is", "final answer:", "answer:", "label:" ..., last one first.

    Each span runs to the end of its sentence (``.`` not inside a number, ``!``, ``?``, ``;``)
    or line, whichever comes first.
    """
    return [span for _, span in final_statements(text)]


def final_statements(text: str) -> list[tuple[int, str]]:
    """``(where the statement starts in text, span)`` for each of :func:`final_statement_spans`, last one first."""
    offset = max(0, len(text) - TAIL_CHARS)
    found = []
    for match in _FINAL_STATEMENT_RE.finditer(tail(text)):
        span = match.group("span")
        while inner := _FINAL_STATEMENT_RE.search(span):  # "Final Answer: The final answer is 3."
            span = inner.group("span")
        end = _SENTENCE_END_RE.search(span)
        found.append((offset + match.start(), (span[:end.start()] if end else span).strip()))
    found.reverse()
    return found


__all__ = ["TAIL_CHARS", "final_statement_spans", "final_statements", "last_boxed", "last_boxed_at", "response_problem",
           "tail"]
