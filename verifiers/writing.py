"""Joint reward for two-agent writing: structure, style consistency and coherence.

Two agents write two parts of one text (``part0`` by agent 0, ``part1`` by agent 1) and share one
reward. :func:`score_writing` follows the level-gated scheme of CoMLRL's writing tasks
(LLM_Collab_Writing, AAAI'26): each level adds its share only if the previous level passed,
and a value outside a level's outer band adds 0 and **stops** the evaluation (later levels are 0).

| level | component | rule | max |
|---|---|---|---|
| 1 | structure | both parts have ``min_words..max_words`` words (whitespace-split), else 0 and stop | 0.5 |
| 2 | structure | character-length ratio ``len(part1) / len(part0)`` scored by ``length_ratio_band`` (full inside, linear ramps, gate) | 1.0 |
| 3 | structure | distinct-word ratio ``distinct(part1) / distinct(part0)`` scored by ``distinct_ratio_band`` | 0.5 |
| 4a | style_consistency | ``0.6 * min(Jaccard, jaccard_cap) / jaccard_cap`` on the content-word sets of the two parts (stopwords removed) | 0.6 |
| 4b | coherence | ``0.4 * transition score``: 0 with no transition category, else ``0.4 + 0.05 * (categories - 1)``, capped at 1 | 0.4 |

With the 12 transition categories the transition score tops out at ``0.4 + 0.05 * 11 = 0.95``,
so the reachable maximum is 2.98 of the nominal 3.0 (as in CoMLRL).

A band ``(gate_low, full_low, full_high, gate_high)`` scores a value ``x`` as 1 on
``[full_low, full_high]``, ramps linearly from 0 at ``gate_low`` to 1 at ``full_low`` and from
1 at ``full_high`` to 0 at ``gate_high``; ``x < gate_low`` or ``x > gate_high`` scores 0 and
stops. The band edges themselves are inside (a value exactly at ``gate_low`` scores 0 but the
evaluation goes on), as in CoMLRL's code.

TLDR bands (:data:`TLDR_BANDS`, total max 3.0):

| quantity | full credit | linear ramps | stop if |
|---|---|---|---|
| words per part (both) | 8 – 256 | — | outside |
| char-length ratio part1/part0 | [1.6, 3.2] | [1.1, 1.6), (3.2, 5.0] | < 1.1 or > 5.0 |
| distinct-word ratio part1/part0 | >= 2.0 | [1.3, 2.0) | < 1.3 |
| Jaccard cap (content words) | >= 0.03 | [0, 0.03) | — |
| transitions counted in | part1 only | | |

arXiv bands (:data:`ARXIV_BANDS`, total max 3.0; CoMLRL's docstring states other length and
vocabulary ranges, these are the ones its code applies):

| quantity | full credit | linear ramps | stop if |
|---|---|---|---|
| words per part (both) | 128 – 256 | — | outside |
| char-length ratio part1/part0 | [1.3, 1.6] | [0.8, 1.3), (1.6, 2.0] | < 0.8 or > 2.0 |
| distinct-word ratio part1/part0 | [0.7, 1.3] | [0.5, 0.7), (1.3, 1.7] | < 0.5 or > 1.7 |
| Jaccard cap (content words) | >= 0.23 | [0, 0.23) | — |
| transitions counted in | both parts | | |

Definitions (and where they differ from CoMLRL's code):

* words: ``text.split()``; distinct words: the set of lowercase ``\\w+`` tokens. CoMLRL's
  docstring says stopwords are excluded from the distinct-word ratio but its code counts all
  words; we follow the code (``distinct_exclude_stopwords=False``).
* character length: ``len(text.strip())`` (CoMLRL uses the raw length).
* transition categories: the same 12 categories as CoMLRL (elaboration, examples, explanation,
  cause_effect, contrast, sequence, emphasis, summary, comparison, concession, condition,
  time) with our own phrase lists. Phrases match on word boundaries
  (``transition_match="word"``); CoMLRL matches raw substrings, so e.g. ``"as"`` inside
  ``"was"`` counts there — pass ``transition_match="substring"`` to reproduce that.
* Jaccard of two parts without content words is 0 (CoMLRL: 1.0 when both sets are empty).

**Quality factor.** The level terms reward shapes (lengths, ratios, shared words, transition
words) that degenerate text can hit: a repeated header makes a short part with few distinct
words, a copy of the post has the post's vocabulary, a list of transition words earns the
coherence term. Every component is therefore multiplied by a quality factor in [0, 1], the
product over both parts of these terms (each a field; ``None`` or 0 turns it off;
:func:`without_quality_factor` turns all off and gives CoMLRL's reward as published):

| term | measure of a part | full credit | zero at |
|---|---|---|---|
| repetition (``repetition_band``) | distinct word 3-grams / 3-grams | >= 0.85 | <= 0.5 |
| copy (``copy_band``, needs ``source``) | share of word 4-grams not in the source | >= 0.6 | <= 0.2 |
| headers (``header_penalty``) | ``1 - 0.25 * labels`` (``SUBREDDIT:``, ``**Summary**:``, ``# ...``) | no label | 4 labels |
| content (``content_band``) | share of words that are neither stopwords nor transition words | 0.25 - 0.8 | <= 0.1 (filler), 1.0 (word salad) |
| relevance (``relevance_band``, needs ``source``) | share of the content words found in the source | >= 0.15 | 0 |

The thresholds sit below what human-written TL;DRs reach, so honest text keeps its full score.
``details["quality"]`` holds the factor and each part's terms and measures.

Every band and weight is a field of :class:`WritingRewardConfig`; start from a preset with
``dataclasses.replace(TLDR_BANDS, ...)``. ``details["components"]`` holds the three named
components (their sum is the score), ``details["subscores"]`` the five level terms,
``details["measures"]`` the raw measurements, ``details["stopped_at"]`` the failing level
and ``details["ungated"]`` what each term would be without gating (for feedback and logs).

An optional :class:`~verifiers.semantic.SemanticJudge` (off by default; defined in
:mod:`verifiers.semantic`, re-exported here) adds two embedding-based terms: coverage of the
source by the joint text and consistency of the two parts.
"""  # noqa: E501 (Markdown table rows cannot wrap)
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Literal

