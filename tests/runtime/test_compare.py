"""Several baselines on the same tasks: headline metrics, paired differences, the comparison files."""
from __future__ import annotations

import pytest

from llm_marl.benchmark import summarize
from llm_marl.compare import comparison, comparison_meta, parse_baselines, team_score
from llm_marl.report import RunView, counted
from llm_marl_envs.metrics import paired_difference
from tests.runtime.test_report import debate_records, single_records


def test_parse_baselines_names_the_bad_one():
    assert parse_baselines("single, majority,debate,single") == ["single", "majority", "debate"]
    with pytest.raises(ValueError, match=r"unknown baseline\(s\) \['vote'\].*single,majority,debate"):
        parse_baselines("single,vote")


def test_paired_difference_counts_tasks_and_bootstraps_the_mean():
    out = paired_difference([1, 1, 0, 1], [0, 1, 0, 0], seed=0)
    assert out["mean"] == pytest.approx(0.5) and (out["wins"], out["ties"], out["losses"]) == (2, 2, 0)
    assert 0.0 <= out["ci95"][0] <= 0.5 <= out["ci95"][1] <= 1.0
    with pytest.raises(ValueError, match="equal-length"):
        paired_difference([1, 0], [1])


def test_comparison_pairs_baselines_on_the_same_tasks():
    single, debate = single_records(), debate_records()
    views = [RunView("single", {**summarize(single, 1), "env_id": "e", "models": ["m"], "backend": "hf", "seed": 0,
                                "debate_shape": [2, 2], "env_shape": [1, 1]}, single),
             RunView("debate", {**summarize(debate, 2), "env_id": "e", "models": ["m", "m"], "backend": "hf",
                                "seed": 0, "debate_shape": [2, 2], "env_shape": [2, 2]}, debate)]
    assert [team_score(r) for r in single] == [0.0, 0.0, 1.0]
    assert [team_score(r) for r in debate] == [0.0, 1.0, 1.0]     # episode 0: final answers "7", "7", both wrong
    result = comparison(views)
    assert result["num_paired_tasks"] == 3
    assert result["baselines"]["debate"]["team_answer_accuracy"]["mean"] == pytest.approx(2 / 3)
    assert result["baselines"]["debate"]["first_answer_accuracy"]["mean"] == pytest.approx(0.5)
    assert result["baselines"]["single"]["fix_rate"] is None and result["baselines"]["single"]["break_rate"] is None
    # debate: C→C 2, C→I 1 (episode 0), I→C 2 (episode 1), I→I 1: fixes 2 of 3 wrong answers, breaks 1 of 3 right ones
    assert result["baselines"]["debate"]["fix_rate"]["mean"] == pytest.approx(2 / 3)
    assert result["baselines"]["debate"]["break_rate"]["mean"] == pytest.approx(1 / 3)
    (pair,) = result["paired_team_answer_difference"]
    assert (pair["a"], pair["b"], pair["wins"], pair["ties"], pair["losses"]) == ("debate", "single", 1, 2, 0)
    assert pair["mean"] == pytest.approx(1 / 3)
    shifted = [dict(r, task_index=r["task_index"] + 1) for r in debate]
    with pytest.raises(ValueError, match="same tasks"):
        comparison([views[0], RunView("debate", views[1].summary, shifted)])


def test_counts_read_in_the_right_number():
    assert (counted(1, "turn"), counted(2, "turn"), counted(0, "agent")) == ("1 turn", "2 turns", "0 agents")
    result = {"debate_shape": [1, 1], "models": ["m"], "backend": "hf", "num_paired_tasks": 3, "seed": 0,
              "baselines": {"debate": {}, "majority": {}}}
    run = {"config": {"max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9}}
    meta = comparison_meta(result, run)[1]
    assert meta.startswith("debate: 1 agent × 1 turn; majority: vote over 1 independent sample (")
    assert "debate: 2 agents × 3 turns; majority: vote over 6 independent samples" in comparison_meta(
        {**result, "debate_shape": [2, 3]}, run)[1]
