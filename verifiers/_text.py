"""Text helpers shared by the answer verifiers: final-answer spans, boxes, the speaker's own words, bad-input checks."""
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


# -- the speaker's own words: answers attributed to other agents are not the speaker's answer
_OTHER_AGENTS = r"(?:agents?[\s_#]*\d+|other\s+(?:agent|model|participant|debater|solver)s?|(?:partner|teammate)s?)"
_AGENT_VERBS = (r"(?:said|says?|answer(?:ed|s)?|claim(?:ed|s)?|think(?:s)?|thought|believe[sd]?|suggest(?:ed|s)?"
                r"|propose[sd]?|state[sd]?|conclude[sd]?|argue[sd]?|wr[io]tes?|insist(?:ed|s)?|mention(?:ed|s)?"
                r"|guess(?:ed|es)?|report(?:ed|s)?|g[oe]t|gets|gave|gives?|f(?:ou|i)nds?|found|comput(?:ed|es?)"
                r"|calculat(?:ed|es?)|obtain(?:ed|s)?|arrived\s+at|c[oa]mes?\s+up\s+with|went\s+with|goes\s+with"
                r"|cho(?:se|oses?)|pick(?:ed|s)?|label(?:l?ed|s)?)")
# "you" and "they" also appear in word problems ("if you think about it", "they get 8"): verbs of saying only
_SPEECH_VERBS = r"(?:said|says?|answered|claimed|thought|believed|suggested|proposed|stated|concluded|argued|wrote)"
_ANSWER_NOUNS = (r"(?:answers?|solutions?|responses?|results?|reasoning|calculations?|claims?|numbers?|values?"
                 r"|conclusions?|labels?|choices?|guess(?:es)?)")
_THEIR_NOUNS = r"(?:answers?|solutions?|responses?|conclusions?|labels?|guess(?:es)?)"
_ADVERB = r"(?:(?:both|all|also|previously|initially|originally|earlier|first|already|still|just|then|now)\s+)?"
_DETERMINER = r"(?:(?:the|my|our)\s+)?"
# Each cue starts at one of _CUE_WORDS (found with str.find: a regex scan of every reply costs too much).
_CUE_WORDS = ("agent", "other", "partner", "teammate", "you", "they", "their", "previous", "earlier", "initial",
              "original", "according")
_CUE_RE = re.compile(
    # forward: the attributed answer follows the cue ("Agent 1 said 57", "their answer is 57"). Not "your
    # answer": the debate prompt calls the speaker's own answer that ("give your updated answer"), and so do replies
    rf"(?P<forward>{_OTHER_AGENTS}\s+{_ADVERB}{_AGENT_VERBS}\b"
    rf"|(?:you|they)\s+{_ADVERB}{_SPEECH_VERBS}\b"
    rf"|{_OTHER_AGENTS}(?:'s|s'|\u2019s|'|\u2019)\s+"
    rf"(?:(?:final|previous|initial|original|earlier|updated|last|own|proposed|stated)\s+)?{_ANSWER_NOUNS}\b"
    rf"|their\s+(?:(?:final|previous|initial|original|earlier|updated|last|own)\s+)?{_THEIR_NOUNS}\b"
    r"|(?:previous|earlier|initial|original)\s+(?:answers?|solutions?|responses?|results?|labels?)\b)"
    # backward or forward: "57, according to Agent 1" / "according to Agent 1, 57"
    rf"|(?P<either>according\s+to\s+(?:{_DETERMINER}{_OTHER_AGENTS}|you|them)\b)",
    re.IGNORECASE,
)
# "57, as Agent 1 said", "57 is what you said", "57, given by Agent 1": the answer before the cue is theirs too
_LEAD_BEFORE_RE = re.compile(rf"\b(?:as|like|what|(?:given|proposed|suggested|claimed|stated)\s+by)\s+{_DETERMINER}$",
                             re.IGNORECASE)
