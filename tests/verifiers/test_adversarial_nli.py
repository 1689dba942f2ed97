"""Hostile replies against the NLI verifier: each scores 0 whatever the gold label is."""
from __future__ import annotations

import pytest

from verifiers.nli import LABELS, verify_label

HOSTILE = {
    # all three labels
    "three labels in one sentence": "entailment, neutral, contradiction",
    "three bare sentences": "Entailment. Neutral. Contradiction.",
    "three questions": "entailment? neutral? contradiction?",
    "three answer lines": "Answer: entailment\nAnswer: neutral\nAnswer: contradiction",
    "three boxes": "\\boxed{{entailment}} \\boxed{{neutral}} \\boxed{{contradiction}}",
    "three letters in boxes": "\\boxed{{E}}\\boxed{{N}}\\boxed{{C}}",
    "answer then more labels after a semicolon": "Answer: entailment; neutral; contradiction",
    "labels joined by slashes": "Answer: entailment/neutral/contradiction",
    "labels joined by or": "The answer is entailment or neutral or contradiction.",
    "letters joined by or": "Answer: E or N or C",
    # a label then its negation
    "label then not label": "The answer is {label}. Not {label}.",
    "label or maybe not": "The answer is {label}, or maybe it is not {label}.",
    "label answered no": "The answer is {label}. {Label}: no.",
    "final answer negates the first": "Answer: {label}\nFinal answer: not {label}",
    "label then just kidding": "The answer is {label}! Just kidding, it is not.",
    "label then that is wrong": "Label: {label}. That label is wrong.",
    "label then it is false": "The answer is {label}. It is false that it is {label}.",
    "boxed label then negated": "\\boxed{{{label}}} Actually no, not {label}.",
}


# each case is a format string: {label} / {Label} is the gold label, {{ }} a literal brace
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_reply_scores_zero_for_every_gold(name):
    for label in LABELS:
        response = HOSTILE[name].format(label=label, Label=label.capitalize())
        verdict = verify_label(response, label)
        assert verdict.score == 0.0 and verdict.details["answer"] is None, (label, verdict.details)


@pytest.mark.parametrize("response, gold", [
    ("Agent 2 said the answer is contradiction, but I think the answer is entailment.", "entailment"),
    ("It is not a contradiction, and it is not neutral either. The answer is entailment.", "entailment"),
    ("The answer is entailment. The premise states it directly, and nothing contradicts it.", "entailment"),
    ("I first thought entailment. Actually, no, it's neutral.", "neutral"),
    ("\\boxed{C}", "contradiction"),
])
def test_honest_reply_beside_the_hostile_ones_scores_one(response, gold):
    assert verify_label(response, gold).score == 1.0


# Debate replies that report another agent's label: the speaker's own label is judged, never the one it
# attributes to a partner, even when the partner's comes last. (response, own label, partner's label)
ATTRIBUTED = {
    "partner's statement, then own": (
        "Agent 1 said the answer is contradiction; I disagree, mine is entailment.", "entailment", "contradiction"),
    "the previous answer after the final one": (
        "The final answer is neutral. The previous answer is entailment.", "neutral", "entailment"),
    "partner's statement last": (
        "My answer is neutral. Agent 2 said the answer is contradiction.", "neutral", "contradiction"),
    "partner's box last": ("\\boxed{neutral} Agent 1's answer was \\boxed{entailment}.", "neutral", "entailment"),
    "partner's sentence last": ("Neutral. The other agent thinks it is an entailment.", "neutral", "entailment"),
    "quoted label on its own line": (
        "I think it is neutral.\nAgent 1:\nThe answer is contradiction.", "neutral", "contradiction"),
    "as the partner said": ("The answer is neutral, not entailment as Agent 1 said.", "neutral", "entailment"),
}


@pytest.mark.parametrize("name", list(ATTRIBUTED))
def test_the_label_attributed_to_another_agent_is_not_the_speakers(name):
    response, own, partner = ATTRIBUTED[name]
    assert verify_label(response, partner).score == 0.0
    verdict = verify_label(response, own)
    assert verdict.score == 1.0 and verdict.details["answer"] == own, verdict.details


def test_a_reply_with_only_a_partners_label_has_no_label_of_its_own():
    verdict = verify_label("the other agent claims contradiction", "contradiction")
    assert verdict.score == 0.0 and verdict.details["answer"] is None
    assert "attributes to other agents" in verdict.details["reason"], verdict.details


@pytest.mark.parametrize("response", [
    "I agree with Agent 1: the answer is neutral.",
    "I agree with Agent 1's answer of neutral.",
    "Agent 1 said the answer is neutral. I agree.",
])
def test_an_agent_that_agrees_and_states_the_label_commits_to_it(response):
    assert verify_label(response, "neutral").score == 1.0
