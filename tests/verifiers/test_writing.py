"""Writing verifier and writing-collaboration envs: each reward component against hand arithmetic."""
from __future__ import annotations

import dataclasses

import pytest

import llm_marl_envs
from llm_marl_envs.envs.arxiv_writing import normalize_arxiv_row
from llm_marl_envs.envs.tldr_writing import normalize_tldr_row
from verifiers.writing import (
    ARXIV_BANDS,
    TLDR_BANDS,
    Band,
    SemanticJudge,
    WritingRewardConfig,
    find_transitions,
    score_writing,
    without_quality_factor,
)

# Concise part: 10 words, 52 characters; distinct words: tom lost his keys missed the bus and
# arrived late (10); content words (stopwords his/the/and removed): tom lost keys missed bus
# arrived late (7).
CONCISE = "Tom lost his keys, missed the bus, and arrived late."
# Detailed part: 25 words, 151 characters, 24 distinct words; transitions "First" (sequence),
# "while" (time), "As a result" (cause_effect), "however" (contrast) = 4 categories.
DETAILED = ("First, Tom misplaced his house keys while rushing through breakfast. As a result, he missed "
            "the early bus; however, a kind coworker drove him downtown.")
# Longer detailed part: 32 words, 191 characters, 30 distinct words, the same 4 categories.
DETAILED_LONG = ("First, Tom misplaced his house keys while rushing through breakfast. As a result, he missed "
                 "the early bus downtown; however, a kind coworker drove him, so he arrived only twenty minutes late.")

# CoMLRL's arithmetic without the quality factor: the hand sums below use repeated or made-up words
COMLRL_TLDR = without_quality_factor(TLDR_BANDS)

TEXT_POST = {"task_id": "custom-0", "source": "SUBREDDIT: r/tifu\n\nPOST: I lost my keys and missed the bus."}


def components(verdict):
    return verdict.details["components"]


# ------------------------------------------------------------------ TLDR components
def test_tldr_full_structure_with_style_and_coherence():
    v = score_writing(CONCISE, DETAILED, TLDR_BANDS)
    m = v.details["measures"]
    assert m["words"] == [10, 25] and m["chars"] == [52, 151] and m["distinct_words"] == [10, 24]
    # length ratio 151 / 52 = 2.904 in [1.6, 3.2] -> 1.0; distinct ratio 24 / 10 = 2.4 >= 2.0 -> 0.5
    assert m["length_ratio"] == pytest.approx(151 / 52)
    assert m["distinct_ratio"] == pytest.approx(2.4)
    # content words of DETAILED (16): first tom misplaced house keys rushing breakfast result missed
    # early bus however kind coworker drove downtown; shared with CONCISE: tom keys missed bus = 4;
    # union = 7 + 16 - 4 = 19 -> Jaccard 4/19 = 0.2105 >= 0.03 -> 0.6 * 1
    assert m["jaccard"] == pytest.approx(4 / 19)
    assert set(m["transition_categories"]) == {"sequence", "time", "cause_effect", "contrast"}
    # transitions: 0.4 * (0.4 + 0.05 * (4 - 1)) = 0.4 * 0.55 = 0.22
    assert components(v) == pytest.approx({"structure": 0.5 + 1.0 + 0.5, "style_consistency": 0.6, "coherence": 0.22})
    assert v.score == pytest.approx(2.0 + 0.6 + 0.22)
    assert v.details["stopped_at"] is None and v.details["max_score"] == 3.0
    assert v.correct is None


