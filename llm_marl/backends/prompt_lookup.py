"""Draft tokens for speculative decoding, looked up in a sequence's own tokens (prompt lookup).

In a multi-turn debate an agent's answer mostly repeats text already in its prompt: its own
earlier answer, the other agents' answers, the question. A decode step at a few rows costs
little more for several tokens per row than for one (the step streams every weight once), so a
backend can feed, after each row's newest token, the tokens that followed the latest earlier
occurrence of the row's last three tokens, and keep those the model would have produced itself
(:func:`accepted_drafts`). With greedy decoding the output is the same token for token (up to
float rounding of the wider products); the model does fewer, wider steps.

Drafts that continue a 3-token match are kept far more often than those after a 2- or 1-token match,
so only 3-token matches draft. A step's cost grows with rows x width, steeply at many rows;
:func:`step_width` weighs that against the tokens the drafts are expected to add. llama.cpp does not
draft: its steps cost about the same per token at any width, so fewer, wider steps save no time there.
"""
from __future__ import annotations

from array import array
from collections.abc import Sequence

NGRAM = 3               # the row's last tokens matched (after shorter matches drafts were kept ~1/3 of the time)
DRAFT_TOKENS = 6        # at most this many draft tokens per row and step
DRAFT_FREE_POSITIONS = 30.0   # a decode step's fixed cost (weights streamed, per-layer overhead) in positions' compute


class PromptLookup:
    """One row's tokens (prompt, then what it generated), searchable for the continuation of its last n-gram.

    The tokens are kept as 4-byte integers in a ``bytearray`` so that ``rfind`` (C speed) finds an
    earlier occurrence; a match is used only at a token boundary.
    """

    __slots__ = ("_bytes",)
    SIZE = 4                                  # bytes per token

    def __init__(self, tokens: Sequence[int]) -> None:
        self._bytes = bytearray(array("i", tokens).tobytes())

    def extend(self, tokens: Sequence[int]) -> None:
        """Append generated tokens."""
        self._bytes += array("i", tokens).tobytes()

    def draft(self, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens that followed the latest earlier occurrence of the last :data:`NGRAM` tokens.

        ``[]`` if they occur nowhere earlier.
        """
        data, size = self._bytes, self.SIZE
        if max_tokens < 1 or len(data) <= NGRAM * size:
            return []
        suffix = bytes(data[-NGRAM * size:])
        end = len(data) - size                # an occurrence that ends at least one token before the last
        while end >= NGRAM * size:
            start = data.rfind(suffix, 0, end)
            if start < 0:
                break
            if start % size == 0:
                follow = start + NGRAM * size
                return list(array("i", bytes(data[follow:follow + max_tokens * size])))
            end = start + NGRAM * size - 1    # misaligned: look further back
        return []


class DraftRecord:
    """How often one row's drafts held: a Beta-like estimate of the chance that its next draft token is kept."""

    __slots__ = ("fed", "kept")
    PRIOR_RATE, PRIOR_WEIGHT = 0.8, 2.0   # before a row has fed any: 3-token matches are usually kept

    def __init__(self) -> None:
        self.fed = self.kept = 0

    def update(self, fed: int, kept: int) -> None:
        """Count a step's drafts: ``fed`` of them, the first ``kept`` kept."""
        self.fed += fed
        self.kept += kept

    @property
    def rate(self) -> float:
        """The estimated chance that the row's next draft token is kept."""
        return (self.kept + self.PRIOR_RATE * self.PRIOR_WEIGHT) / (self.fed + self.PRIOR_WEIGHT)


def step_width(drafts: Sequence[Sequence[int]], rates: Sequence[float], free_positions: float) -> int:
    """Positions per row for the next decode step: 1 (no drafts) up to 1 + the longest draft.

    Every row is fed the same width (the batch is rectangular), so a step costs about
    ``free_positions + rows x width`` position-costs (``free_positions``: what the step costs anyway,
    streaming the weights, in units of one position's compute). A row with ``d`` drafts and keep-rate
    ``a`` is expected to add ``1 + a + a^2 + ... + a^min(d, width-1)`` tokens. The width with the least
    cost per expected token wins: wide at a few rows (the weights dominate), 1 at many rows unless
    the drafts nearly always hold.
    """
    rows = len(drafts)
    longest = max(map(len, drafts), default=0)
    best, best_cost = 1, (free_positions + rows) / max(rows, 1)
    for width in range(2, longest + 2):
        tokens = 0.0
        for draft, rate in zip(drafts, rates):
            d = min(len(draft), width - 1)
            tokens += 1 + (rate * (1 - rate ** d) / (1 - rate) if rate < 1 else d)
        cost = (free_positions + rows * width) / tokens
        if cost < best_cost:
            best, best_cost = width, cost
    return best


def accepted_drafts(drafts: Sequence[int], chosen: Sequence[int]) -> int:
    """How many leading drafts equal the tokens the model chose at the positions before them.

    ``chosen[j]`` is the token chosen after input position ``j`` (the row's newest token at ``j = 0``,
    then the drafts); draft ``j`` stands in for ``chosen[j]``, so drafts are kept while they agree.
    """
    kept = 0
    for draft, choice in zip(drafts, chosen):
        if draft != choice:
            break
        kept += 1
    return kept
