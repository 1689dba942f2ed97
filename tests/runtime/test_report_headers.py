"""Report headers say only what ran; a wall time split evenly over a batch's episodes shows no interval."""
from llm_marl.compare import comparison_meta, comparison_tables, format_comparison
from llm_marl.report import format_batch_share

RUN = {"config": {"max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9}}


def entry(mean, low=None, high=None):
    return {"mean": mean, "ci95": [mean if low is None else low, mean if high is None else high]}


def row(wall):
    return {"env_shape": [2, 2], "first_answer_accuracy": entry(0.5, 0.2, 0.8), "final_turn_accuracy": entry(0.5),
            "team_answer_accuracy": entry(0.5), "fix_rate": entry(0.1), "break_rate": entry(0.1),
            "tokens_per_episode": entry(40.0), "wall_time_per_episode_s": wall, "wall_time_total_s": 15.4}


def result(*baselines, wall=None):
    return {"env_id": "arithmetic_debate-v0", "debate_shape": [2, 2], "models": ["m"], "backend": "hf",
            "num_paired_tasks": 2, "seed": 0, "paired_team_answer_difference": [],
            "baselines": {name: row(wall or entry(7.7)) for name in baselines}}


def test_the_comparison_header_describes_only_the_baselines_that_ran(tmp_path):
    meta = comparison_meta(result("single", "debate"), RUN)[1]
    assert meta == "debate: 2 agents × 2 turns; single: 1 agent, 1 turn"
    with_vote = comparison_meta(result("majority", "debate"), RUN)[1]
    assert "majority: vote over 4 independent samples (the debate's token budget)" in with_vote
    assert format_comparison(result("single", "debate"), tmp_path).splitlines()[0].endswith("| debate 2x2")
    assert format_comparison(result("majority", "debate"), tmp_path).splitlines()[0].endswith(
        "| debate 2x2, majority of 4")
    assert "majority" not in format_comparison(result("single"), tmp_path).splitlines()[0]


def test_an_even_batch_share_of_wall_time_shows_no_degenerate_interval():
    assert format_batch_share(entry(7.7)) == "7.70"
    assert format_batch_share(entry(7.7, 6.0, 9.1)) == "7.70 [6.00, 9.10]"
    assert format_batch_share(None) == "n/a"
    side = comparison_tables(result("debate"))[0]
    assert side.header[-1] == "wall s / episode (batch share)" and side.rows[0][-1] == "7.70"
