"""Tests for verifiers.math.verify_answer: extraction priority, normalisation, equivalence, guards."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from verifiers import Verdict
from verifiers._symbolic_worker import SymbolicWorker
from verifiers.math import canonical_number, verify_answer

GSM8K_SOLUTION = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)

# (response, gold, expected correct, expected details["answer"])
CASES = [
    # extraction priority
    ("First 3, then 5, so \\boxed{72}. Later I mention 9.", "72", True, "72"),
    ("\\boxed{5} was a draft; final: \\boxed{72}", "72", True, "72"),
    ("\\boxed{\\frac{3}{4}}", "0.75", True, "0.75"),
    ("nested \\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{2}}{2}", True, "\\frac{\\sqrt{2}}{2}"),
    ("\\fbox{7}", "7", True, "7"),
    ("so it is \\boxed 9 apples", "9", True, "9"),
    ("\\boxed{72} but the text ends \\boxed{12", "72", True, "72"),
    ("48 + 24 = 72 clips\n#### 72", "72", True, "72"),
    ("#### Step 1\nShe has 7 apples.", "7", True, "7"),
    ("She had 3 bags. The answer is 18.", "18", True, "18"),
    ("she has 4 pens; THE ANSWER IS 18", "18", True, "18"),
    ("**Final Answer:** 18", "18", True, "18"),
    ("Answer: 42 apples and 3 pears", "42", True, "42"),
    ("The answer is 72 because she bought 3 more", "72", True, "72"),
    ("So she had 3 and then 5 more, 8 in total.", "8", True, "8"),
    ("There are 8 boxes in room B2", "8", True, "8"),
    ("Final Answer: The final answer is 3. I hope it is correct.", "3", True, "3"),
    ("so she eats $$\\frac{3}{4}$$", "0.75", True, "0.75"),
    ("\\boxed{.5}", "1/2", True, "0.5"),
    ("\\boxed{70{,}000}", "70000", True, "70000"),
    # normalisation
    ("\\boxed{12.0}", "12", True, "12"),
    ("The total is 1,234.", "1234", True, "1234"),
    ("It costs $5.", "5", True, "5"),
    ("\\boxed{\\$5.00}", "5", True, "5"),
    ("Answer: 3/4", "0.75", True, "0.75"),
    ("\\boxed{\\dfrac{3}{4}}", "3/4", True, "0.75"),
    ("\\boxed{-\\frac{1}{2}}", "-0.5", True, "-0.5"),
    ("\\boxed{-3}", "3", False, "-3"),
    ("The answer is \u22123.", "-3", True, "-3"),
    ("#### 50%", "50", True, "50"),
    ("\\boxed{50\\%}", "50", True, "50"),
    ("The answer is 5 dollars.", "5", True, "5"),
    ("final answer: 12 cm", "12", True, "12"),
    ("\\boxed{12 \\text{ cm}^2}", "12", True, "12"),
    ("\\boxed{\\text{72 apples}}", GSM8K_SOLUTION, True, "72"),
    ("The answer is 72.", GSM8K_SOLUTION, True, "72"),
    ("\\boxed{x = 5}", "5", True, "5"),
    ("\\boxed{90^\\circ}", "90", True, "90"),
    # exact equality: a rounded decimal is not the fraction it rounds, either way round
    ("\\boxed{0.33}", "\\frac{1}{3}", False, "0.33"),
    ("\\boxed{0.333}", "1/3", False, "0.333"),
    ("\\boxed{1/3}", "0.33", False, "1/3"),
    ("The answer is \\frac{1}{3}.", "0.33", False, "1/3"),
    ("\\boxed{0.3}", "\\frac{1}{3}", False, "0.3"),
    ("\\boxed{1/2}", "0.5", True, "0.5"),
    # scientific notation: equal when exactly equal
    ("\\boxed{1.2e3}", "1200", True, "1200"),
    ("The answer is 1.2E3.", "1200", True, "1200"),
    ("so it comes to 1.2e3", "1200", True, "1200"),
    ("\\boxed{1.2e3}", "1201", False, "1200"),
    ("\\boxed{5e-1}", "1/2", True, "0.5"),
    ("\\boxed{1200}", "1.2e3", True, "1200"),
    # LaTeX scientific notation, unboxed too: the whole number, not its exponent
    ("The distance is 1.2 \\times 10^3 meters.", "1200", True, "1200"),
    ("so we get 1.2 \\times 10^{3}", "1200", True, "1200"),
    ("about 3 \\cdot 10^{-2} of it", "0.03", True, "0.03"),
    ("It is 10^3.", "1000", True, "1000"),
    ("\\boxed{-1.2 \\times 10^{3}}", "-1200", True, "-1200"),
    ("We have 2^10 = 1024", "1024", True, "1024"),
    # the last stated final answer wins, whatever marked it
    ("So \\boxed{3}. Wait, recheck: 4. The answer is 4", "4", True, "4"),
    ("So \\boxed{3}. Wait, recheck: 4. The answer is 4", "3", False, "4"),
    ("The answer is 3. No: 3 + 1 = \\boxed{4}", "4", True, "4"),
    ("#### 3\nCorrection. Final answer: 4", "4", True, "4"),
    ("The answer is \\boxed{4}.", "4", True, "4"),
    ("\\boxed{4}\nThe answer is in the box above.", "4", True, "4"),
    ("\\boxed{4} and the answer is in \\boxed{} form", "4", True, "4"),
    ("The answer is 71.", "72", False, "71"),
    # symbolic path (math-verify)
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", True, "\\sqrt{8}"),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}", True, "\\sqrt{2}/2"),
    ("\\boxed{\\pi}", "\\frac{\\pi}{2}", False, "\\pi"),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt{2}}{2}", True, "\\frac{1}{\\sqrt{2}}"),
    # mixed numbers
    ("She used 1 1/2 cups.", "1.5", True, "1.5"),
    ("\\boxed{2\\frac{1}{2}}", "5/2", True, "2.5"),
]


@pytest.mark.parametrize(("response", "gold", "correct", "answer"), CASES)
def test_verify_answer_cases(response: str, gold: str, correct: bool, answer: str) -> None:
    verdict = verify_answer(response, gold)
    assert isinstance(verdict, Verdict)
    assert verdict.correct is correct
    assert verdict.score == (1.0 if correct else 0.0)
    assert verdict.details["answer"] == answer
    assert "reason" not in verdict.details


def test_every_offline_gsm8k_solution_verifies_against_itself() -> None:
    path = Path(os.environ.get("LLM_MARL_DATA_DIR", "/nonexistent")) / "gsm8k" / "test.jsonl"
    if not path.exists():
        pytest.skip(f"offline GSM8K copy not found at {path}")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    failures = [row["answer"][-40:] for row in rows if not verify_answer(row["answer"], row["answer"]).correct]
    assert failures == []


def test_symbolic_check_from_worker_thread_uses_child_process() -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        right = pool.submit(verify_answer, "\\boxed{\\sqrt{12}}", "2\\sqrt{3}").result()
        wrong = pool.submit(verify_answer, "\\boxed{\\sqrt{11}}", "2\\sqrt{3}").result()
    assert (right.correct, wrong.correct) == (True, False)


@pytest.mark.timeout(120)
def test_symbolic_worker_is_killed_after_timeout_and_restarts() -> None:
    # 3 s: far above a warm comparison's few milliseconds even on a loaded machine, far below the slow one's minutes
    worker = SymbolicWorker(timeout_s=3.0)
    try:
        assert worker.compare("8", "2^3") is True
        slow = "(a+b+c+d)^{9}(e+f+g+h)^{9}(i+j+k+l)^{9}(m+n+o+p)^{9}-(q+r)^{9}"
        started = time.monotonic()
        assert worker.compare("1", slow) is None
        assert time.monotonic() - started < 30
        assert worker.compare("8", "2^3") is True
    finally:
        worker.close()


def test_gold_from_gsm8k_solution_is_canonical() -> None:
    assert verify_answer("\\boxed{72}", GSM8K_SOLUTION).details["gold"] == "72"


def test_consensus_strings_agree_across_notations() -> None:
    answers = {
        verify_answer(text, "1").details["answer"] for text in ("\\boxed{\\frac{1}{3}}", "Answer: 1/3", "#### 1/3")
    }
    assert answers == {"1/3"}


@pytest.mark.parametrize(
    ("response", "reason_fragment"),
    [
        ("", "empty"),
        ("   \n ", "empty"),
        (None, "not a string"),
        (72, "not a string"),
        ("I do not know.", "no answer"),
        ("see item x1", "no answer"),
        ("\\boxed{10^10^10}", "too complex"),
        ("\\boxed{2^{100000}}", "too complex"),
        ("\\boxed{1000000!}", "too complex"),
        ("\\boxed{5/0}", "division by zero"),
    ],
)
def test_unjudgeable_responses_score_zero_with_reason(response: object, reason_fragment: str) -> None:
    verdict = verify_answer(response, "72")  # type: ignore[arg-type]
    assert verdict.score == 0.0
    assert verdict.correct is False
    assert reason_fragment in verdict.details["reason"]
    assert verdict.details["gold"] == "72"


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "response",
    [
        "x" * 1_000_000,
        "7" * 1_000_000,
        "\\boxed{" * 200_000,
        "The answer is " * 70_000 + "\\boxed{72}",
        "1,000," * 170_000,
        "\\boxed{" + "(" * 5_000 + "1" + ")" * 5_000 + "}",
        "The answer is $10^{10^{10}}$.",
        "\\boxed{9^{9^{9}}}",
        "#### 2**2**100",
    ],
)
def test_pathological_inputs_return_quickly(response: str) -> None:
    verdict = verify_answer(response, "72")
    assert verdict.score in (0.0, 1.0)
    assert verdict.correct is (verdict.score == 1.0)


def test_huge_boxed_response_still_finds_last_box() -> None:
    verdict = verify_answer("word " * 200_000 + "\\boxed{72}", "72")
    assert verdict.correct is True


@pytest.mark.parametrize("gold", ["", "   ", None, 72, ["72"]])
def test_bad_gold_raises_value_error(gold: object) -> None:
    with pytest.raises(ValueError, match="gold"):
        verify_answer("\\boxed{72}", gold)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("numerator", "denominator", "text"),
    [(72, 1, "72"), (3, 4, "0.75"), (-5, 2, "-2.5"), (1, 3, "1/3"), (1, 1024, "0.0009765625")],
)
def test_canonical_number(numerator: int, denominator: int, text: str) -> None:
    from fractions import Fraction

    assert canonical_number(Fraction(numerator, denominator)) == text


def test_numeric_answers_never_import_sympy() -> None:
    script = (
        "import sys\n"
        "from verifiers.math import verify_answer\n"
        "for response in ['\\\\boxed{72}', 'The answer is 1,234.', '#### 3/4', 'It costs $5.50.']:\n"
        "    verify_answer(response, '72')\n"
        "print(sorted(name for name in ('sympy', 'math_verify') if name in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root, check=True)
    assert result.stdout.strip() == "[]"
