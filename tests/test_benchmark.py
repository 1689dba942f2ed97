"""Benchmark harness: metrics on hand-made episode records, then end-to-end runs on a tiny model (with resume)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from llm_marl_envs import metrics
from llm_marl_envs.benchmark import (BenchConfig, read_episodes, run_benchmark, summarize, task_schedule,
                                     write_report)

T, F = True, False


# ------------------------------------------------------------------ metrics, by hand
def test_transition_counts_per_agent_and_turn_pair():
    correct = [[T, F, T],   # turn 0
               [T, T, F],   # turn 1: agent_0 C->C, agent_1 I->C, agent_2 C->I
               [F, T, None]]  # turn 2: agent_0 C->I, agent_1 C->C, agent_2 skipped (None)
    np.testing.assert_array_equal(metrics.transition_counts(correct), [[2, 2], [1, 0]])
    np.testing.assert_array_equal(metrics.transition_counts([[T, F]]), np.zeros((2, 2)))


def test_majority_vote_and_consensus():
    assert metrics.majority_answer(["4", "5", "5"]) == "5"
    assert metrics.majority_answer(["7", "4", "4", "7"]) == "7"          # tie -> lowest-indexed agent's answer
    assert metrics.majority_answer([None, " 3 ", "3", ""]) == "3"
    assert metrics.majority_answer([None, None]) is None
    assert metrics.majority_correct(["4", "5", "5"], [F, T, T]) is True
    assert metrics.majority_correct(["4", "5", "5"], [T, F, F]) is False
    assert metrics.majority_correct([None, None], [F, F]) is False
    assert metrics.majority_correct(["a", "b"], [None, None]) is None
    assert metrics.consensus(["5", " 5"]) and not metrics.consensus(["5", "6"]) and not metrics.consensus([None, None])


def test_turn_accuracy_uses_scores_when_correctness_is_undefined():
    assert metrics.turn_accuracy([[T, F], [T, T]], [[1, 0], [1, 1]]) == [0.5, 1.0]
    assert metrics.turn_accuracy([[None, None]], [[0.2, 0.6]]) == [pytest.approx(0.4)]


def test_pad_turns_repeats_the_last_turn_of_early_stopped_episodes():
    assert metrics.pad_turns([[T, F]], 3) == [[T, F]] * 3
    with pytest.raises(ValueError, match="num_turns=1"):
        metrics.pad_turns([[T], [T]], 1)


def test_bootstrap_ci_brackets_the_mean_and_is_seeded():
    data = [0.0] * 30 + [1.0] * 70
    estimate, low, high = metrics.bootstrap_ci(data, seed=1)
    assert estimate == pytest.approx(0.7)
    assert 0.58 < low < 0.7 < high < 0.8   # normal approx: 0.7 ± 1.96·0.046
    assert (low, high) == tuple(metrics.bootstrap_ci(data, seed=1)[1:])
    constant = metrics.bootstrap_ci([2.0, 2.0, 2.0])
    assert tuple(constant) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="at least one episode"):
        metrics.bootstrap_ci([])


def test_transition_rates_pool_counts_before_dividing():
    per_episode = np.array([[[1, 0], [0, 0]], [[0, 1], [2, 0]]])
    np.testing.assert_allclose(metrics.transition_rates(per_episode), [0.25, 0.25, 0.5, 0.0])


def record(i, correct, answers, tokens=10, wall=1.0):
    scores = [[float(bool(c)) for c in turn] for turn in correct]
    return {"episode": i, "task_index": i, "task_id": f"t{i}", "seed": i, "models": ["m"], "correct": correct,
            "scores": scores, "answers": answers, "responses": answers, "tokens": tokens, "wall_time_s": wall}


def test_summarize_hand_made_episodes():
    records = [
        record(0, [[T, F, F], [T, T, F]], [["5", "4", "3"], ["5", "5", "3"]], tokens=30, wall=2.0),
        record(1, [[F, F, F], [F, F, F]], [["1", "2", "2"], ["2", "2", "2"]], tokens=10, wall=1.0),
        record(2, [[T, T, T]], [["9", "9", "9"]], tokens=20, wall=3.0),  # stopped early on consensus
    ]
    summary = summarize(records, num_turns=2, num_resamples=200)
    assert summary["metric"] == "accuracy" and summary["num_episodes"] == 3
    turn0, turn1 = (e["mean"] for e in summary["accuracy_per_turn"])
    assert turn0 == pytest.approx((1 / 3 + 0 + 1) / 3)
    assert turn1 == pytest.approx((2 / 3 + 0 + 1) / 3)
    assert summary["final_majority_accuracy"]["mean"] == pytest.approx(2 / 3)  # "5" right, "2" wrong, "9" right
    assert summary["consensus_rate"]["mean"] == pytest.approx(2 / 3)
    # transitions: ep0 C->C, I->C, I->I; ep1 3x I->I; ep2 (padded) 3x C->C
    assert summary["transitions"]["counts"] == [[4, 0], [1, 4]]
    assert summary["transitions"]["rates"]["C→C"]["mean"] == pytest.approx(4 / 9)
    assert summary["tokens_total"] == 60 and summary["tokens_per_episode"]["mean"] == pytest.approx(20)
    assert summary["wall_time_total_s"] == pytest.approx(6.0)
    for entry in [*summary["accuracy_per_turn"], summary["consensus_rate"]]:
        low, high = entry["ci95"]
        assert low <= entry["mean"] <= high


def test_task_schedule_is_a_seeded_permutation():
    first = task_schedule(10, 10, seed=3)
    assert sorted(first) == list(range(10)) and first == task_schedule(10, 10, seed=3)
    assert first != task_schedule(10, 10, seed=4)
    repeated = task_schedule(3, 7, seed=0)  # every task once per round before any repeats
    assert len(repeated) == 7 and sorted(repeated[:3]) == sorted(repeated[3:6]) == [0, 1, 2]


def test_bench_config_validates():
    with pytest.raises(ValueError, match="unknown environment id 'nope-v0'"):
        BenchConfig(env_id="nope-v0")
    with pytest.raises(ValueError, match="unknown baseline"):
        BenchConfig(env_id="gsm_symbolic_debate-v0", baseline="vote")
    config = BenchConfig(env_id="gsm_symbolic_debate-v0", num_agents=3, num_turns=2, baseline="majority")
    assert config.env_shape() == (6, 1) and config.debate_shape() == (3, 2)
    assert BenchConfig(env_id="gsm_symbolic_debate-v0", baseline="single").env_shape() == (1, 1)
    mixed = BenchConfig(env_id="gsm_symbolic_debate-v0", models=["a", "b"], num_turns=2)
    assert mixed.env_shape() == (2, 2) and mixed.agent_models() == ["a", "b"]
    with pytest.raises(ValueError, match="one model per agent"):
        BenchConfig(env_id="gsm_symbolic_debate-v0", models=["a", "b"], num_agents=3).agent_models()
