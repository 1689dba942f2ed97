"""Joint reward for N agents writing one program: structure, syntax, tests and cooperation.

Roles. With N agents, agents ``0 .. N-2`` each write one helper function and the last agent
writes the task's entry-point function, which may call the helpers. Helper names
(:func:`helper_names`): agent 0 writes ``aux``; with N > 2 agent k (k >= 1) writes ``aux_k``
(``aux``, ``aux_1``, ``aux_2``, ...). N = 2 is CoMLRL's setting (one ``aux``, one entry point).

The joint program is: the task's code context (imports and helper definitions of the task prompt,
e.g. ``from typing import List``; see :func:`code_context`), then each agent's code in agent
order. From each agent only imports, assignments, classes and function definitions are kept, and
never a definition of a name that belongs to another role (agent 1 cannot replace ``aux``;
helpers cannot define the entry point); module-level calls, prints and asserts are dropped.
:func:`extract_code` takes the code from a model response: its markdown fences when it has any
(all fenced blocks, joined), else the whole response.

:func:`score_collaboration` gives one joint verdict, the same for every agent (CoMLRL's levels;
every weight is a field of :class:`CodingRewardConfig`):

| component | rule | max |
|---|---|---|
| structure | +0.4 when the helpers are defined and return a value (split evenly among helpers), +0.6 when the entry point is; *stop* if the entry point is missing or never returns a value | 1.0 |
| syntax | +0.5 when the joint program parses; *stop* otherwise | 0.5 |
| tests | +1.0 x fraction of the task's asserts passed (sandboxed, :func:`verifiers.sandbox.run_tests`) | 1.0 |
| cooperation | only if >= 1 assert passed and a helper is defined: +0.5 x fraction of helpers the entry point calls; then +1.0 if it is not a thin wrapper (its body is just ``return aux(...)`` or ``x = aux(...); return x``); -0.5 if it calls a helper and discards the result | 1.5 |

Maximum 4.0. The components, the checks behind them and the sandbox's per-assert results are in
``Verdict.details``. Programs that do not parse or lack the entry point are scored without running
anything. :func:`format_coding_feedback` turns a verdict into feedback lines for the next turn.

A task is a record with ``entry_point``, ``test`` (HumanEval ``check(candidate)`` or MBPP asserts)
and optionally ``context`` (code put in front of the joint program).
"""  # noqa: E501 (Markdown table rows cannot wrap)
from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from . import Verdict, _python_ast
from .code import DEFAULT_TIMEOUT_S, run_tests

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_KEPT_STATEMENTS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                    ast.Assign, ast.AnnAssign)


@dataclass(frozen=True)
class CodingRewardConfig:
    """Weights of the coding-collaboration reward (defaults: CoMLRL's, max 4.0)."""

    helpers_defined: float = 0.4
    entry_defined: float = 0.6
    syntax: float = 0.5
    tests: float = 1.0
    uses_helpers: float = 0.5
    not_wrapper: float = 1.0
    discarded_result_penalty: float = 0.5

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"CodingRewardConfig.{name} must be a number >= 0, got {value!r}")

    @property
    def maximum(self) -> float:
        """The best possible reward."""
        return (self.helpers_defined + self.entry_defined + self.syntax + self.tests
                + self.uses_helpers + self.not_wrapper)


def parse_python(code: str) -> ast.Module:
    """``ast.parse`` without the Syntax/DeprecationWarnings of model code leaking into our process (thread-safe)."""
    return _python_ast.parse(code, quiet=True)


def extract_code(response: str) -> str:
    """The code of a model response: its markdown code blocks joined; without fences, the text
    from its first line that starts like code (``def``, ``import``, ``class``, ...) when the whole
    text does not parse."""
    blocks = [body for lang, body in _FENCE.findall(response) if lang.lower() in ("", "python", "py", "python3")]
    if blocks:
        return "\n\n".join(b.strip("\n") for b in blocks)
    text = response.strip("\n")
    try:
        parse_python(text)
        return text
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        start = re.search(r"^(def |async def |class |import |from |@)", text, re.MULTILINE)
        return text[start.start():] if start else text


def helper_names(num_agents: int) -> list[str]:
    """Helper function names of agents ``0 .. N-2``: ``aux``, ``aux_1``, ``aux_2``, ..."""
    return ["aux" if k == 0 else f"aux_{k}" for k in range(num_agents - 1)]


def code_context(prompt_code: str, entry_point: str) -> str:
    """The task prompt's imports and helper definitions (everything but the entry point's stub)."""
    try:
        tree = parse_python(prompt_code)
    except SyntaxError:
        return "\n".join(line for line in prompt_code.splitlines() if line.startswith(("import ", "from ")))
    kept = [node for node in tree.body
            if isinstance(node, _KEPT_STATEMENTS) and getattr(node, "name", None) != entry_point]
    return top_level_source(prompt_code, kept)