from . import Verdict
from .semantic import SemanticJudge, split_sentences

WORD_RE = re.compile(r"\w+")

# Common English function words, removed before the Jaccard overlap (our own list).
STOPWORDS: frozenset[str] = frozenset("""
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further had
has have having he her here hers herself him himself his how i if in into is it its itself just
me more most my myself no nor not now of off on once only or other our ours ourselves out over own
same she should so some such than that the their theirs them themselves then there these they this
those through to too under until up us very was we were what when where which while who whom why
will with would you your yours yourself yourselves
""".split())

# The 12 transition categories of CoMLRL's writing reward; the phrase lists are our own.
TRANSITION_CATEGORIES: Mapping[str, tuple[str, ...]] = {
    "elaboration": ("furthermore", "moreover", "additionally", "in addition", "besides", "also",
                    "as well as", "what is more", "not only", "along with", "together with",
                    "coupled with", "equally important"),
    "examples": ("for example", "for instance", "such as", "including", "namely", "to illustrate",
                 "in particular", "particularly", "specifically", "especially", "notably",
                 "as an illustration", "case in point"),
    "explanation": ("that is", "in other words", "to clarify", "put simply", "simply put",
                    "more precisely", "to put it differently", "which means", "this means",
                    "in fact", "actually", "essentially"),
    "cause_effect": ("therefore", "thus", "consequently", "as a result", "hence", "accordingly",
                     "because of this", "for this reason", "due to", "so that", "thereby",
                     "which led to", "leads to", "resulting in", "owing to", "as a consequence"),
    "contrast": ("however", "but", "yet", "on the other hand", "in contrast", "by contrast",
                 "conversely", "instead", "rather", "on the contrary", "alternatively",
                 "whereas", "unlike"),
    "sequence": ("first", "firstly", "second", "secondly", "third", "next", "then", "after that",
                 "afterwards", "finally", "lastly", "initially", "subsequently", "to begin with",
                 "following this", "eventually"),
    "emphasis": ("indeed", "certainly", "clearly", "obviously", "undoubtedly", "of course",
                 "above all", "most importantly", "significantly", "in particular", "especially",
                 "definitely", "without a doubt"),
    "summary": ("in summary", "in conclusion", "to sum up", "to summarize", "overall",
                "in short", "in brief", "all in all", "ultimately", "on the whole",
                "in the end", "tl;dr"),
    "comparison": ("similarly", "likewise", "in the same way", "just as", "just like",
                   "compared to", "compared with", "in comparison", "equally", "by the same token",
                   "correspondingly"),
    "concession": ("although", "though", "even though", "despite", "in spite of", "nevertheless",
                   "nonetheless", "regardless", "admittedly", "even so", "granted",
                   "all the same"),
    "condition": ("if", "unless", "provided that", "as long as", "in case", "otherwise",
                  "assuming", "given that", "even if", "only if", "whether or not"),
    "time": ("when", "while", "meanwhile", "before", "after", "until", "since", "during",
             "at the same time", "previously", "later", "recently", "currently", "now that",
             "immediately", "soon"),
}


