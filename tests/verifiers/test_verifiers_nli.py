"""Tests for verifiers.nli.verify_label: committed label, synonyms, negation, ambiguity, gold forms."""
from __future__ import annotations

import numpy
import pytest

from verifiers import Verdict
from verifiers.nli import canonical_gold_label, verify_label

# (response, gold, expected committed label or None, expected reason when no label)
CASES = [
    ("The answer is neutral.", "neutral", "neutral", None),
    ("Answer: contradiction", "contradiction", "contradiction", None),
    ("**Answer:** Contradiction", "c", "contradiction", None),
    ("Reasoning...\nFinal label: N", "n", "neutral", None),
    ("\\boxed{E}", "e", "entailment", None),
    ("I considered neutral. \\boxed{\\text{entailment}}", "entailment", "entailment", None),
    ("\\boxed{entailment} ... on reflection \\boxed{contradiction}", "c", "contradiction", None),
    # the later marked answer wins, box or statement: a correction beats what it corrects
    ("\\boxed{entailment}. Wait, on reflection the answer is neutral.", "n", "neutral", None),
    ("The answer is neutral. Rechecking the premise: \\boxed{contradiction}", "c", "contradiction", None),
    ("\\boxed{The answer is neutral}", "n", "neutral", None),
    ("\\boxed{maybe}", "n", None, "names no label"),
    ("\\boxed{entailment or neutral}", "n", None, "ambiguous"),
    ("The premise entails the hypothesis.", "entailment", "entailment", None),
    ("So the hypothesis is entailed.", "e", "entailment", None),
    ("The hypothesis is contradicted by the premise.", "c", "contradiction", None),
    ("These two statements are contradictory.", "c", "contradiction", None),
    ("The premise neither entails nor contradicts the hypothesis.", "n", "neutral", None),
    ("Whether she left cannot be determined from the premise.", "n", "neutral", None),
    ("The relationship is undetermined.", "n", "neutral", None),
    ("This is not entailment.", "e", None, "no label"),
    ("It doesn't contradict the premise.", "c", None, "no label"),
    ("It is not entailment, so it is contradiction.", "c", "contradiction", None),
    ("The answer is clearly not entailment but neutral", "n", "neutral", None),
    ("It could be entailment or contradiction.", "c", None, "ambiguous"),
    ("Entailment? Neutral? The statements are contradictory.", "c", "contradiction", None),
    ("The hypothesis is neutral.\nThanks for asking!", "n", "neutral", None),
    ("The answer is neutral.", "entailment", "neutral", None),
    ("I like cheese.", "n", None, "no label"),
    ("**C**", "c", "contradiction", None),
    ("Choose the answer: entailment, neutral or contradiction.\nI'd say contradiction.", "c", "contradiction", None),
    ("The answer is entailment. One might argue for neutral, though.", "e", "entailment", None),
    ("I first thought entailment. Actually, no, it's neutral.", "n", "neutral", None),
    ("Not neutral, but entailment.", "e", "entailment", None),
    ("Answer: Neither", "n", "neutral", None),
    ("Entailment: No\nNeutral: Yes\nContradiction: No", "n", "neutral", None),
    ("The hypothesis is false given the premise.", "c", None, "no label"),
]


@pytest.mark.parametrize(("response", "gold", "label", "reason"), CASES)
def test_verify_label_cases(response: str, gold: str, label: str | None, reason: str | None) -> None:
    verdict = verify_label(response, gold)
    assert isinstance(verdict, Verdict)
    assert verdict.details["answer"] == label
    expected_correct = label is not None and label == canonical_gold_label(gold)
    assert verdict.correct is expected_correct
    assert verdict.score == (1.0 if expected_correct else 0.0)
    if reason is None:
        assert "reason" not in verdict.details
    else:
        assert reason in verdict.details["reason"]


@pytest.mark.parametrize(
    ("gold", "label"),
    [
        (0, "entailment"), (1, "neutral"), (2, "contradiction"), ("2", "contradiction"), (numpy.int64(1), "neutral"),
        ("E", "entailment"), ("n", "neutral"), (" Contradiction ", "contradiction"),
    ],
)
def test_gold_forms(gold: object, label: str) -> None:
    verdict = verify_label(f"The answer is {label}.", gold)  # type: ignore[arg-type]
    assert verdict.details["gold"] == label
    assert verdict.correct is True


@pytest.mark.parametrize("gold", ["", "yes", 3, -1, None, True, 1.0])
def test_bad_gold_raises_value_error(gold: object) -> None:
    with pytest.raises(ValueError, match="gold label"):
        verify_label("The answer is neutral.", gold)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("response", "reason"), [("", "empty"), ("  ", "empty"), (None, "not a string"), (1, "not a string")]
)
def test_unjudgeable_response_scores_zero(response: object, reason: str) -> None:
    verdict = verify_label(response, "neutral")  # type: ignore[arg-type]
    assert (verdict.score, verdict.correct, verdict.details["answer"]) == (0.0, False, None)
    assert reason in verdict.details["reason"]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "response",
    ["entailment " * 100_000 + "Answer: neutral", "not " * 250_000, "\\boxed{" * 150_000, "n't entail " * 100_000],
)
def test_pathological_inputs_return_quickly(response: str) -> None:
    verdict = verify_label(response, "neutral")
    assert verdict.correct is (verdict.details["answer"] == "neutral")