def test_tldr_upper_length_ramp():
    v = score_writing(CONCISE, DETAILED_LONG, TLDR_BANDS)
    m = v.details["measures"]
    assert m["chars"] == [52, 191] and m["distinct_words"] == [10, 30]
    ratio = 191 / 52                     # 3.673 in (3.2, 5.0]: 1 - (3.673 - 3.2) / 1.8 = 0.7372
    assert v.details["subscores"]["length_ratio"] == pytest.approx(1 - (ratio - 3.2) / 1.8)
    # Jaccard: shared tom keys missed bus arrived late = 6; union 7 + 20 - 6 = 21 -> 0.286 -> capped
    assert m["jaccard"] == pytest.approx(6 / 21)
    assert v.score == pytest.approx(0.5 + (1 - (ratio - 3.2) / 1.8) + 0.5 + 0.6 + 0.22)


def test_tldr_distinct_ratio_exactly_at_gate_scores_zero_but_continues():
    detailed = "Tom lost his keys and missed the bus, so he arrived late today."
    v = score_writing(CONCISE, detailed, TLDR_BANDS)
    m = v.details["measures"]
    # 63 / 52 = 1.2115 in [1.1, 1.6): (1.2115 - 1.1) / 0.5 = 0.2231
    assert m["chars"] == [52, 63]
    # 13 distinct words / 10 = 1.3: the lower edge, 0 credit but the next level is still reached
    assert m["distinct_words"] == [10, 13]
    assert v.details["subscores"]["distinct_ratio"] == 0.0 and v.details["stopped_at"] is None
    # content words: tom lost keys missed bus arrived late today (8) vs 7 -> Jaccard 7/8 -> capped;
    # no transition ("so" alone is not one)
    assert m["jaccard"] == pytest.approx(7 / 8) and m["transition_categories"] == {}
    assert v.score == pytest.approx(0.5 + (63 / 52 - 1.1) / 0.5 + 0.0 + 0.6 + 0.0)


def test_tldr_distinct_ratio_ramp():
    detailed = CONCISE + " Later the bus driver apologized to Tom for leaving early."
    v = score_writing(CONCISE, detailed, TLDR_BANDS)
    m = v.details["measures"]
    # 110 / 52 = 2.115 -> full; 17 distinct / 10 = 1.7 in [1.3, 2.0): 0.5 * (1.7 - 1.3) / 0.7 = 0.2857
    assert m["chars"] == [52, 110] and m["distinct_words"] == [10, 17]
    assert v.details["subscores"]["distinct_ratio"] == pytest.approx(0.5 * 0.4 / 0.7)
    # one category ("Later", time): 0.4 * 0.4 = 0.16
    assert m["transition_categories"] == {"time": "later"}
    assert v.score == pytest.approx(0.5 + 1.0 + 0.5 * 0.4 / 0.7 + 0.6 + 0.16)


def test_gate_on_distinct_ratio_stops_style_and_coherence():
    doubled = f"{CONCISE} {CONCISE}"   # 105 chars (ratio 2.02, full) but 10 distinct words (ratio 1.0 < 1.3)
    v = score_writing(CONCISE, doubled, COMLRL_TLDR)
    assert v.details["stopped_at"] == "distinct_ratio"
    assert components(v) == {"structure": 1.5, "style_consistency": 0.0, "coherence": 0.0}
    assert v.details["ungated"]["jaccard"] == pytest.approx(0.6)   # what it would have earned
    assert v.score == 1.5
    # the quality factor: part1 has 18 word 3-grams, 10 distinct -> (10/18 - 0.5) / (0.85 - 0.5) of the score
    guarded = score_writing(CONCISE, doubled, TLDR_BANDS)
    assert guarded.details["quality"]["parts"][1]["measures"]["distinct_ngram_share"] == pytest.approx(10 / 18)
    assert guarded.score == pytest.approx(1.5 * (10 / 18 - 0.5) / 0.35)


def test_gate_on_length_ratio_stops_everything_after_structure():
    v = score_writing(CONCISE, CONCISE, TLDR_BANDS)   # ratio 1.0 < 1.1
    assert v.details["stopped_at"] == "length_ratio"
    assert v.score == 0.5 and components(v)["structure"] == 0.5