def top_level_source(code: str, nodes: Sequence[ast.stmt]) -> str:
    """The source lines of top-level statements ``nodes`` of ``code``, decorators included."""
    lines = code.splitlines()
    chunks = []
    for node in nodes:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        chunks.append("\n".join(lines[start - 1:node.end_lineno]))
    return "\n\n".join(chunks)


def function_signature(code: str, name: str) -> str:
    """The ``def name(...):`` line of ``name`` in ``code`` (``def name(...):`` if not found)."""
    match = re.search(rf"^\s*def\s+{re.escape(name)}\s*\(.*?\)\s*(->[^:]*)?:", code, re.MULTILINE | re.DOTALL)
    return " ".join(match.group(0).split()) if match else f"def {name}(...):"


# ---------------------------------------------------------------- analysis of one agent's code
@dataclass
class _Part:
    """One agent's contribution: the kept code and facts about its function."""

    source: str            # what goes into the joint program
    parses: bool
    syntax_error: str | None
    function: ast.FunctionDef | None


def _returns_value(func: ast.AST) -> bool:
    return any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(func))


def _line_based_defines(code: str, name: str) -> bool:
    """For code that does not parse: is there a ``def name(`` whose block has ``return <value>``?"""
    lines = code.splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"^(\s*)def\s+{re.escape(name)}\s*\(", line):
            indent = len(line) - len(line.lstrip())
            for body in lines[i + 1:]:
                if body.strip() and len(body) - len(body.lstrip()) <= indent:
                    break
                if re.match(r"^\s*return\s+\S", body):
                    return True
    return False


def _analyse_part(code: str, own_name: str, foreign_names: set[str]) -> _Part:
    try:
        tree = parse_python(code)
    except SyntaxError as err:
        return _Part(code, False, f"line {err.lineno}: {err.msg}", None)
    except (ValueError, RecursionError, MemoryError) as err:  # null bytes, absurd nesting
        return _Part(code, False, f"{type(err).__name__}: {err}", None)
    kept = [n for n in tree.body if isinstance(n, _KEPT_STATEMENTS) and getattr(n, "name", None) not in foreign_names]
    own = [n for n in kept if isinstance(n, ast.FunctionDef) and n.name == own_name]
    source = top_level_source(code, kept)
    return _Part(source, True, None, own[-1] if own else None)


def _body_without_docstring(func: ast.FunctionDef) -> list[ast.stmt]:
    body = list(func.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


def _calls_to(func: ast.FunctionDef, names: set[str]) -> set[str]:
    return {n.func.id for n in ast.walk(func)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names}


def is_thin_wrapper(func: ast.FunctionDef, helpers: set[str]) -> bool:
    """Whether ``func``'s body is only ``return aux(...)`` or ``x = aux(...); return x`` (or empty)."""
    body = _body_without_docstring(func)
    if not body:
        return True
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        return bool(_calls_to(ast.Module([body[0]], []), helpers))
    if len(body) == 2 and isinstance(body[0], ast.Assign) and isinstance(body[1], ast.Return):
        target, value, returned = body[0].targets[0], body[0].value, body[1].value
        return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in helpers
                and isinstance(target, ast.Name) and isinstance(returned, ast.Name) and returned.id == target.id)
    return False


def discarded_helper_calls(func: ast.FunctionDef, helpers: set[str]) -> list[str]:
    """Helper calls used as bare statements (their return value thrown away)."""
    return [ast.unparse(n) for n in ast.walk(func)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Name) and n.value.func.id in helpers]


