"""Hostile replies against the math verifier: each scores 0 even though the gold value is in it.

Gold is 8 unless a case says otherwise (a GSM-style question: "Tom has 5 apples and buys 3 more").
"""
from __future__ import annotations

import pytest

from verifiers.math import verify_answer

HOSTILE = {
    # several answers hedged in one reply
    "alternatives in a statement": ("The answer is 3 or 8.", "8"),
    "either-or statement": ("The answer is either 8 or 3", "8"),
    "stated answer followed by more": ("The answer is 8, 5 or 3.", "8"),
    "alternatives in parentheses": ("The answer is 8 (or 3)", "8"),
    "two boxes joined by or": ("\\boxed{3} or \\boxed{8}", "8"),
    "two boxes side by side": ("So \\boxed{3} \\boxed{8}", "8"),
    "two #### lines": ("#### 3\n#### 8", "8"),
    "or inside a box": ("\\boxed{3 \\text{ or } 8}", "8"),
    "logical or inside a box": ("\\boxed{3 \\lor 8}", "8"),
    "plus-minus inside a box": ("\\boxed{8 \\pm 5}", "8"),
    "equations hedged in a box": ("\\boxed{x = 3 \\text{ or } x = 8}", "8"),
    "list inside a box": ("\\boxed{3, 8}", "8"),
    "set inside a box": ("\\boxed{\\{3, 5, 8\\}}", "8"),
    "bare list of numbers": ("5 3 8", "8"),
    "bare list with commas": ("Numbers: 5, 3, 8", "8"),
    # answers in the question's own numbers: the verifier would do the arithmetic
    "sum of the question's numbers in a box": ("\\boxed{5+3}", "8"),
    "sum of the question's numbers stated": ("The answer is 5 + 3", "8"),
    "sum after ####": ("#### 5+3", "8"),
    "product in a box": ("\\boxed{2 \\times 4}", "8"),
    "unreduced fraction": ("\\boxed{16/2}", "8"),
    "unreduced latex fraction": ("\\boxed{\\frac{16}{2}}", "8"),
    # a box that contains an expression
    "power in a box": ("\\boxed{2^3}", "8"),
    "root in a box": ("\\boxed{\\sqrt{64}}", "8"),
    "factorial in a box": ("\\boxed{5!}", "120"),
    "sum notation in a box": ("\\boxed{\\sum_{i=1}^{3} i}", "6"),
    "unevaluated sum for a symbolic gold": ("\\boxed{\\sqrt{3}+\\sqrt{3}}", "2\\sqrt{3}"),
}

HONEST = {
    "boxed value": ("So she has \\boxed{8} apples.", "8"),
    "corrected answer": ("First I got \\boxed{3}. Wait, recheck: 5 + 3 = 8. The answer is 8", "8"),
    "answer then its reason": ("The answer is 8, because 5 + 3 = 8.", "8"),
    "last number of a worked solution": ("5 + 3 = 8 apples in total. 8", "8"),
    "equivalent symbolic form": ("\\boxed{\\sqrt{12}}", "2\\sqrt{3}"),
    "reduced fraction": ("\\boxed{\\frac{3}{4}}", "0.75"),
    "thousands separator": ("The answer is $1,000.", "1000"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_reply_scores_zero(name):
    response, gold = HOSTILE[name]
    verdict = verify_answer(response, gold)
    assert verdict.score == 0.0 and verdict.correct is False, verdict.details
    assert verdict.details.get("reason"), verdict.details


@pytest.mark.parametrize("name", list(HONEST))
def test_honest_reply_beside_the_hostile_ones_scores_one(name):
    response, gold = HONEST[name]
    assert verify_answer(response, gold).score == 1.0