@pytest.mark.parametrize("part0, part1", [
    ("Too short to count here.", DETAILED),            # 5 words < 8
    (CONCISE, " ".join(["word"] * 257)),                # 257 words > 256
    ("", DETAILED),                                     # empty part
])
def test_gate_on_word_range_gives_zero(part0, part1):
    v = score_writing(part0, part1, TLDR_BANDS)
    assert v.score == 0.0 and v.details["stopped_at"] == "length_range"


def test_ungated_config_sums_every_term():
    v = score_writing(CONCISE, f"{CONCISE} {CONCISE}", dataclasses.replace(COMLRL_TLDR, gated=False))
    # length range 0.5 + ratio 1.0 + distinct 0 + Jaccard 1.0 (capped) -> 0.6 + no transitions
    assert v.score == pytest.approx(0.5 + 1.0 + 0.0 + 0.6 + 0.0)


def test_word_range_bounds_are_inclusive():
    eight = "one two three four five six seven eight"
    v = score_writing(eight, DETAILED, TLDR_BANDS)
    assert v.details["measures"]["words"][0] == 8 and v.details["subscores"]["length_range"] == 0.5


# ------------------------------------------------------------------ bands
@pytest.mark.parametrize("x, expected", [
    (1.0999, None), (1.1, 0.0), (1.35, 0.5), (1.6, 1.0), (2.4, 1.0), (3.2, 1.0),
    (4.1, 0.5), (5.0, 0.0), (5.0001, None),
])
def test_tldr_length_band_ramps_and_gates(x, expected):
    band = TLDR_BANDS.length_ratio_band
    # ramps: (x - 1.1) / 0.5 on [1.1, 1.6); 1 - (x - 3.2) / 1.8 on (3.2, 5.0]; None = stop
    if expected is None:
        assert not band.passes(x) and band.score(x) == 0.0
    else:
        assert band.passes(x) and band.score(x) == pytest.approx(expected)


@pytest.mark.parametrize("x, expected", [(1.29, None), (1.3, 0.0), (1.65, 0.5), (2.0, 1.0), (50.0, 1.0)])
def test_tldr_distinct_band(x, expected):
    band = TLDR_BANDS.distinct_ratio_band
    if expected is None:
        assert not band.passes(x)
    else:
        assert band.score(x) == pytest.approx(expected)


@pytest.mark.parametrize("band, x, expected", [
    # arXiv length ratio: full [1.3, 1.6], ramps [0.8, 1.3) and (1.6, 2.0]
    (ARXIV_BANDS.length_ratio_band, 0.79, None), (ARXIV_BANDS.length_ratio_band, 1.05, 0.5),
    (ARXIV_BANDS.length_ratio_band, 1.45, 1.0), (ARXIV_BANDS.length_ratio_band, 1.8, 0.5),
    (ARXIV_BANDS.length_ratio_band, 2.01, None),
    # arXiv distinct ratio: full [0.7, 1.3], ramps [0.5, 0.7) and (1.3, 1.7]
    (ARXIV_BANDS.distinct_ratio_band, 0.49, None), (ARXIV_BANDS.distinct_ratio_band, 0.6, 0.5),
    (ARXIV_BANDS.distinct_ratio_band, 1.0, 1.0), (ARXIV_BANDS.distinct_ratio_band, 1.5, 0.5),
    (ARXIV_BANDS.distinct_ratio_band, 1.71, None),
])
def test_arxiv_bands(band, x, expected):
    if expected is None:
        assert not band.passes(x)
    else:
        assert band.score(x) == pytest.approx(expected)


def tokens(prefix: str, count: int, width: int = 3) -> list[str]:
    return [f"{prefix}{i:0{width}d}" for i in range(count)]


