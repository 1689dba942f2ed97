"""Numeric / symbolic answer verification for math word problems (GSM8K, MATH-style).

``verify_answer(response, gold)`` extracts the model's final answer and judges it against the
gold answer.

Extraction: the LAST final answer the response states wins, whatever marked it. The markers are
``\\boxed{...}`` / ``\\fbox{...}`` (nested braces; ``\\boxed 5`` too), ``#### x`` (GSM8K style) and
"final answer: x" / "the answer is x" / "answer: x" (case-insensitive); of the last of each kind,
the one that starts latest in the text is taken, so a corrected answer beats the one it corrects
(``"... \\boxed{3}. Wait, recheck: 4. The answer is 4"`` -> 4, and ``"The answer is 3 ...
\\boxed{4}"`` -> 4). A statement counts only when it holds a number or LaTeX, and not a box
(``"The answer is \\boxed{4}"`` is the box). Only without any marker is the last number in the
text taken (``\\frac{a}{b}`` with number arguments counts as one, and so does scientific notation:
``1.2 \\times 10^3``, ``1.2 \\cdot 10^{3}``, ``1.2 x 10^3`` and ``10^3``).

The answer judged is the speaker's own. In a debate a reply often reports its partners' answers,
so a clause that attributes an answer to another agent is not read, box included ("Agent 1 said
the answer is 57; I disagree, mine is 10" -> 10; "The final answer is 10. The previous answer is
57." -> 10; "the other agent claims 57" alone has no answer of its own and scores 0, like any
reply without an answer). An agent that agrees and states the answer answers it ("I agree with
Agent 1: the answer is 57", "I agree with Agent 1's answer of 57" -> 57). The cues and the clause
they cover are those of :func:`verifiers._text.own_text`.

Boxes are found anywhere (``str.rfind``); the other rules search only the last
:data:`verifiers._text.TAIL_CHARS` characters, and a ``####`` line must start like a number
(markdown ``#### Step 1`` headings are skipped). The extracted text is normalised: LaTeX
wrappers (``$``, ``\\(``, ``\\text{}``, ``\\left``), ``\\dfrac``/``\\tfrac``, thousands commas,
currency signs, ``%``, degree signs, a leading ``x =``, trailing punctuation, and unit or
explanation words after a number (``5 dollars``, ``12 cm``, ``72 because ...``) are removed.

Equivalence: plain numbers, simple fractions, mixed numbers and scientific notation (``12``,
``-3``, ``1,234``, ``0.75``, ``3/4``, ``\\frac{3}{4}``, ``1 1/2``, ``1\\frac{1}{2}``, ``1.2e3``,
``1.2 \\times 10^3``) are
compared by exact value as :class:`fractions.Fraction` without touching sympy (microseconds).
Equal means exactly equal: ``1.2e3`` = ``1200`` and ``0.5`` = ``1/2``, but a rounded decimal is
not the fraction it rounds, either way round: ``0.33`` != ``1/3`` (gold ``1/3``, answer ``0.33``:
wrong; gold ``0.33``, answer ``1/3``: wrong, the task asked for the rounded value).
Anything else goes to math-verify (``parse``/``verify``, sympy underneath) after a complexity
guard (length, huge or nested exponents, big factorials) so that inputs like ``10^10^10``
return score 0 instead of hanging, and under a time limit: math-verify's own (signal based)
timeout in the main thread, a killable child process (:mod:`verifiers._symbolic_worker`) in
any other thread.

Hedges and unevaluated answers score 0 (``details["reason"]`` says which): alternatives inside the
final answer (``3 or 8``, ``\\pm``, ``\\lor``), a stated answer followed by more values (``the
answer is 8, 5 or 3``), two final answers side by side with only punctuation or ``or``/``and``
between them (``\\boxed{3} or \\boxed{8}``, two ``####`` lines; a correction with words in between
stays valid), and, without any marker, a reply that ends in a bare list of numbers. Against a
numeric gold the answer must itself be a number: an expression (``5+3``, ``2^3``, ``\\sqrt{64}``,
``5!``) or a fraction not in lowest terms (``16/2``) is not evaluated for the policy. Against a
symbolic gold the answer may use only the operators the gold uses (``\\sqrt{12}`` for
``2\\sqrt{3}`` counts, ``\\sqrt{3}+\\sqrt{3}`` does not).

``details``: ``answer`` (canonical string of the extracted answer: ``"72"``, ``"0.75"``,
``"1/3"``, or the normalised LaTeX; ``None`` if nothing was found), ``gold`` (same for the
gold), ``source`` (which rule extracted it) and, when the answer could not be judged,
``reason``.
"""
from __future__ import annotations

