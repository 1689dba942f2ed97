"""Hostile outputs against the writing reward: none earns more than an honest pair of summaries.

Each test is one trick a policy can learn against ``verifiers.writing.score_writing`` with
``TLDR_BANDS``; the honest baseline is a hand-written concise and detailed summary of ``POST``.
"""
from __future__ import annotations

import pytest

from verifiers.writing import TLDR_BANDS, count_headers, score_writing, text_quality, without_quality_factor

POST = (
    "SUBREDDIT: r/tifu\n\nTITLE: TIFU by locking myself out during a snowstorm\n\n"
    "POST: This morning I stepped outside to shovel the driveway and the door shut behind me. My phone, "
    "my keys and my coat were all inside. It was minus ten and snowing hard, so I walked two blocks to my "
    "neighbour's house in slippers. She let me call a locksmith, who arrived an hour later and charged me "
    "ninety dollars to open the door. My toes were numb for the rest of the day and I missed a work meeting."
)
HONEST_CONCISE = "I locked myself out in a snowstorm and paid a locksmith ninety dollars to get back in."
HONEST_DETAILED = (
    "While shoveling snow, I let the door close behind me with my phone, keys and coat still inside. "
    "Because it was freezing, I hurried to a neighbour who let me phone a locksmith. However, he took "
    "an hour and charged ninety dollars, so I ended up with numb toes and a missed meeting."
)
POST_BODY = POST.split("POST: ", 1)[1]
TRANSITIONS = ("However, moreover, therefore, first, in addition, for example, in conclusion, similarly, "
               "although, if, when, indeed, in other words, consequently, meanwhile, finally.")


def score(part0: str, part1: str) -> float:
    return score_writing(part0, part1, TLDR_BANDS, source=POST).score


@pytest.fixture(scope="module")
def honest() -> float:
    value = score(HONEST_CONCISE, HONEST_DETAILED)
    assert value > 2.0, "the honest baseline must earn most of the reward for the comparisons to mean anything"
    return value


def test_honest_baseline_keeps_its_full_quality_factor():
    verdict = score_writing(HONEST_CONCISE, HONEST_DETAILED, TLDR_BANDS, source=POST)
    assert verdict.details["quality"]["factor"] == 1.0


def test_repeated_header_label_scores_zero(honest):
    # the exploit the unguarded reward invited: a short part 0 of few distinct words
    hack = "SUBREDDIT: locksmith " * 6
    assert score(hack, HONEST_DETAILED) == 0.0
    # without the quality factor it earns most of the reward
    assert score_writing(hack, HONEST_DETAILED, without_quality_factor(TLDR_BANDS), source=POST).score > 2.5


def test_repeated_sentence_in_detailed_part(honest):
    assert score(HONEST_CONCISE, " ".join([HONEST_CONCISE] * 4)) == 0.0


def test_repeated_honest_summary_twice_earns_less(honest):
    assert score(HONEST_CONCISE, HONEST_DETAILED + " " + HONEST_DETAILED) < honest


def test_repeated_words_with_punctuation_variants(honest):
    hack = "locksmith, locksmith! locksmith? " * 10
    assert score(HONEST_CONCISE, hack) == 0.0


def test_copy_of_the_post_scores_zero(honest):
    words = POST_BODY.split()
    assert score(" ".join(words[:20]), POST_BODY) == 0.0


def test_copy_of_the_post_with_its_headers(honest):
    # the untrained model's habit: echo the prompt layout
    assert score(POST[:120], POST) == 0.0


def test_lightly_edited_copy_earns_less(honest):
    edited = POST_BODY.replace("This morning", "Today").replace("minus ten", "very cold")
    assert score(HONEST_CONCISE, edited) < honest


def test_header_labels_before_honest_text_earn_less(honest):
    assert score("TL;DR: " + HONEST_CONCISE, "Detailed summary: " + HONEST_DETAILED) < honest


def test_many_header_labels_score_zero(honest):
    headers = "SUBREDDIT: r/tifu\nTITLE: snow\nPOST: door\nSUMMARY: "
    assert score(headers + HONEST_CONCISE, headers + HONEST_DETAILED) == 0.0


def test_markdown_headings_earn_less(honest):
    assert score("# Summary\n" + HONEST_CONCISE, "## Details\n" + HONEST_DETAILED) < honest


def test_list_of_transition_words_scores_zero(honest):
    assert score(HONEST_CONCISE, TRANSITIONS) == 0.0


def test_transition_words_around_filler_scores_zero(honest):
    filler = ("First, it is what it is. However, it was. Moreover, it is so. Therefore, it will be. "
              "In conclusion, that is that, and then it was over.")
    assert score(HONEST_CONCISE, filler) == 0.0


def test_word_salad_of_post_keywords_scores_zero(honest):
    salad = "locksmith snowstorm keys phone coat neighbour slippers driveway ninety dollars toes numb meeting door"
    assert (
        score(salad, salad + " shovel minus snowing hard blocks house called arrived hour charged open rest day work")
        == 0.0
    )


def test_off_topic_fluent_text_earns_less(honest):
    off_topic = ("Quantum chromodynamics describes quarks and gluons. Lattice simulations estimate hadron "
                 "masses, however confinement remains unproven, so physicists study asymptotic freedom.")
    assert (
        score("Hadron physics explains protons and neutrons with lattice quantum chromodynamics.", off_topic) < honest
    )


def test_empty_and_whitespace_parts_score_zero():
    assert score("", HONEST_DETAILED) == 0.0
    assert score(HONEST_CONCISE, " \n\t ") == 0.0


def test_hostile_part_zeroes_the_joint_reward_for_both_agents(honest):
    # the reward is shared: a degenerate part 1 leaves nothing for an honest part 0
    assert score(HONEST_CONCISE, "snow " * 60) == 0.0


def test_detectors_name_what_they_found():
    quality = text_quality("SUBREDDIT: SUBREDDIT: SUBREDDIT:", source=POST)
    assert quality["measures"]["headers"] == 3 and quality["terms"]["headers"] == pytest.approx(0.25)
    assert count_headers("TITLE: a\n**Summary**: b\n# Heading\na plain sentence then a colon: not a label") == 3
    assert count_headers(HONEST_DETAILED) == 0