def test_arxiv_scoring_by_hand():
    # part0: "first" + 130 tokens t000..t129 -> 131 words; chars 5 + 130 * 4 + 130 spaces = 655
    part0 = " ".join(["first"] + tokens("t", 130))
    # part1: "however" + t000..t039 (shared) + 90 tokens u000ab..u089ab + "therefore" -> 132 words;
    # chars 7 + 40 * 4 + 90 * 6 + 9 + 131 spaces = 847
    part1 = " ".join(["however"] + tokens("t", 40) + [t + "ab" for t in tokens("u", 90)] + ["therefore"])
    arxiv = without_quality_factor(ARXIV_BANDS)   # made-up tokens: all content words, a word salad
    v = score_writing(part0, part1, arxiv)
    m = v.details["measures"]
    assert m["words"] == [131, 132] and m["chars"] == [655, 847]
    ratio = 847 / 655                            # 1.2931 in [0.8, 1.3): (1.2931 - 0.8) / 0.5 = 0.9863
    assert v.details["subscores"]["length_ratio"] == pytest.approx((ratio - 0.8) / 0.5)
    assert m["distinct_ratio"] == pytest.approx(132 / 131)      # in [0.7, 1.3] -> 0.5
    # content words: {first, t000..t129} (131) and {however, t000..t039, u000ab.., therefore} (132):
    # shared 40, union 131 + 132 - 40 = 223 -> J = 0.1794 < cap 0.23 -> 0.6 * 0.1794 / 0.23
    jac = 40 / 223
    assert m["jaccard"] == pytest.approx(jac)
    # transitions over both parts (arXiv): first (sequence) + however (contrast) + therefore
    # (cause_effect) = 3 -> 0.4 * (0.4 + 0.1) = 0.2
    assert set(m["transition_categories"]) == {"sequence", "contrast", "cause_effect"}
    assert components(v) == pytest.approx({
        "structure": 0.5 + (ratio - 0.8) / 0.5 + 0.5, "style_consistency": 0.6 * jac / 0.23, "coherence": 0.2})
    # the TLDR setting counts only part1's transitions: contrast + cause_effect = 2 -> 0.4 * 0.45
    tldr_like = dataclasses.replace(arxiv, transition_text="part1")
    assert components(score_writing(part0, part1, tldr_like))["coherence"] == pytest.approx(0.18)


def test_arxiv_word_floor():
    assert score_writing(CONCISE, DETAILED, ARXIV_BANDS).details["stopped_at"] == "length_range"  # < 128 words


def test_transition_matching_modes():
    text = "A different button."
    assert find_transitions(text, TLDR_BANDS) == {}         # word boundaries: no transition phrase
    substring = dataclasses.replace(TLDR_BANDS, transition_match="substring")
    # CoMLRL-style substring matching finds "if" in "different" and "but" in "button"
    assert find_transitions(text, substring) == {"condition": "if", "contrast": "but"}


def test_invalid_configs_raise_clear_errors():
    with pytest.raises(ValueError, match="gate_low <= full_low"):
        Band(2.0, 1.0)
    with pytest.raises(ValueError, match="min_words"):
        WritingRewardConfig(min_words=10, max_words=5)
    with pytest.raises(ValueError, match="transition_match"):
        WritingRewardConfig(transition_match="fuzzy")
    with pytest.raises(ValueError, match="must be str"):
        score_writing(None, "text")


# ------------------------------------------------------------------ envs
@pytest.mark.parametrize("env_id", ["tldr_writing-v0", "arxiv_writing-v0"])
@pytest.mark.parametrize("num_agents", [1, 3])
def test_writing_envs_need_exactly_two_agents(env_id, num_agents):
    with pytest.raises(ValueError, match="exactly 2 agents"):
        llm_marl_envs.make(env_id, num_agents=num_agents)