@dataclass(frozen=True)
class Band:
    """A piecewise-linear score band on a ratio (see the module docstring)."""

    gate_low: float
    full_low: float
    full_high: float = math.inf
    gate_high: float = math.inf

    def __post_init__(self) -> None:
        edges = (self.gate_low, self.full_low, self.full_high, self.gate_high)
        if any(math.isnan(e) for e in edges) or not (edges[0] <= edges[1] <= edges[2] <= edges[3]):
            raise ValueError(f"Band edges must satisfy gate_low <= full_low <= full_high <= gate_high, got {edges}")

    def passes(self, x: float) -> bool:
        """Whether ``x`` lies inside the outer edges (evaluation continues)."""
        return self.gate_low <= x <= self.gate_high

    def score(self, x: float) -> float:
        """1 on the full band, linear ramps to 0 at the outer edges, 0 outside."""
        if not self.passes(x):
            return 0.0
        if x < self.full_low:
            return (x - self.gate_low) / (self.full_low - self.gate_low)
        if x > self.full_high:
            return 1.0 - (x - self.full_high) / (self.gate_high - self.full_high)
        return 1.0

    def describe(self) -> str:
        """Human-readable band, e.g. ``full on [1.6, 3.2], some credit on [1.1, 5.0]``."""
        def fmt(lo: float, hi: float) -> str:
            return f">= {lo:g}" if math.isinf(hi) else f"[{lo:g}, {hi:g}]"
        return f"full credit {fmt(self.full_low, self.full_high)}, some credit {fmt(self.gate_low, self.gate_high)}"


