"""Hostile replies against the math verifier: each scores 0 even though the gold value is in it.

Gold is 8 unless a case says otherwise (a GSM-style question: "Tom has 5 apples and buys 3 more").
"""
from __future__ import annotations

import pytest

from verifiers._text import own_text
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


# Debate replies that report another agent's answer: the speaker's own answer is judged, never the one it
# attributes to a partner, even when the partner's comes last. (response, own answer, partner's answer)
ATTRIBUTED = {
    "partner's statement, then own": ("Agent 1 said the answer is 57; I disagree, mine is 10.", "10", "57"),
    "the previous answer between two own": (
        "The final answer is 10. The previous answer is 57. I will give the updated answer as 10.", "10", "57"),
    "partner's statement last": ("My answer is 10. Agent 1 said the answer is 57.", "10", "57"),
    "partner's number last": ("5 + 5 = 10, so I get 10. The other agent got 57.", "10", "57"),
    "partner's box last": ("My answer: \\boxed{10}. Agent 1's answer was \\boxed{57}.", "10", "57"),
    "you said, last": ("I get 10. You said 57.", "10", "57"),
    "quoted prompt line last": ("Mine: 10\nAgent 1 (verifier score 0): The answer is 57.", "10", "57"),
    "quoted label on its own line": ("Agent 2:\nThe answer is 57.\n\nChecking: 5 + 5 = 10, so 10.", "10", "57"),
    "as the partner said": ("The answer is 10, not 57 as Agent 1 said.", "10", "57"),
    "according to a partner, last": ("I computed 10. The answer is 57 according to Agent 2.", "10", "57"),
    "partner's answer before but": ("My partner's answer is 57, but the answer is 10.", "10", "57"),
    "two partners last": ("I get 10. Agent 1 and Agent 2 both answered 57.", "10", "57"),
    "the agent's name is not a number": ("I get 10, unlike Agent 1.", "10", "1"),
}

ONLY_ATTRIBUTED = [
    "the other agent claims 57",
    "Agent 1 said \\boxed{57}.",
    "Agent 1: The answer is 57.",
    "The previous answer was 57.",
]

# an agent that agrees and states the answer answers it: (response, answer)
AGREED = {
    "agreement then a statement": ("I agree with Agent 1: the answer is 57", "57"),
    "agreement with the partner's answer": ("I agree with Agent 1's answer of 57.", "57"),
    "partner's answer endorsed": ("Agent 1 said 57, which is correct.", "57"),
    "agreement in the next sentence": ("Agent 1 said the answer is 57. I agree.", "57"),
    "agreement with one of two": ("Agent 1 said 10 and Agent 2 said 57. I agree with Agent 2.", "57"),
    "agreement with the other of two": ("Agent 1 said 10 and Agent 2 said 57. I agree with Agent 1.", "10"),
}


# words that name nobody else: a word problem's "you" and "they", the prompt's "your updated answer" (gold 8)
NOT_ATTRIBUTED = [
    "If you think about it, 5 + 3 = 8.",
    "They get 8 apples in total.",
    "Add their numbers: 5 + 3 = 8",
    "Your final answer is \\boxed{8}.",
    "Here is my updated answer after reading the other agents: 8",
]


@pytest.mark.parametrize("response", NOT_ATTRIBUTED)
def test_words_that_attribute_nothing_leave_the_answer(response):
    assert verify_answer(response, "8").score == 1.0


@pytest.mark.parametrize("name", list(ATTRIBUTED))
def test_the_answer_attributed_to_another_agent_is_not_the_speakers(name):
    response, own, partner = ATTRIBUTED[name]
    verdict = verify_answer(response, partner)
    assert verdict.score == 0.0 and verdict.details["answer"] != partner, verdict.details
    verdict = verify_answer(response, own)
    assert verdict.score == 1.0 and verdict.details["answer"] == own, verdict.details


@pytest.mark.parametrize("response", ONLY_ATTRIBUTED)
def test_a_reply_with_only_a_partners_answer_has_no_answer_of_its_own(response):
    verdict = verify_answer(response, "57")
    assert verdict.score == 0.0 and verdict.correct is False and verdict.details["answer"] is None
    assert "attributes to other agents" in verdict.details["reason"], verdict.details


@pytest.mark.parametrize("name", list(AGREED))
def test_an_agent_that_agrees_and_states_the_answer_answers_it(name):
    response, answer = AGREED[name]
    verdict = verify_answer(response, answer)
    assert verdict.score == 1.0 and verdict.details["answer"] == answer, verdict.details


def test_own_text_keeps_positions_and_lines():
    text = "Step 1: 5 + 5 = 10.\nAgent 1 said 57; I say 10.\nAgent 2:\n\\boxed{57}\n"
    own = own_text(text)
    assert len(own) == len(text) and own.count("\n") == text.count("\n")
    assert "57" not in own and own.count("10") == 2 and "Step 1" in own