import functools
import math
import re
import threading
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction

from verifiers import Verdict
from verifiers._symbolic_worker import SYMBOLIC_TIMEOUT_S, SymbolicWorker, symbolic_equal
from verifiers._text import _box_content, final_statements, last_boxed_at, own_text, response_problem, tail

MAX_SYMBOLIC_CHARS = 300
"""Answers longer than this (after normalisation) are not handed to sympy."""

MAX_EXPONENT_DIGITS = 3
"""Exponents/root indices with more digits than this (>= 1000; >= 100 when the answer has
variables, whose expansion is costly) are not handed to sympy."""

MAX_NUMBER_DIGITS = 400
"""Number literals with more digits than this are treated as unparseable."""

_NUMBER = r"(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d{1,3}(?!\d))?"
_UNITS = (
    r"dollars?|cents?|usd|euros?|pounds?|percent|cm|mm|km|m|kg|g|mg|lbs?|oz|ft|feet|foot|"
    r"inch(?:es)?|in|miles?|mi|mph|hours?|hrs?|h|minutes?|mins?|seconds?|secs?|s|ml|l|liters?|"
    r"litres?|meters?|metres?|days?|weeks?|years?|units?|degrees?"
)
_SIGNED_NUMBER = rf"[-+]?\s*(?:{_NUMBER})"
_FAST_NUMBER_RE = re.compile(
    rf"(?P<sign>[-+]?)\s*"
    rf"(?:(?P<whole>\d+)(?:\s+(?=\d+\s*/)|\s*(?=\\frac)))?"
    rf"(?:(?P<num>{_NUMBER})(?:\s*/\s*(?P<den>{_NUMBER}))?"
    rf"|\\frac\s*\{{\s*(?P<fnum>{_SIGNED_NUMBER})\s*\}}\s*\{{\s*(?P<fden>{_SIGNED_NUMBER})\s*\}})"
    rf"(?:\s*(?:{_UNITS})(?:\s*\^\s*\{{?[23]\}}?)?(?![A-Za-z])\.?)?"
    rf"(?:\s+[A-Za-z]{{2,}}\b[^0-9=^\\]*)?"
)
_TIMES = r"(?:\\times|\\cdot|\u00d7|x|\*)"
_POWER_OF_TEN = r"10\s*\^\s*(?:\{\s*(?P<braced>[-+]?\d{1,3})\s*\}|(?P<bare>[-+]?\d{1,3})(?!\d))"
_SCIENTIFIC_RE = re.compile(rf"(?:(?P<mantissa>{_NUMBER})\s*{_TIMES}\s*)?{_POWER_OF_TEN}")   # 1.2 \times 10^{3}
_LAST_NUMBER_RE = re.compile(
    rf"(?<![\w.])-?(?:(?:{_NUMBER})\s*{_TIMES}\s*)?10\s*\^\s*(?:\{{\s*[-+]?\d{{1,3}}\s*\}}|[-+]?\d{{1,3}}(?!\d))"
    rf"|(?<![\w.])-?\\[dt]?frac\s*\{{\s*-?(?:{_NUMBER})\s*\}}\s*\{{\s*(?:{_NUMBER})\s*\}}"
    rf"|(?<![\w.])-?(?:\d+[ \t]+(?=\d+/\d))?(?:{_NUMBER})(?:\s*/\s*(?:{_NUMBER}))?(?![\d])"
)
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_CLAUSE_END_RE = re.compile(r",\s|\s(?:and|because|since|as|so)\s")
_LAST_NUMBER_WINDOW = 2 * MAX_NUMBER_DIGITS
_EXPONENT_RE = re.compile(r"(?<=\d)[eE]([-+]?\d+)")
_PLAIN_INTEGER_RE = re.compile(r"-?\d{1,30}")
_GSM8K_MARK = "####"
_GSM8K_ANSWER_RE = re.compile(r"####[ \t]*([-+$\\\d.(][^\n]*)")