def test_joint_reward_and_components_in_infos():
    env = llm_marl_envs.make("tldr_writing-v0")
    env.reset(seed=0, options={"task": TEXT_POST})
    _, rewards, terms, _, infos = env.step({"agent_0": CONCISE, "agent_1": DETAILED})
    assert rewards == {"agent_0": pytest.approx(2.82), "agent_1": pytest.approx(2.82)}
    assert all(terms.values())
    for agent in ("agent_0", "agent_1"):
        assert infos[agent]["verdict"].details["components"] == pytest.approx(
            {"structure": 2.0, "style_consistency": 0.6, "coherence": 0.22})


def test_agent_order_matters_for_the_joint_reward():
    env = llm_marl_envs.make("tldr_writing-v0")
    env.reset(seed=0, options={"task": TEXT_POST})
    _, rewards, *_ = env.step({"agent_0": DETAILED, "agent_1": CONCISE})   # roles swapped: ratio 0.34 < 1.1
    assert rewards["agent_0"] == rewards["agent_1"] == 0.5


def test_multi_turn_feedback_prompt_contains_the_scores():
    env = llm_marl_envs.make("tldr_writing-v0", num_turns=2, reward_config=COMLRL_TLDR)
    env.reset(seed=0, options={"task": TEXT_POST})
    doubled = f"{CONCISE} {CONCISE}"
    obs, rewards, terms, _, infos = env.step({"agent_0": CONCISE, "agent_1": doubled})
    assert rewards["agent_0"] == 1.5 and not any(terms.values())
    for i, agent in enumerate(("agent_0", "agent_1")):
        prompt = infos[agent]["messages"][-1]["content"]
        assert infos[agent]["messages"][-1]["role"] == "user" and prompt in obs[agent]
        assert "Joint score: 1.50 / 3.00" in prompt
        assert "- structure: 1.50" in prompt and "- style_consistency: 0.00" in prompt and "- coherence: 0.00" in prompt
        assert "distinct-word ratio part 2 / part 1: 1.00" in prompt
        assert "Scoring stopped at 'distinct_ratio'" in prompt
        partner_text = doubled if i == 0 else CONCISE
        assert f"<<<\n{partner_text}\n>>>" in prompt
    _, rewards, terms, _, infos = env.step({"agent_0": CONCISE, "agent_1": DETAILED})
    assert rewards["agent_1"] == pytest.approx(2.82) and all(terms.values())
    assert infos["agent_0"]["scores"] == [[1.5, 1.5], [pytest.approx(2.82), pytest.approx(2.82)]]


def test_arxiv_prompts_split_the_work():
    env = llm_marl_envs.make("arxiv_writing-v0")
    obs, _ = env.reset(seed=0, options={"task": {"task_id": "a", "source": "We study X."}})
    assert "Focus on the background and motivation" in obs["agent_0"]
    assert "Another writer covers the methodology and implications" in obs["agent_0"]
    assert "Focus on the methodology and implications" in obs["agent_1"]
    assert "We study X." in obs["agent_1"] and "128-256 words" in obs["agent_1"]


def test_custom_reward_config_reaches_the_env():
    loose = dataclasses.replace(TLDR_BANDS, length_ratio_band=Band(0.5, 0.9, 1.2, 1.5))
    env = llm_marl_envs.make("tldr_writing-v0", reward_config=loose)
    env.reset(seed=0, options={"task": TEXT_POST})
    _, rewards, *_ = env.step({"agent_0": CONCISE, "agent_1": CONCISE})   # ratio 1.0: full in this band
    assert rewards["agent_0"] >= 1.5


# ------------------------------------------------------------------ data
@pytest.mark.parametrize("env_id, split, count, prefix", [
    ("tldr_writing-v0", "test", 500, "SUBREDDIT: r/relationships\n\nTITLE: "),
    ("tldr_writing-v0", "train", 1000, "SUBREDDIT: r/tifu\n\nPOST: "),
    ("tldr_writing-v0", "validation", 100, "SUBREDDIT: r/tifu\n\nPOST: "),
    ("arxiv_writing-v0", "test", 134, "The singularity refers to"),
    ("arxiv_writing-v0", "train", 1992, "Due to the success of deep learning"),
    ("arxiv_writing-v0", "validation", 619, "Mixed precision training"),
    ("arxiv_writing-v0", "test_scitldr", 618, "Incremental class learning"),
])
def test_local_splits(env_id, split, count, prefix):
    tasks = llm_marl_envs.make(env_id, split=split).tasks   # data from $LLM_MARL_DATA_DIR
    assert len(tasks) == count and tasks[0]["source"].startswith(prefix)
    assert len({t["task_id"] for t in tasks}) == count