_AGENT_NAME_RE = re.compile(r"agents?[\s_#]*\d+\b", re.IGNORECASE)
_AGENT_MENTION_RE = re.compile(rf"(?:{_OTHER_AGENTS}|you|they)\b", re.IGNORECASE)
# a line that quotes another agent, as the debate prompt labels them ("Agent 1: ...")
_QUOTE_PREFIX_RE = re.compile(r"[ \t>*_#-]*")
_QUOTE_LABEL_RE = re.compile(r"agents?[\s_#]*\d+(?:\s*\([^)\n]{0,60}\))?[*_ \t]*:", re.IGNORECASE)
_SENTENCE_BREAK = r"[.!?](?!\d)|[;\n]"
_CONTRAST = r"(?i:\b(?:but|however|whereas|while|although|though|yet|instead|nevertheless|nonetheless)\b)"
_FIRST_PERSON = r"\b(?:I|[Mm]y|[Mm]ine|[Mm]e)\b"
_CLAUSE_END_RE = re.compile(rf"{_SENTENCE_BREAK}|{_CONTRAST}|{_FIRST_PERSON}")
_CLAUSE_START_RE = re.compile(rf"{_SENTENCE_BREAK}|:|,\s|{_CONTRAST}|{_FIRST_PERSON}")
_SENTENCE_END_BREAK_RE = re.compile(_SENTENCE_BREAK)
_ENDORSEMENT_RE = re.compile(
    r"\b(?:I|[Ww]e)\s+(?:(?:also|fully|completely|totally|now|do|would|strongly|still|will|therefore|thus|so)\s+){0,2}"
    r"(?i:agree|concur|accept|adopt|stand\s+by|stick\s+with|go\s+with|side\s+with|keep)\b(?P<rest>[^.;!?\n]{0,60})"
    r"|(?i:\b(?:which|that|this|it)(?:'s|\u2019s|\s+is|\s+was|\s+remains)\s+(?:still\s+|indeed\s+|also\s+)?(?:correct|right)\b)"
    r"|(?i:\b(?:agents?[\s_#]*(?P<right>\d+)|the\s+other\s+agent|my\s+partner|you|they)\s+(?:is|are|was|were)\s+"
    r"(?:(?:absolutely|indeed|completely|quite)\s+)?(?:correct|right)\b)",
)
_RESERVATION_RE = re.compile(r"(?i:\b(?:but|not|except|however|although|only)\b)")
_NAMED_AGENT_RE = re.compile(r"(?i:agents?[\s_#]*(\d+))")


def own_text(text: str) -> str:
    """``text`` with the answers it attributes to other agents blanked out (spaces; same length and lines).

    A debate reply often reports its partners' answers ("Agent 1 said the answer is 57; I disagree,
    mine is 10"); the verifiers judge the speaker's own answer, so an attributed clause is not read.

    * Cues: another agent (``Agent N``, "the other agent(s)", "my partner", "teammate") with a verb
      of saying or finding ("said", "claims", "thinks", "got", "calculated"...); "you" or "they"
      with a verb of saying ("you said", "they claimed"); "Agent N's answer", "their solution";
      "the previous / earlier / initial / original answer" (also "your previous answer": the
      debate prompt calls the speaker's own answers "your", so "your answer" alone is not a cue);
      "according to Agent N"; a line that starts like the debate prompt's quotes (``Agent N:``,
      ``Agent N (verifier score 1):``).
    * A cue blanks the clause it opens, to the end of the sentence (``.``, ``!``, ``?``, ``;``, a
      line break), a contrast word (``but``, ``however``, ``whereas``, ``while``...) or the
      speaker's own ``I``/``my``/``mine``/``me``, whichever comes first; a quote line is blanked to
      its end (and the next line when the label stands alone). After an answer, "as Agent N said",
      "what you said", "according to Agent N" and "given by Agent N" blank the clause before them.
      Boxes inside a blanked clause are blanked with it.
    * Agents' names are blanked everywhere: the 1 of ``Agent 1`` is a name, not an answer.
    * An agent that agrees states the answer as its own: an attributed clause stays when its sentence
      or the next one endorses it without reservation ("I agree", "I agree with Agent 1" for Agent 1's
      clauses, "which is correct", "Agent 1 is right"), so "I agree with Agent 1's answer of 57"
      answers 57; "I agree with Agent 1: the answer is 57" has no cue at all.

    Only the last :data:`TAIL_CHARS` characters are searched for cues, as for the final answer.
    """
    spans = []
    cues, names = _attribution_cues(text, max(0, len(text) - TAIL_CHARS))
    for (cue_start, cue_end, kind), next_cue in zip(cues, cues[1:] + [None]):
        named = _NAMED_AGENT_RE.search(text, cue_start, cue_end)
        agent = named.group(1) if named else None
        if kind == "quote":
            spans.append((cue_start, _quote_end(text, cue_end), agent))
            continue
        limit = next_cue[0] if next_cue else len(text)
        clause_end = _CLAUSE_END_RE.search(text, cue_end, limit)
        begin, end = cue_start, clause_end.start() if clause_end else limit
        if kind == "either":
            before = _clause_start(text, cue_start)
            if text[before:cue_start].strip(" \t,"):
                begin, end = before, cue_end        # "57, according to Agent 1": the clause before
        spans.append((begin, end, agent))
    blanks = names + [(begin, end) for begin, end, agent in spans
                      if end > begin and not _endorsed(text, begin, end, agent)]
    if not blanks:
        return text
    pieces, at = [], 0
    for begin, end in sorted(blanks):
        begin = max(begin, at)
        if end > begin:
            pieces.append(text[at:begin])
            pieces.append(re.sub(r"[^\n]", " ", text[begin:end]))
            at = end
    pieces.append(text[at:])
    return "".join(pieces)


