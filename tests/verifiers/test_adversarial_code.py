"""Hostile programs against the code sandbox: a program that does not compute the answer scores 0.

Each case of ``tests.hostile_programs.FOOLING_PROGRAMS`` is one named test: it answers ``add(a, b)``
without adding, trying to fool the comparison, the assert machinery, the exit status or the result
channel instead.
"""
from __future__ import annotations

import pytest

from tests.hostile_programs import ADD_TEST, CORRECT_ADD, FOOLING_PROGRAMS
from verifiers.sandbox import run_tests

TIMEOUT_S = 5.0
MBPP_STYLE_ADD_TEST = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
TRUTHY_TEST = "def check(candidate):\n    assert candidate(1, 2)\n    assert not candidate(0, 0)\n"


@pytest.mark.parametrize("name", list(FOOLING_PROGRAMS))
def test_fooling_program_scores_zero(name):
    verdict = run_tests(FOOLING_PROGRAMS[name], ADD_TEST, "add", timeout_s=TIMEOUT_S)
    assert verdict.score == 0.0, verdict.details
    assert verdict.details["reason"]


@pytest.mark.parametrize("name", list(FOOLING_PROGRAMS))
def test_fooling_program_scores_zero_on_top_level_asserts(name):
    verdict = run_tests(FOOLING_PROGRAMS[name], MBPP_STYLE_ADD_TEST, "add", timeout_s=TIMEOUT_S)
    assert verdict.score == 0.0, verdict.details


def test_object_that_claims_truth_does_not_pass_a_truthiness_assert():
    program = "class Yes:\n    def __bool__(self):\n        return True\ndef add(a, b):\n    return Yes()\n"
    verdict = run_tests(program, TRUTHY_TEST, "add", timeout_s=TIMEOUT_S)
    assert verdict.details["results"][0]["passed"] is False


def test_not_plain_return_names_the_type_in_the_details():
    verdict = run_tests(FOOLING_PROGRAMS["int subclass equal to everything"], ADD_TEST, "add", timeout_s=TIMEOUT_S)
    error = verdict.details["first_failure"]["error"]
    assert error.startswith("NotPlainValue:") and "Int" in error and "not a plain value" in error


def test_correct_program_still_passes_beside_the_checks():
    assert run_tests(CORRECT_ADD, ADD_TEST, "add").score == 1.0
    assert run_tests(CORRECT_ADD, MBPP_STYLE_ADD_TEST, "add").score == 1.0


@pytest.mark.parametrize("value, passes", [
    ("3", True), ("3.0", True), ("True + 2", True), ("[3]", False), ("(3,)", False),
    ("{'a': [1, (2, 3.5)], 'b': {1, 2}, 'c': frozenset({b'x'}), 'd': None, 'e': 1j}", False),
])
def test_plain_values_of_every_builtin_type_reach_the_test(value, passes):
    program = f"def add(a, b):\n    return {value}\n"
    test = (
        f"def check(candidate):\n    assert candidate(1, 2) == {value}\n    assert (candidate(1, 2) == 3) is {passes}\n"
    )
    assert run_tests(program, test, "add").score == 1.0


def test_program_exceptions_come_back_as_the_builtin_exception():
    program = "def add(a, b):\n    raise ValueError('negative')\n"
    test = ("def check(candidate):\n    raised = None\n    try:\n        candidate(1, 2)\n"
            "    except ValueError as err:\n        raised = str(err)\n    assert raised == 'negative'\n")
    assert run_tests(program, test, "add").score == 1.0


def test_objects_of_the_program_can_be_built_and_passed_back():
    # MBPP's tree tasks: the test builds objects of the program's class and passes them to the entry point
    program = ("class Node:\n    def __init__(self, value):\n        self.value = value\n        self.next = None\n"
               "def length(node):\n    return 0 if node is None else 1 + length(node.next)\n")
    test = ["head = Node(1)", "head.next = Node(2)", "head.next.next = Node(3)",
            "assert length(head) == 3", "assert length(head.next) == 2", "assert head.next.value == 2",
            "assert length([Node(5)][0]) == 1"]
    assert run_tests(program, test, "length").score == 1.0


def test_counter_reaches_the_test_as_the_dict_it_holds():
    program = "from collections import Counter\ndef add(a, b):\n    return Counter({a: b})\n"
    assert run_tests(program, "def check(candidate):\n    assert candidate(1, 2) == {1: 2}\n", "add").score == 1.0


def test_program_cannot_replace_the_task_helper_the_test_uses():
    # HumanEval/38's shape: the test encodes with the task's encode(), the candidate must decode
    task_code = "def encode(s):\n    return s[::-1] + '!'\n"
    test = "def check(candidate):\n    assert candidate(encode('abc')) == 'abc'\n"
    cheat = "def encode(s):\n    return s\ndef decode(s):\n    return s\n"
    honest = task_code + "def decode(s):\n    return s[:-1][::-1]\n"
    assert run_tests(cheat, test, "decode").score == 1.0            # the program's own encode() is used
    assert run_tests(cheat, test, "decode", task_code=task_code).score == 0.0
    assert run_tests(honest, test, "decode", task_code=task_code).score == 1.0
