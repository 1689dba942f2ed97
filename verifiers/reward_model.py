"""A learned verifier: a small LM with a scalar head that scores (question, answer) pairs.

MAPoRL can score answers with a learned verifier instead of the answer label. This module
trains one from rollout data — ``(question, answer, correct)`` records — and serves it as a
verifier: :meth:`RewardModel.score` returns a :class:`~verifiers.Verdict` whose ``score`` is the
predicted probability that the answer is correct.

    >>> rm = RewardModel.from_causal_lm(*llm_marl.models.load("smollm2-135m"))   # or from_pretrained(DIR)
    >>> train_reward_model(rm, examples, epochs=2)
    >>> rm.score("What is 2+3?", "2+3 = 5. The answer is 5.")
    Verdict(score=0.93, correct=True, details={'logit': 2.6})

Model: a standard ``transformers`` ``*ForSequenceClassification`` with ``num_labels=1`` (the
backbone's last non-pad token feeds a linear head), so a saved reward model loads anywhere.

Training: a plain pointwise classifier loop (binary cross-entropy on the logit). TRL's
``RewardTrainer`` trains a Bradley–Terry ranking loss on chosen/rejected pairs, whose scores
are only comparable within one question; a verifier must judge a single answer on an absolute
scale, so the model fits the probability of correctness directly.

Class balancing (:func:`balance_examples`): a model that sees only right answers to easy
questions and wrong answers to hard ones learns question difficulty, not answer correctness.
So each question keeps equally many right and wrong answers (``min(#right, #wrong)`` of each,
sampled); answers of questions with one class only are then added while keeping the overall
numbers of right and wrong equal (the surplus class is subsampled).
"""
from __future__ import annotations

import json
import os
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from . import Verdict

INPUT_TEMPLATE = "Question:\n{question}\n\nProposed answer:\n{answer}\n\nIs the proposed answer correct?"


@dataclass(frozen=True)
class RewardExample:
    """One training record: an answer to a question and whether it was right."""

    question: str
    answer: str
    correct: bool

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> RewardExample:
        """Build from ``{"question": str, "answer": str, "correct": bool}``; refuses anything else."""
        missing = [k for k in ("question", "answer", "correct") if k not in record]
        if missing:
            raise ValueError(f"reward example is missing field(s) {missing}: {dict(record)!r:.200}")
        if not isinstance(record["question"], str) or not isinstance(record["answer"], str):
            raise ValueError(f"question and answer must be strings, got {dict(record)!r:.200}")
        if record["correct"] not in (True, False, 0, 1):
            raise ValueError(f"correct must be a bool (or 0/1), got {record['correct']!r}")
        return cls(record["question"], record["answer"], bool(record["correct"]))


def load_examples(path: str | os.PathLike) -> list[RewardExample]:
    """Read reward examples from a JSONL file (one ``{"question", "answer", "correct"}`` object a line)."""
    examples = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                examples.append(RewardExample.from_dict(json.loads(line)))
            except (json.JSONDecodeError, ValueError) as error:
                raise ValueError(f"{path}:{number}: {error}") from error
    return examples


def save_examples(examples: Iterable[RewardExample], path: str | os.PathLike) -> None:
    """Write reward examples as JSONL (the format :func:`load_examples` reads)."""
    with open(path, "w", encoding="utf-8") as handle:
        for example in examples:
            handle.write(json.dumps(asdict(example)) + "\n")


def balance_examples(examples: Sequence[RewardExample], seed: int = 0) -> list[RewardExample]:
    """Equal right and wrong answers per question where possible, and overall (see the module docstring)."""
    rng = random.Random(seed)
    by_question: dict[str, dict[bool, list[RewardExample]]] = defaultdict(lambda: {True: [], False: []})
    for example in examples:
        by_question[example.question][example.correct].append(example)
    balanced: list[RewardExample] = []
    leftovers: dict[bool, list[RewardExample]] = {True: [], False: []}
    for question in sorted(by_question):
        right, wrong = by_question[question][True], by_question[question][False]
        if right and wrong:
            k = min(len(right), len(wrong))
            balanced += rng.sample(right, k) + rng.sample(wrong, k)
        else:
            leftovers[True] += right
            leftovers[False] += wrong
    k = min(len(leftovers[True]), len(leftovers[False]))
    balanced += rng.sample(leftovers[True], k) + rng.sample(leftovers[False], k)
    rng.shuffle(balanced)
    return balanced