_TEXT_WRAPPER_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}"
)
_CURRENCY_RE = re.compile(r"^(?:usd|us\$|rs\.?|inr|eur)\s*", re.IGNORECASE)
_REPLACEMENTS = (
    ("{,}", ","), ("\u2212", "-"), ("\u2013", "-"), ("**", ""), ("\\$", ""), ("$", ""), ("\\(", ""),
    ("\\)", ""), ("\\[", ""), ("\\]", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"),
    ("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", " "), ("\\ ", " "),
    ("~", " "), ("^{\\circ}", ""), ("^\\circ", ""), ("\u00b0", ""), ("\\%", ""), ("%", ""),
    ("\u20ac", ""), ("\u00a3", ""), ("\u00a5", ""), ("\u20b9", ""), ("\\displaystyle", ""),
)

# Complexity guard for the symbolic path: nested exponents, long exponents, big factorials.
_EXPONENT_OPERAND_RE = re.compile(r"(?:\^|\*\*)\s*(\{[^{}]*\{|\{[^{}]*\}|\(?[\w.]*)")
_NESTED_EXPONENT_RE = re.compile(r"(?:\^|\*\*)[^+\-*/=,\s}]*(?:\^|\*\*)")
_BIG_FACTORIAL_RE = re.compile(r"\d{4,}\s*!|\}\s*!")
_POWER_RE = re.compile(r"\^|\*\*")
_ROOT_INDEX_RE = re.compile(r"\\sqrt\s*\[([^\]]*)\]")


def verify_answer(response: str, gold: str) -> Verdict:
    """Score 1.0 if the final answer in ``response`` equals ``gold`` numerically/symbolically, else 0.0."""
    gold_answer = _parse_gold(gold)
    problem = response_problem(response)
    if problem is not None:
        return _unjudged(problem, None, gold_answer, source=None)
    own = own_text(response)
    extracted = _marked_or_last_number(own)
    if extracted is None:
        attributed_only = own != response and _marked_or_last_number(response) is not None
        reason = ("no answer of its own: the response only states answers it attributes to other agents"
                  if attributed_only else "no answer found in response")
        return _unjudged(reason, None, gold_answer, source=None)
    raw, source = extracted
    hedge = hedged(own, raw, source)
    if hedge is not None:
        return _unjudged(hedge, raw[:50], gold_answer, source=source)
    answer = _parse_answer(raw)
    if answer.problem is not None:
        return _unjudged(answer.problem, answer.canonical, gold_answer, source=source)
    unevaluated = unevaluated_expression(answer, gold_answer)
    if unevaluated is not None:
        return _unjudged(unevaluated, answer.canonical, gold_answer, source=source)
    correct = _equivalent(answer, gold_answer)
    if correct is None:
        return _unjudged("could not compare answer with gold symbolically", answer.canonical,
                         gold_answer, source=source)
    details = {"answer": answer.canonical, "gold": gold_answer.canonical, "source": source}
    return Verdict(score=1.0 if correct else 0.0, correct=correct, details=details)


def extract_answer(text: str) -> tuple[str, str] | None:
    """The raw final-answer text and the rule that found it (``boxed``, ``####``, ``statement``, ``last_number``).

    The speaker's own answer: clauses that attribute an answer to another agent are not read
    (:func:`verifiers._text.own_text`). The marked answer that starts latest wins (see the module
    docstring); the last number only without one.
    """
    return _marked_or_last_number(own_text(text))


def _marked_or_last_number(text: str) -> tuple[str, str] | None:
    """:func:`extract_answer` on text whose attributed clauses are already blanked (or a gold solution)."""
    marked: list[tuple[int, str, str]] = []      # (where it starts, raw answer, rule)
    boxed = last_boxed_at(text)
    if boxed is not None:
        marked.append((boxed[0], boxed[1], "boxed"))
    offset = max(0, len(text) - len(tail(text)))
    gsm8k = list(_GSM8K_ANSWER_RE.finditer(tail(text)))
    if gsm8k:
        marked.append((offset + gsm8k[-1].start(), gsm8k[-1].group(1)[:200], "####"))
    for start, span in final_statements(text):
        cut = _first_clause(span)
        if cut and (_LAST_NUMBER_RE.search(cut) or "\\" in cut) and not _BOX_RE.search(cut):
            marked.append((start, cut, "statement"))
            break
    if marked:
        _, raw, rule = max(marked, key=lambda found: found[0])
        return raw, rule
    last_digit = max(text.rfind(digit) for digit in "0123456789")
    if last_digit < 0:
        return None
    window = text[max(0, last_digit + 1 - _LAST_NUMBER_WINDOW):last_digit + 10]  # + a closing "}"
    numbers = _LAST_NUMBER_RE.findall(window)
    return (numbers[-1], "last_number") if numbers else None


_ALTERNATIVE_RE = re.compile(r"(?<![A-Za-z])(?:or|either)(?![A-Za-z])|\\(?:lor|vee|pm|mp)(?![A-Za-z])|\+/-|\u00b1",
                             re.IGNORECASE)
_MORE_ANSWERS_RE = re.compile(r"\s*(?:[,;/]|(?<![A-Za-z])or(?![A-Za-z]))\s*(?:(?:or|maybe|perhaps)\s+)?"
                              r"[-+$]?\s*(?:\d|\.\d|\\[dt]?frac)", re.IGNORECASE)
_CONNECTOR_GAP_RE = re.compile(r"[\s,;/.:$()\\-]*(?:(?:or|and|either|maybe|perhaps|possibly|otherwise)"
                               r"(?![A-Za-z])[\s,;/.:$()\\-]*)*", re.IGNORECASE)
_LIST_LINE_CHARS = 200
_NUMBER_LIST_RE = re.compile(
    rf"(?:[A-Za-z][A-Za-z ]{{0,30}}:\s*)?[-+$]?\s*{_NUMBER}(?:\s*(?:[,;/]|\s|or|and)\s*[-+$]?\s*{_NUMBER})+\s*\.?",
    re.IGNORECASE,
)
# Operators an answer may use only where the gold uses them: an answer is a value, not a sum to evaluate.
_OPERATOR_RES = {
    "+": re.compile(r"\+"), "-": re.compile(r"(?<=[\w})\]])\s*-"), "/": re.compile(r"/|\\frac|\\div|\u00f7"),
    "^": re.compile(r"\^"), "!": re.compile(r"!"), "sqrt": re.compile(r"\\sqrt"),
    "sum": re.compile(r"\\(?:sum|prod|int|lim)(?![A-Za-z])"),
}


def hedged(text: str, raw: str, source: str) -> str | None:
    """Why the final answer of ``text`` offers several answers at once, or ``None``.

    A hedge: alternatives inside the answer (``3 or 8``, ``\\pm``), a stated answer followed by more
    (``the answer is 8, 5 or 3``), two final answers side by side (``\\boxed{3} or \\boxed{8}``,
    two ``####`` lines), or, without any marker, a bare list of numbers. A corrected answer is not
    a hedge: words other than ``or``/``and`` stand between it and the answer it corrects.
    """
    if _ALTERNATIVE_RE.search(raw):
        return f"the answer offers alternatives ({raw[:40]!r}): one final answer is judged"
    if source == "statement":
        for _, span in final_statements(text)[:1]:
            rest = span[len(_first_clause(span)):] if span.startswith(_first_clause(span)) else ""
            if _MORE_ANSWERS_RE.match(rest):
                return f"the stated answer lists several values ({span[:40]!r}): one final answer is judged"
    if source == "last_number":
        last_line = tail(text).strip().rpartition("\n")[2].strip()
        if len(last_line) <= _LIST_LINE_CHARS and _NUMBER_LIST_RE.fullmatch(last_line):
            return f"the reply ends in a list of numbers ({last_line[:40]!r}), not an answer"
        return None
    markers = _final_markers(text)
    if len(markers) >= 2:
        (_, prev_end, prev_value), (last_start, _, last_value) = markers[-2], markers[-1]
        gap = text[prev_end:last_start]
        if normalize_answer(prev_value) != normalize_answer(last_value) and _CONNECTOR_GAP_RE.fullmatch(gap):
            return "two final answers side by side: one final answer is judged"
    return None


def _final_markers(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, answer)`` of every box and ``####`` answer, in order of position."""
    found = []
    offset = max(0, len(text) - len(tail(text)))
    for match in _BOX_RE.finditer(text, offset):
        content = _box_content(text, match.start())
        if content:
            close = text.find(content, match.end()) + len(content)
            found.append((match.start(), close + (1 if text[close:close + 1] == "}" else 0), content))
    for match in _GSM8K_ANSWER_RE.finditer(tail(text)):
        found.append((offset + match.start(), offset + match.end(), match.group(1)))
    return sorted(found)


def unevaluated_expression(answer: _Answer, gold: _Answer) -> str | None:
    """Why ``answer`` is an expression for the verifier to evaluate rather than a value, or ``None``.

    Against a numeric gold the answer must be a number (integer, decimal, scientific, a fraction in
    lowest terms, a mixed number): ``5+3``, ``2^3``, ``\\sqrt{64}`` or ``16/2`` for 8 do not count.
    Against a symbolic gold the answer may use only the operators the gold uses.
    """
    if gold.value is not None:
        if answer.value is None:
            return f"answer {answer.canonical!r} is an expression, not a number: the gold is a number"
        if answer.unreduced:
            return f"answer is a fraction not in lowest terms ({answer.canonical}), an expression to evaluate"
        return None
    if answer.value is not None or answer.canonical is None or gold.canonical is None:
        return None
    extra = [op for op, pattern in _OPERATOR_RES.items()
             if pattern.search(answer.canonical) and not pattern.search(gold.canonical)]
    if extra:
        return f"answer uses operators the gold does not ({', '.join(extra)}): an expression to evaluate"
    return None


def normalize_answer(raw: str) -> str:
    """Strip LaTeX wrappers, currency, percent/degree signs, ``x =`` and trailing punctuation."""
    text = raw.strip()
    for _ in range(3):
        text = _TEXT_WRAPPER_RE.sub(r" \1 ", text)
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    text = _after_last_equals(text)
    text = " ".join(text.split()).rstrip(" .,;:?").lstrip(" ,;:?")
    while text.startswith("{") and text.endswith("}") and _balanced(text[1:-1]):
        text = text[1:-1].strip()
    return _CURRENCY_RE.sub("", text).strip()


@dataclass(frozen=True)
class _Answer:
    """A normalised answer: its canonical text, its exact value when numeric, or why it is unusable."""

    canonical: str | None
    value: Fraction | None = None
    problem: str | None = None
    unreduced: bool = False      # written as a fraction whose terms share a factor (16/2, 2/4)


def _parse_answer(raw: str) -> _Answer:
    """Normalise ``raw``; numeric fast path first, else a guarded symbolic form."""
    if _PLAIN_INTEGER_RE.fullmatch(raw):
        value = int(raw)
        return _Answer(str(value), value=Fraction(value))
    text = normalize_answer(raw)
    if not text:
        return _Answer(None, problem=f"extracted answer {raw[:50]!r} is empty after normalisation")
    match = _FAST_NUMBER_RE.fullmatch(text) or _FAST_NUMBER_RE.fullmatch(_SCIENTIFIC_RE.sub(_e_notation, text))
    if match:
        return _numeric_answer(match, match.string)
    if len(text) > MAX_SYMBOLIC_CHARS or _too_complex(text):
        return _Answer(text[:50], problem="answer too long or too complex to evaluate safely")
    return _Answer(text)


def _numeric_answer(match: re.Match[str], text: str) -> _Answer:
    """Exact value of a fast-path number / fraction match."""
    numerator = match.group("num") or match.group("fnum")
    denominator = match.group("den") or match.group("fden")
    if len(text) > MAX_NUMBER_DIGITS:
        return _Answer(text[:50], problem=f"number longer than {MAX_NUMBER_DIGITS} digits")
    if any(abs(int(exponent)) > MAX_NUMBER_DIGITS for exponent in _EXPONENT_RE.findall(text)):
        return _Answer(text[:50], problem=f"exponent beyond 10^{MAX_NUMBER_DIGITS}")
    value = _to_fraction(numerator)
    unreduced = False
    if denominator is not None:
        divisor = _to_fraction(denominator)
        if divisor == 0:
            return _Answer(text[:50], problem="division by zero in answer")
        unreduced = (value.denominator != 1 or divisor.denominator != 1 or divisor == 1
                     or math.gcd(value.numerator, divisor.numerator) != 1)
        value /= divisor
    if match.group("whole"):
        if denominator is None:
            return _Answer(text[:50], problem="mixed number without a fraction")
        value += int(match.group("whole"))
    if match.group("sign") == "-":
        value = -value
    return _Answer(canonical_number(value), value=value, unreduced=unreduced)


def _e_notation(match: re.Match[str]) -> str:
    """``1.2 \\times 10^{3}`` -> ``1.2e3``, ``10^3`` -> ``1e3``."""
    return f"{match['mantissa'] or '1'}e{match['braced'] or match['bare']}"


def _to_fraction(literal: str) -> Fraction:
    """Exact value of a number literal with optional sign, spaces and thousands commas."""
    return Fraction(literal.replace(",", "").replace(" ", ""))


def canonical_number(value: Fraction) -> str:
    """``72``, ``0.75``, ``-2.5`` for terminating values, ``p/q`` otherwise."""
    if value.denominator == 1:
        return str(value.numerator)
    denominator = value.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    if denominator != 1:
        return f"{value.numerator}/{value.denominator}"
    with localcontext() as context:
        context.prec = 4 * len(str(value.denominator)) + len(str(abs(value.numerator))) + 5
        exact = Decimal(value.numerator) / Decimal(value.denominator)
    return format(exact.normalize(), "f")


def _parse_gold(gold: str) -> _Answer:
    """The gold answer (a bare answer or a full GSM8K solution with ``#### x``), validated."""
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError(f"gold must be a non-empty string such as '72' or '\\frac{{3}}{{4}}', got {gold!r}")
    return _parse_gold_text(gold)


@functools.lru_cache(maxsize=4096)
def _parse_gold_text(gold: str) -> _Answer:
    """Cached parse of a validated gold string."""
    raw = gold
    if _GSM8K_MARK in gold or "\\boxed" in gold or "\\fbox" in gold:
        extracted = _marked_or_last_number(gold)
        raw = extracted[0] if extracted else gold
    answer = _parse_answer(raw)
    if answer.problem is not None:
        raise ValueError(f"gold answer {gold[:80]!r} cannot be used: {answer.problem}")
    return answer


def _equivalent(answer: _Answer, gold: _Answer) -> bool | None:
    """Whether two parsed answers are equal; ``None`` if the symbolic check failed."""
    if answer.value is not None and gold.value is not None:
        return answer.value == gold.value        # exact: 1.2e3 == 1200, 0.33 != 1/3
    if answer.canonical == gold.canonical:
        return True
    if threading.current_thread() is threading.main_thread():
        return symbolic_equal(gold.canonical, answer.canonical)
    return _symbolic_worker().compare(gold.canonical, answer.canonical)


def _too_complex(text: str) -> bool:
    """Whether evaluating ``text`` could blow up (nested/huge exponents, big factorials)."""
    if _NESTED_EXPONENT_RE.search(text) or _BIG_FACTORIAL_RE.search(text):
        return True
    has_variables = re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", text)) is not None
    max_digits = MAX_EXPONENT_DIGITS - 1 if has_variables else MAX_EXPONENT_DIGITS
    for operand in _EXPONENT_OPERAND_RE.findall(text) + _ROOT_INDEX_RE.findall(text):
        if operand.count("{") > 1 or len(re.sub(r"\D", "", operand)) > max_digits:
            return True
    return any(_powered_group_has_power(text, match.start()) for match in _POWER_RE.finditer(text))


def _powered_group_has_power(text: str, power_at: int) -> bool:
    """Whether the base of the power at ``power_at`` is a bracketed group containing a power."""
    end = power_at - 1
    while end >= 0 and text[end] == " ":
        end -= 1
    if end < 0 or text[end] not in ")}]":
        return False
    depth = 0
    for start in range(end, -1, -1):
        depth += text[start] in ")}]"
        depth -= text[start] in "({["
        if depth == 0:
            group = text[start:end + 1]
            return "^" in group or "**" in group
    return True


@functools.lru_cache(maxsize=1)
def _symbolic_worker() -> SymbolicWorker:
    """The shared child process for symbolic checks requested outside the main thread."""
    return SymbolicWorker(timeout_s=3 * SYMBOLIC_TIMEOUT_S + 1)


def _first_clause(span: str) -> str:
    """``span`` up to the first ``, `` or joining word (``and``, ``because``, ``since``, ``as``, ``so``)."""
    end = _CLAUSE_END_RE.search(span)
    return (span[:end.start()] if end else span).strip()


def _after_last_equals(text: str) -> str:
    """The right-hand side of the last top-level ``=`` (``x = 5`` -> ``5``), else ``text``."""
    depth = 0
    cut = -1
    for index, char in enumerate(text):
        if char in "{([":
            depth += 1
        elif char in "})]":
            depth -= 1
        elif char == "=" and depth == 0 and text[index - 1:index] not in ("<", ">", "!", "=") \
                and text[index + 1:index + 2] != "=":
            cut = index
    rest = text[cut + 1:].strip()
    return rest if cut >= 0 and rest else text


def _balanced(text: str) -> bool:
    """Whether braces in ``text`` are balanced (so outer braces can be dropped)."""
    depth = 0
    for char in text:
        depth += char == "{"
        depth -= char == "}"
        if depth < 0:
            return False
    return depth == 0


def _unjudged(reason: str, answer: str | None, gold: _Answer, source: str | None) -> Verdict:
    """Score-0 verdict for an answer that could not be extracted or compared."""
    details = {"answer": answer, "gold": gold.canonical, "source": source, "reason": reason}
    return Verdict(score=0.0, correct=False, details=details)


__all__ = ["canonical_number", "extract_answer", "hedged", "normalize_answer", "symbolic_equal",
           "unevaluated_expression", "verify_answer"]