@dataclass(frozen=True)
class WritingRewardConfig:
    """Bands and weights of the level-gated writing reward (defaults: CoMLRL's TLDR reward).

    Parameters that control level 1 (structure: lengths):
        min_words, max_words: inclusive word range each part must have.
        length_range_weight: reward when both parts are in range.
    Parameters that control levels 2 and 3 (structure: ratios):
        length_ratio_band, length_ratio_weight: band on ``len(part1) / len(part0)`` (characters).
        distinct_ratio_band, distinct_ratio_weight: band on the distinct-word ratio.
        distinct_exclude_stopwords: drop stopwords before counting distinct words.
    Parameters that control level 4 (style consistency and coherence):
        jaccard_cap, jaccard_weight: ``jaccard_weight * min(J, cap) / cap``.
        transition_weight, transition_base, transition_step: ``transition_weight *
            min(1, base + step * (categories - 1))`` when at least one category is present.
        transition_text: ``"part1"`` (TLDR: the detailed part) or ``"joint"`` (both parts).
        transition_match: ``"word"`` (word-boundary phrases) or ``"substring"`` (CoMLRL).
        stopwords, transition_categories: the word lists.
    Parameters that control gating and the semantic judge:
        gated: stop at the first failed level (CoMLRL); ``False`` sums all terms ungated.
        semantic_coverage_weight, semantic_consistency_weight: weights of the judge's terms
            (used only when a :class:`SemanticJudge` is passed to :func:`score_writing`).
    """

    min_words: int = field(default=8, metadata={"help": "minimum words in each part"})
    max_words: int = field(default=256, metadata={"help": "maximum words in each part"})
    length_range_weight: float = field(default=0.5, metadata={"help": "reward when both parts are in range"})
    length_ratio_band: Band = field(default=Band(1.1, 1.6, 3.2, 5.0),
                                    metadata={"help": "band on the char-length ratio part1/part0"})
    length_ratio_weight: float = field(default=1.0, metadata={"help": "max reward of the length ratio"})
    distinct_ratio_band: Band = field(default=Band(1.3, 2.0), metadata={"help": "band on the distinct-word ratio"})
    distinct_ratio_weight: float = field(default=0.5, metadata={"help": "max reward of the distinct-word ratio"})
    distinct_exclude_stopwords: bool = field(
        default=False, metadata={"help": "drop stopwords before counting distinct words"}
    )
    jaccard_cap: float = field(default=0.03, metadata={"help": "Jaccard value that earns full consistency credit"})
    jaccard_weight: float = field(default=0.6, metadata={"help": "max reward of style consistency"})
    transition_weight: float = field(default=0.4, metadata={"help": "max reward of coherence"})
    transition_base: float = field(default=0.4, metadata={"help": "transition score with one category"})
    transition_step: float = field(default=0.05, metadata={"help": "transition score per extra category"})
    transition_text: Literal["part1", "joint"] = field(
        default="part1", metadata={"help": "where transitions are counted"}
    )
    transition_match: Literal["word", "substring"] = field(default="word", metadata={"help": "phrase matching mode"})
    gated: bool = field(default=True, metadata={"help": "stop at the first failed level"})
    repetition_ngram: int = field(default=3, metadata={"help": "word n-gram size of the repetition measure"})
    repetition_band: Band | None = field(default=Band(0.5, 0.85),
                                         metadata={"help": "band on each part's distinct n-gram share (None: off)"})
    copy_ngram: int = field(default=4, metadata={"help": "word n-gram size of the copy-of-source measure"})
    copy_band: Band | None = field(
        default=Band(0.2, 0.6), metadata={"help": "band on each part's share of n-grams not in the source (None: off)"}
    )
    header_penalty: float = field(default=0.25, metadata={"help": "quality lost per header label in a part (0: off)"})
    content_band: Band | None = field(default=Band(0.1, 0.25, 0.8, 1.0),
                                      metadata={"help": "band on each part's share of content words (None: off)"})
    relevance_band: Band | None = field(
        default=Band(0.0, 0.15),
        metadata={"help": "band on each part's share of content words found in the source (None: off)"},
    )
    semantic_coverage_weight: float = field(default=1.0, metadata={"help": "weight of the judge's source coverage"})
    semantic_consistency_weight: float = field(default=0.5, metadata={"help": "weight of the judge's part consistency"})
    stopwords: frozenset[str] = field(default=STOPWORDS, repr=False)
    transition_categories: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: dict(TRANSITION_CATEGORIES), repr=False
    )

    def __post_init__(self) -> None:
        if not (
            isinstance(self.min_words, int)
            and isinstance(self.max_words, int)
            and 0 <= self.min_words <= self.max_words
        ):
            raise ValueError(
                f"need integers 0 <= min_words <= max_words, got min_words={self.min_words!r}, "
                f"max_words={self.max_words!r}"
            )
        if not self.jaccard_cap > 0:
            raise ValueError(f"jaccard_cap must be > 0, got {self.jaccard_cap}")
        if self.transition_text not in ("part1", "joint"):
            raise ValueError(f"transition_text must be 'part1' or 'joint', got {self.transition_text!r}")
        if self.transition_match not in ("word", "substring"):
            raise ValueError(f"transition_match must be 'word' or 'substring', got {self.transition_match!r}")
        for name in ("length_range_weight", "length_ratio_weight", "distinct_ratio_weight", "jaccard_weight",
                     "transition_weight", "transition_base", "transition_step",
                     "semantic_coverage_weight", "semantic_consistency_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("length_ratio_band", "distinct_ratio_band"):
            if not isinstance(getattr(self, name), Band):
                raise ValueError(
                    f"{name} must be a Band(gate_low, full_low, full_high, gate_high), got {getattr(self, name)!r}"
                )
        for name in ("repetition_band", "copy_band", "content_band", "relevance_band"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), Band):
                raise ValueError(
                    f"{name} must be a Band(gate_low, full_low, ...) or None (off), got {getattr(self, name)!r}"
                )
        for name in ("repetition_ngram", "copy_ngram"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not 0 <= self.header_penalty <= 1:
            raise ValueError(f"header_penalty must be in [0, 1] (quality lost per header), got {self.header_penalty}")

    @property
    def max_score(self) -> float:
        """The heuristic maximum (3.0 for both presets), without the semantic judge."""
        return (self.length_range_weight + self.length_ratio_weight + self.distinct_ratio_weight
                + self.jaccard_weight + self.transition_weight)


TLDR_BANDS = WritingRewardConfig()
"""CoMLRL's TLDR reward: concise part0, detailed part1 (1.6-3.2x longer, >= 2x distinct words)."""

ARXIV_BANDS = WritingRewardConfig(
    min_words=128, max_words=256,
    length_ratio_band=Band(0.8, 1.3, 1.6, 2.0),
    distinct_ratio_band=Band(0.5, 0.7, 1.3, 1.7),
    jaccard_cap=0.23,
    transition_text="joint",
)
"""CoMLRL's arXiv reward: two introduction parts of similar size (part1 1.3-1.6x longer)."""


def without_quality_factor(config: WritingRewardConfig) -> WritingRewardConfig:
    """``config`` with every quality term off: CoMLRL's reward as published, which degenerate text can max."""
    return replace(config, repetition_band=None, copy_band=None, header_penalty=0.0, content_band=None,
                   relevance_band=None)


def word_count(text: str) -> int:
    """Whitespace-separated words."""
    return len(text.split())


def word_set(text: str, stopwords: frozenset[str] = frozenset()) -> set[str]:
    """Lowercase ``\\w+`` tokens of ``text`` minus ``stopwords``."""
    return {w for w in WORD_RE.findall(text.lower()) if w not in stopwords}


def jaccard(a: set[str], b: set[str]) -> float:
    """|a ∩ b| / |a ∪ b|, 0 for two empty sets."""
    union = a | b
    return len(a & b) / len(union) if union else 0.0


@lru_cache(maxsize=64)
def _transition_patterns(
    categories: tuple[tuple[str, tuple[str, ...]], ...], mode: str
) -> tuple[tuple[str, re.Pattern], ...]:
    patterns = []
    for name, phrases in categories:
        alternatives = "|".join(re.escape(p.lower()) for p in sorted(phrases, key=len, reverse=True))
        regex = f"(?:{alternatives})" if mode == "substring" else rf"(?<!\w)(?:{alternatives})(?!\w)"
        patterns.append((name, re.compile(regex)))
    return tuple(patterns)


def find_transitions(text: str, config: WritingRewardConfig = TLDR_BANDS) -> dict[str, str]:
    """Transition categories present in ``text``: category -> first phrase found."""
    key = tuple((name, tuple(phrases)) for name, phrases in config.transition_categories.items())
    lowered = text.lower()
    found = {}
    for name, pattern in _transition_patterns(key, config.transition_match):
        match = pattern.search(lowered)
        if match:
            found[name] = match.group(0)
    return found


# A header label: a markdown heading, a line that opens with a label of one or two words and a colon
# ("SUBREDDIT:", "Detailed summary:", "**TL;DR**:"), or an all-caps label with a colon anywhere.
HEADER_RE = re.compile(
    r"(?m)^[ \t]*(?:#{1,6}[ \t]+\S|[*_]{0,2}[A-Za-z][\w;/'-]*(?:[ \t][\w;/'-]+)?[*_]{0,2}:(?=\s|$))"
    r"|\b[A-Z][A-Z;/]{2,}:")
TRANSITION_WORDS: frozenset[str] = frozenset(
    w for phrases in TRANSITION_CATEGORIES.values() for phrase in phrases for w in WORD_RE.findall(phrase))


def word_ngrams(text: str, n: int) -> list[tuple[str, ...]]:
    """Lowercase ``\\w+`` word n-grams of ``text`` in order."""
    words = WORD_RE.findall(text.lower())
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def distinct_ngram_share(text: str, n: int = 3) -> float:
    """Distinct word n-grams / n-grams; 1.0 for a text shorter than ``n`` words (nothing repeats)."""
    grams = word_ngrams(text, n)
    return len(set(grams)) / len(grams) if grams else 1.0


def novel_ngram_share(text: str, source: str, n: int = 4) -> float:
    """Share of the word n-grams of ``text`` that do not occur in ``source``; 1.0 for a text shorter than ``n``."""
    grams = word_ngrams(text, n)
    if not grams:
        return 1.0
    seen = set(word_ngrams(source, n))
    return sum(g not in seen for g in grams) / len(grams)


def count_headers(text: str) -> int:
    """Header labels in ``text`` (see :data:`HEADER_RE`): ``"SUBREDDIT: x TITLE: y"`` has 2."""
    return len(HEADER_RE.findall(text))


def content_words(text: str, config: WritingRewardConfig = TLDR_BANDS) -> list[str]:
    """Lowercase words of ``text`` that are neither stopwords nor words of a transition phrase."""
    transition_words = TRANSITION_WORDS if config.transition_categories == TRANSITION_CATEGORIES else frozenset(
        w for phrases in config.transition_categories.values() for p in phrases for w in WORD_RE.findall(p.lower()))
    return [w for w in WORD_RE.findall(text.lower()) if w not in config.stopwords and w not in transition_words]


def text_quality(text: str, config: WritingRewardConfig = TLDR_BANDS, source: str | None = None) -> dict[str, Any]:
    """Degeneracy measures of one part and the quality factor in [0, 1] they allow (see the module docstring).

    ``factor`` is the product of the enabled terms: repetition (distinct n-gram share), copy
    (novel n-gram share against ``source``), headers (``1 - header_penalty * headers``), content
    (content-word share) and relevance (share of content words found in ``source``). Copy and
    relevance need ``source`` and are skipped without it.
    """
    words = WORD_RE.findall(text.lower())
    content = content_words(text, config)
    measures: dict[str, Any] = {
        "distinct_ngram_share": distinct_ngram_share(text, config.repetition_ngram),
        "headers": count_headers(text),
        "content_share": len(content) / len(words) if words else 0.0,
    }
    terms = {
        "repetition": config.repetition_band.score(measures["distinct_ngram_share"]) if config.repetition_band else 1.0,
        "headers": max(0.0, 1.0 - config.header_penalty * measures["headers"]),
        "content": config.content_band.score(measures["content_share"]) if config.content_band else 1.0,
    }
    if source is not None:
        source_words = set(WORD_RE.findall(source.lower()))
        measures["novel_ngram_share"] = novel_ngram_share(text, source, config.copy_ngram)
        measures["relevance"] = sum(w in source_words for w in content) / len(content) if content else 0.0
        terms["copy"] = config.copy_band.score(measures["novel_ngram_share"]) if config.copy_band else 1.0
        terms["relevance"] = config.relevance_band.score(measures["relevance"]) if config.relevance_band else 1.0
    return {"factor": math.prod(terms.values()), "terms": terms, "measures": measures}


def transition_score(num_categories: int, config: WritingRewardConfig = TLDR_BANDS) -> float:
    """0 without transitions, else ``min(1, base + step * (n - 1))``."""
    if num_categories <= 0:
        return 0.0
    return min(1.0, config.transition_base + config.transition_step * (num_categories - 1))


def score_writing(part0: str, part1: str, config: WritingRewardConfig = TLDR_BANDS, *,
                  source: str | None = None, judge: SemanticJudge | None = None) -> Verdict:
    """Joint level-gated reward of two parts; components and measurements in ``details``."""
    if not isinstance(part0, str) or not isinstance(part1, str):
        raise ValueError(f"part0 and part1 must be str, got {type(part0).__name__} and {type(part1).__name__}")
    if not isinstance(config, WritingRewardConfig):
        raise ValueError(f"config must be a WritingRewardConfig (e.g. TLDR_BANDS), got {type(config).__name__}")
    words = [word_count(part0), word_count(part1)]
    chars = [len(part0.strip()), len(part1.strip())]
    distinct_stop = config.stopwords if config.distinct_exclude_stopwords else frozenset()
    distinct = [len(word_set(part0, distinct_stop)), len(word_set(part1, distinct_stop))]
    length_ratio = chars[1] / chars[0] if chars[0] else math.inf
    distinct_ratio = distinct[1] / distinct[0] if distinct[0] else math.inf
    overlap = jaccard(word_set(part0, config.stopwords), word_set(part1, config.stopwords))
    transition_source = part1 if config.transition_text == "part1" else f"{part0}\n{part1}"
    transitions = find_transitions(transition_source, config)

    lengths_ok = all(config.min_words <= n <= config.max_words for n in words)
    # An empty part0 makes the ratios undefined: treat as outside every band.
    ratio_ok = chars[0] > 0 and config.length_ratio_band.passes(length_ratio)
    distinct_ok = distinct[0] > 0 and config.distinct_ratio_band.passes(distinct_ratio)
    ungated = {
        "length_range": config.length_range_weight if lengths_ok else 0.0,
        "length_ratio": config.length_ratio_weight
        * (config.length_ratio_band.score(length_ratio) if ratio_ok else 0.0),
        "distinct_ratio": config.distinct_ratio_weight
        * (config.distinct_ratio_band.score(distinct_ratio) if distinct_ok else 0.0),
        "jaccard": config.jaccard_weight * min(overlap, config.jaccard_cap) / config.jaccard_cap,
        "transitions": config.transition_weight * transition_score(len(transitions), config),
    }
    stopped_at = None
    if config.gated:
        for level, ok in (("length_range", lengths_ok), ("length_ratio", ratio_ok), ("distinct_ratio", distinct_ok)):
            if not ok:
                stopped_at = level
                break
    reached = list(ungated) if stopped_at is None else list(ungated)[: list(ungated).index(stopped_at)]
    subscores = {k: (v if k in reached else 0.0) for k, v in ungated.items()}
    components = {
        "structure": subscores["length_range"] + subscores["length_ratio"] + subscores["distinct_ratio"],
        "style_consistency": subscores["jaccard"],
        "coherence": subscores["transitions"],
    }
    details: dict[str, Any] = {
        "components": components,
        "subscores": subscores,
        "ungated": ungated,
        "stopped_at": stopped_at,
        "max_score": config.max_score,
        "measures": {
            "words": words, "chars": chars,
            "length_ratio": length_ratio if chars[0] else None,      # None: part0 is empty
            "distinct_words": distinct,
            "distinct_ratio": distinct_ratio if distinct[0] else None,  # None: part0 has no words
            "jaccard": overlap,
            "transition_categories": transitions,
        },
    }
    quality = [text_quality(part, config, source) for part in (part0, part1)]
    factor = quality[0]["factor"] * quality[1]["factor"]
    details["quality"] = {"factor": factor, "parts": quality}
    if judge is not None:
        if source is None:
            raise ValueError("the semantic judge needs the source text: pass source=... to score_writing")
        semantic = judge.score(source, part0, part1)
        details["semantic"] = semantic
        components["semantic_coverage"] = config.semantic_coverage_weight * semantic["coverage"]
        components["semantic_consistency"] = config.semantic_consistency_weight * semantic["consistency"]
        details["max_score"] = config.max_score + config.semantic_coverage_weight + config.semantic_consistency_weight
    for name in components:   # degenerate text (repeated, copied, headers, no content) earns a share of it
        components[name] *= factor
    return Verdict(score=float(sum(components.values())), correct=None, details=details)


def format_writing_feedback(verdict: Verdict, config: WritingRewardConfig = TLDR_BANDS) -> str:
    """Readable component scores and measurements of a :func:`score_writing` verdict."""
    d, m = verdict.details, verdict.details["measures"]
    lines = [f"Joint score: {verdict.score:.2f} / {d['max_score']:.2f}"]
    lines += [f"- {name}: {value:.2f}" for name, value in d["components"].items()]
    lines.append(
        f"- words per part: {m['words'][0]} and {m['words'][1]} (target {config.min_words}-{config.max_words} each)"
    )
    for label, key, band in (("length ratio", "length_ratio", config.length_ratio_band),
                             ("distinct-word ratio", "distinct_ratio", config.distinct_ratio_band)):
        value = "undefined (part 1 is empty)" if m[key] is None else f"{m[key]:.2f}"
        lines.append(f"- {label} part 2 / part 1: {value} ({band.describe()})")
    lines.append(f"- shared content vocabulary (Jaccard): {m['jaccard']:.3f} (full credit >= {config.jaccard_cap:g})")
    found = ", ".join(sorted(m["transition_categories"])) or "none"
    lines.append(f"- transition categories used: {found}")
    if "quality" in d and d["quality"]["factor"] < 1.0:
        for index, part in enumerate(d["quality"]["parts"]):
            lost = ", ".join(f"{name} {value:.2f}" for name, value in part["terms"].items() if value < 1.0)
            if lost:
                lines.append(f"- part {index + 1} quality factor {part['factor']:.2f} ({lost}): avoid repetition, "
                             "copying the source, header labels and filler words")
    if d["stopped_at"]:
        lines.append(f"Scoring stopped at '{d['stopped_at']}': later components earned 0.")
    return "\n".join(lines)


__all__ = [
    "Band",
    "WritingRewardConfig",
    "TLDR_BANDS",
    "ARXIV_BANDS",
    "STOPWORDS",
    "TRANSITION_CATEGORIES",
    "score_writing",
    "format_writing_feedback",
    "find_transitions",
    "transition_score",
    "word_count",
    "text_quality",
    "without_quality_factor",
    "distinct_ngram_share",
    "novel_ngram_share",
    "count_headers",
    "content_words",
    "HEADER_RE",
    "word_set",
    "jaccard",
    "split_sentences",
    "SemanticJudge",
]
