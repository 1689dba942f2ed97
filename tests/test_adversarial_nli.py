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