def _attribution_cues(text: str, start: int) -> tuple[list[tuple[int, int, str]], list[tuple[int, int]]]:
    """The attribution cues in ``text[start:]`` and the agents' names (``Agent 1``: a name, not a number).

    Cues are ``(start, end, kind)`` in order, kind ``forward``, ``either`` or ``quote``; names ``(start, end)``.
    """
    lowered = text.lower()
    if len(lowered) != len(text):               # a few characters lower-case to two: keep positions
        lowered = "".join(char.lower()[:1] or char for char in text)
    found = []
    for word in _CUE_WORDS:
        at = lowered.find(word, start)
        while at >= 0:
            if at == 0 or not lowered[at - 1].isalnum():
                found.append(at)
            at = lowered.find(word, at + 1)
    cues: list[tuple[int, int, str]] = []
    names = [name.span() for at in found if lowered.startswith("agent", at)
             if (name := _AGENT_NAME_RE.match(text, at)) is not None]
    for at in sorted(set(found)):
        if cues and at < cues[-1][1]:
            continue                            # inside the cue before ("other agent" then "agent")
        line_start = text.rfind("\n", 0, at) + 1
        quote = _QUOTE_LABEL_RE.match(text, at) if _QUOTE_PREFIX_RE.fullmatch(text, line_start, at) else None
        if quote is not None:
            cues.append((at, quote.end(), "quote"))
            continue
        cue = _CUE_RE.match(text, at)
        lead = _LEAD_BEFORE_RE.search(text, max(0, at - 20), at)
        mention = _AGENT_MENTION_RE.match(text, at) if lead is not None else None
        if mention is not None:                 # "as Agent 1 said", "given by Agent 1"
            cues.append((lead.start(), max(mention.end(), cue.end() if cue else 0), "either"))
        elif cue is not None:
            cues.append((at, cue.end(), cue.lastgroup))
    return cues, names


def _quote_end(text: str, after_label: int) -> int:
    """End of a quoted ``Agent N:`` line (and of the next line when the label stands alone)."""
    line_end = text.find("\n", after_label)
    if line_end < 0:
        return len(text)
    if text[after_label:line_end].strip():
        return line_end
    next_end = text.find("\n", line_end + 1)
    return len(text) if next_end < 0 else next_end


def _clause_start(text: str, cue_start: int) -> int:
    """Start of the clause before a post-positioned cue ("57, according to Agent 1")."""
    hi = cue_start
    while hi > 0 and text[hi - 1] in " \t,":
        hi -= 1
    lo = max(0, hi - 300)
    last = None
    for last in _CLAUSE_START_RE.finditer(text, lo, hi):
        pass
    return last.end() if last else lo


def _endorsed(text: str, begin: int, end: int, agent: str | None) -> bool:
    """Whether the sentence of ``text[begin:end]`` or the next one endorses it ("I agree", "which is correct")."""
    sentence_start = max(0, begin - 300)
    for sentence_end in _SENTENCE_END_BREAK_RE.finditer(text, sentence_start, begin):
        sentence_start = sentence_end.end()
    scope_end = end
    for _ in range(2):                          # to the end of this sentence, then of the next one
        found = _SENTENCE_END_BREAK_RE.search(text, scope_end)
        scope_end = found.end() if found else len(text)
    for endorsement in _ENDORSEMENT_RE.finditer(text, sentence_start, scope_end):
        rest = endorsement.group("rest") or ""
        if _RESERVATION_RE.search(rest):
            continue
        named = endorsement.group("right") or next(iter(_NAMED_AGENT_RE.findall(rest)), None)
        if named is None or agent is None or named == agent:
            return True
    return False


__all__ = ["TAIL_CHARS", "final_statement_spans", "final_statements", "last_boxed", "last_boxed_at", "own_text",
           "response_problem", "tail"]