class RewardModel:
    """A sequence-classification LM (one logit) plus its tokenizer, used as a verifier."""

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, max_length: int = 1024, name: str = "reward_model"
    ) -> None:
        if getattr(model.config, "num_labels", None) != 1:
            raise ValueError(
                f"reward model needs a single-logit head (num_labels=1), got num_labels={model.config.num_labels}"
            )
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.config.pad_token_id = tokenizer.pad_token_id      # the head reads the last non-pad token
        tokenizer.padding_side = "right"
        tokenizer.truncation_side = "left"                      # keep the end of long answers (the final answer)
        self.model, self.tokenizer, self.max_length, self.name = model, tokenizer, max_length, name

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike, max_length: int = 1024) -> RewardModel:
        """Load a saved reward model (a :meth:`save` directory), or put a fresh scalar head on a causal LM.

        ``name_or_path`` is a local directory or a hub id. For an embedded model name, load it with
        ``llm_marl.models.load`` and use :meth:`from_causal_lm`.
        """
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
            model = AutoModelForSequenceClassification.from_pretrained(str(name_or_path), num_labels=1)
        except OSError as err:
            raise ValueError(f"could not load a reward model from {str(name_or_path)!r}: not a saved RewardModel "
                             f"directory, and the hub did not provide it ({err})") from err
        return cls(model, tokenizer, max_length=max_length, name=str(name_or_path))

    @classmethod
    def from_causal_lm(
        cls, causal_lm: torch.nn.Module, tokenizer: Any, seed: int = 0, max_length: int = 1024
    ) -> RewardModel:
        """Reuse an in-memory causal LM's backbone weights under a fresh, seeded scalar head."""
        from transformers import AutoModelForSequenceClassification

        config = causal_lm.config.__class__.from_dict({**causal_lm.config.to_dict(), "num_labels": 1})
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForSequenceClassification.from_config(config)
        missing, _unexpected = model.load_state_dict(causal_lm.state_dict(), strict=False)
        new_keys = [k for k in missing if not k.startswith("score.")]
        if new_keys:
            raise ValueError(f"{type(causal_lm).__name__} does not share its backbone layout with "
                             f"{type(model).__name__}: weights {new_keys[:3]} were not found")
        return cls(
            model,
            tokenizer,
            max_length=max_length,
            name=getattr(causal_lm.config, "_name_or_path", "") or "reward_model",
        )

    def save(self, directory: str | os.PathLike) -> Path:
        """Save model and tokenizer (``from_pretrained(directory)`` loads them back)."""
        directory = Path(directory)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        return directory

    # ---------------------------------------------------------------- scoring
    def encode(self, pairs: Sequence[tuple[str, str]]) -> dict[str, torch.Tensor]:
        """Tokenize ``(question, answer)`` pairs into a padded batch."""
        texts = [INPUT_TEMPLATE.format(question=q, answer=a) for q, a in pairs]
        return self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length)

    def logits(self, pairs: Sequence[tuple[str, str]]) -> torch.Tensor:
        """One logit per pair (log-odds that the answer is correct); differentiable."""
        batch = self.encode(pairs)
        return self.model(**batch).logits[:, 0].float()

    @torch.no_grad()
    def score_batch(self, pairs: Sequence[tuple[str, str]], batch_size: int = 16) -> list[Verdict]:
        """Verdicts for many ``(question, answer)`` pairs: score = P(correct), correct = score >= 0.5."""
        was_training = self.model.training
        self.model.eval()
        verdicts: list[Verdict] = []
        try:
            for start in range(0, len(pairs), batch_size):
                for logit in self.logits(pairs[start:start + batch_size]).tolist():
                    probability = float(torch.sigmoid(torch.tensor(logit)))
                    verdicts.append(Verdict(probability, probability >= 0.5, {"logit": logit, "verifier": self.name}))
        finally:
            self.model.train(was_training)
        return verdicts

    def score(self, question: str, answer: str) -> Verdict:
        """The verdict on one answer."""
        return self.score_batch([(question, answer)])[0]


def train_reward_model(
    reward_model: RewardModel,
    examples: Sequence[RewardExample],
    *,
    epochs: int = 1,
    learning_rate: float = 2e-5,
    batch_size: int = 8,
    balance: bool = True,
    max_grad_norm: float = 1.0,
    seed: int = 0,
) -> dict[str, float]:
    """Fit the reward model as a binary classifier (BCE on the logit); returns training statistics."""
    if epochs < 1 or batch_size < 1 or learning_rate <= 0:
        raise ValueError(
            f"epochs and batch_size must be >= 1 and learning_rate > 0, got {epochs}, {batch_size}, {learning_rate}"
        )
    data = balance_examples(examples, seed) if balance else list(examples)
    if not data:
        raise ValueError(
            "no training examples left"
            + (" after class balancing: need both right and wrong answers" if balance else "")
        )
    model = reward_model.model
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate)
    rng = random.Random(seed)
    model.train()
    losses: list[float] = []
    for _epoch in range(epochs):
        order = list(range(len(data)))
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            batch = [data[i] for i in order[start:start + batch_size]]
            logits = reward_model.logits([(e.question, e.answer) for e in batch])
            labels = torch.tensor([float(e.correct) for e in batch])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            losses.append(float(loss.detach()))
    model.eval()
    steps_per_epoch = -(-len(data) // batch_size)
    return {
        "num_examples": float(len(data)),
        "num_right": float(sum(e.correct for e in data)),
        "first_loss": losses[0],
        "last_epoch_loss": sum(losses[-steps_per_epoch:]) / steps_per_epoch,
    }


def reward_accuracy(reward_model: RewardModel, examples: Sequence[RewardExample]) -> float:
    """Fraction of examples whose verdict matches the label."""
    if not examples:
        raise ValueError("reward_accuracy needs at least one example")
    verdicts = reward_model.score_batch([(e.question, e.answer) for e in examples])
    return sum(v.correct == e.correct for v, e in zip(verdicts, examples)) / len(examples)


__all__ = [
    "RewardExample", "RewardModel", "INPUT_TEMPLATE", "load_examples", "save_examples", "balance_examples",
    "train_reward_model", "reward_accuracy",
]