# ---------------------------------------------------------------- the joint reward
def score_collaboration(
    codes: Sequence[str],
    task: Mapping[str, Any],
    config: CodingRewardConfig = CodingRewardConfig(),
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Verdict:
    """Joint verdict of N agents' code (helpers first, entry point last) on one coding task."""
    if len(codes) < 2:
        raise ValueError(f"score_collaboration needs >= 2 codes (helpers, then the entry point), got {len(codes)}")
    entry = task["entry_point"]
    helpers = helper_names(len(codes))
    roles = helpers + [entry]
    parts = [_analyse_part(code, name, set(roles) - {name}) for code, name in zip(codes, roles)]
    defined = [p.function is not None and _returns_value(p.function) if p.parses
               else _line_based_defines(codes[i], roles[i]) for i, p in enumerate(parts)]
    helpers_ok, entry_ok = defined[:-1], defined[-1]
    components = {"structure": 0.0, "syntax": 0.0, "tests": 0.0, "cooperation": 0.0}
    details: dict[str, Any] = {"helpers": helpers, "entry_point": entry, "helpers_defined": helpers_ok,
                               "entry_defined": entry_ok, "syntax_error": None, "stopped_at": None,
                               "passed": 0, "total": None, "first_failure": None, "uses_helpers": [],
                               "thin_wrapper": None, "discarded_calls": [], "program": None}
    components["structure"] = config.helpers_defined * sum(helpers_ok) / len(helpers) + config.entry_defined * entry_ok
    program, syntax_error = _joint_program(task.get("context", ""), parts, codes)
    details["program"], details["syntax_error"] = program, syntax_error
    if not entry_ok:
        details["stopped_at"] = "structure"
        return _joint_verdict(components, details, config)
    if syntax_error is not None:
        details["stopped_at"] = "syntax"
        return _joint_verdict(components, details, config)
    components["syntax"] = config.syntax
    result = run_tests(program, task["test"], entry, timeout_s=timeout_s, task_code=task.get("context", ""))
    passed, total = result.details["passed"], result.details["total"]
    details.update(passed=passed, total=total, first_failure=result.details.get("first_failure"),
                   test_reason=result.details.get("reason"), isolation=result.details.get("isolation"))
    components["tests"] = config.tests * result.score
    entry_func = parts[-1].function
    available = {h for h, ok in zip(helpers, helpers_ok) if ok}
    called = sorted(_calls_to(entry_func, available))
    details["uses_helpers"] = called
    if passed > 0 and available and called:
        cooperation = config.uses_helpers * len(called) / len(helpers)
        details["thin_wrapper"] = is_thin_wrapper(entry_func, set(called))
        if not details["thin_wrapper"]:
            cooperation += config.not_wrapper
        details["discarded_calls"] = discarded_helper_calls(entry_func, set(called))
        if details["discarded_calls"]:
            cooperation -= config.discarded_result_penalty
        components["cooperation"] = cooperation
    return _joint_verdict(components, details, config)


def _joint_program(context: str, parts: list[_Part], codes: Sequence[str]) -> tuple[str, str | None]:
    """The joint program and, if it does not parse, which agent's code is at fault and where."""
    sections = [context] if context.strip() else []
    sections += [p.source for p in parts]
    program = "\n\n".join(s.strip("\n") for s in sections if s.strip()) + "\n"
    for index, part in enumerate(parts):
        if not part.parses:
            return program, f"agent_{index}'s code: SyntaxError at {part.syntax_error}"
    try:
        parse_python(program)
    except SyntaxError as err:  # each part parses alone, but the joint program does not
        return program, f"joint program: SyntaxError at line {err.lineno}: {err.msg}"
    except (ValueError, RecursionError, MemoryError) as err:
        return program, f"joint program: {type(err).__name__}: {err}"
    return program, None


def _joint_verdict(components: dict[str, float], details: dict[str, Any], config: CodingRewardConfig) -> Verdict:
    score = sum(components.values())
    details = {**details, "components": components, "max_score": config.maximum}
    correct = details["total"] is not None and details["passed"] == details["total"]
    return Verdict(score, correct, details)


def format_coding_feedback(verdict: Verdict) -> str:
    """Feedback lines on a joint verdict (structure, syntax, tests, cooperation warnings)."""
    d = verdict.details
    lines = []
    for name, ok in zip(d["helpers"], d["helpers_defined"]):
        lines.append(
            f"- helper `{name}`: " + ("defined and returns a value" if ok else "NOT defined with a return value")
        )
    entry = d["entry_point"]
    lines.append(f"- entry point `{entry}`: " + ("defined and returns a value" if d["entry_defined"]
                                                 else "NOT defined with a return value; tests were not run"))
    if d["syntax_error"]:
        lines.append(f"- syntax: {d['syntax_error']}; tests were not run")
    elif d["entry_defined"]:
        lines.append("- syntax: the joint program parses")
    if d["total"] is not None:
        lines.append(f"- tests: {d['passed']}/{d['total']} asserts passed")
        failure = d["first_failure"]
        if failure:
            lines.append(f"- first failing assert: `{failure['assert']}` -> {failure['error']}")
        if d.get("test_reason") and d["passed"] < d["total"] and "timed out" in d["test_reason"]:
            lines.append(f"- note: {d['test_reason']}")
        if not d["uses_helpers"]:
            lines.append(f"- warning: `{entry}` does not call any helper ({', '.join(d['helpers'])})")
        if d["thin_wrapper"]:
            lines.append(f"- warning: `{entry}` only wraps a helper; it should add its own logic")
        for call in d["discarded_calls"]:
            lines.append(f"- warning: `{call}` discards the helper's return value")
    c = d["components"]
    lines.append(f"Joint reward: {verdict.score:.2f} / {d['max_score']:.1f} (structure {c['structure']:.2f}, "
                 f"syntax {c['syntax']:.2f}, tests {c['tests']:.2f}, cooperation {c['cooperation']:.2f})")
    return "\n".join(lines)


__all__ = [
    "CodingRewardConfig", "score_collaboration", "format_coding_feedback", "extract_code", "helper_names",
    "code_context", "function_signature", "top_level_source", "is_thin_wrapper", "discarded_helper_calls",
    "parse_python",
]