def test_hub_row_shapes_normalise():
    hub_tldr = {"prompt": "SUBREDDIT: r/AskReddit\n\nTITLE: t\n\nPOST: p\n\nTL;DR:", "completion": " short"}
    assert normalize_tldr_row(hub_tldr, 7) == {
        "task_id": "tldr-7", "source": "SUBREDDIT: r/AskReddit\n\nTITLE: t\n\nPOST: p", "reference": "short"}
    hub_arxiv = {"article_id": "1234.5678", "abstract_text": ["First sentence.", "Second one."], "token_count": 120}
    assert normalize_arxiv_row(hub_arxiv, 0)["source"] == "First sentence. Second one."
    with pytest.raises(ValueError, match="none of the fields"):
        normalize_arxiv_row({"text": "x"}, 3)


# ------------------------------------------------------------------ semantic judge
def test_semantic_judge_has_its_own_module_and_is_re_exported():
    import verifiers.semantic

    assert SemanticJudge is verifiers.semantic.SemanticJudge  # verifiers.writing re-exports it
    assert verifiers.semantic.split_sentences("One. Two!\nThree") == ["One.", "Two!", "Three"]


@pytest.mark.slow      # loading sentence-transformers + MiniLM takes 8-30 s on this machine
@pytest.mark.ci_slow   # bounded (one model load), and it is the judge's only end-to-end check
def test_semantic_judge_ranks_faithful_summary_above_unrelated():
    env = llm_marl_envs.make("tldr_writing-v0")
    post = env.tasks[0]   # r/relationships: a 19F unsure whether she messed things up with a male friend
    judge = SemanticJudge()
    faithful = score_writing(
        "I (19F) worry I messed things up with my friend (19M) I have feelings for.",
        "I have been getting closer to a male friend and I like him; however, I am inexperienced with "
        "relationships and worry that something I said or did already ruined my chances with him.",
        TLDR_BANDS, source=post["source"], judge=judge)
    unrelated = score_writing(
        "The quarterly earnings report shows revenue growth in the cloud division.",
        "Revenue rose twelve percent as cloud contracts expanded; moreover, operating margins improved "
        "because data-center costs fell while enterprise customers renewed multi-year agreements.",
        TLDR_BANDS, source=post["source"], judge=judge)
    cov_f = faithful.details["semantic"]["coverage"]
    cov_u = unrelated.details["semantic"]["coverage"]
    assert 0.0 <= cov_u < cov_f <= 1.0
    assert faithful.details["components"]["semantic_coverage"] == pytest.approx(cov_f)  # weight 1.0
    assert faithful.details["max_score"] == pytest.approx(3.0 + 1.0 + 0.5)
    with pytest.raises(ValueError, match="source"):
        score_writing(CONCISE, DETAILED, judge=judge)
    # the env option reports the judge's terms as extra components of the joint reward
    env = llm_marl_envs.make("tldr_writing-v0", semantic_judge=True)
    env.reset(seed=0, options={"task_index": 0})
    _, rewards, _, _, infos = env.step({"agent_0": CONCISE, "agent_1": DETAILED})
    parts = infos["agent_1"]["verdict"].details["components"]
    assert {"semantic_coverage", "semantic_consistency"} <= set(parts)
    assert rewards["agent_0"] == rewards["agent_1"] == pytest.approx(sum(parts.values()))
