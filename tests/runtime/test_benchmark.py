"""Benchmark harness: metrics on hand-made episode records, then end-to-end runs on a tiny model (with resume)."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from llm_marl.benchmark import BenchConfig, read_episodes, run_benchmark, summarize, task_schedule
from llm_marl_envs import metrics

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


def test_a_statistic_undefined_in_every_resample_has_nan_bounds_and_no_warning():
    never_correct = np.array([[0, 0, 1, 3], [0, 0, 0, 2]])     # no C→* transition: the break rate is 0/0
    with warnings.catch_warnings():
        warnings.simplefilter("error")                         # numpy's "All-NaN slice" would be raised here
        estimate, low, high = metrics.bootstrap_ci(never_correct, metrics.break_rate)
        both = metrics.bootstrap_ci(never_correct, lambda rows: [metrics.fix_rate(rows), metrics.break_rate(rows)])
        summary = metrics.transition_summary(never_correct)
    assert np.isnan(estimate) and np.isnan(low) and np.isnan(high)
    assert both[0][0] == pytest.approx(1 / 6) and both[1][0] <= 1 / 6 <= both[2][0]
    assert np.isnan(both[1][1]) and np.isnan(both[2][1])
    assert summary["break_rate"] == {"mean": None, "ci95": [None, None]}
    assert isinstance(metrics.bootstrap_ci([0.0, 1.0])[1], np.floating)      # scalar bounds stay scalars


def test_fix_and_break_rates_divide_by_the_answers_that_could_make_that_transition():
    # episode 0: C→C 3, C→I 1; episode 1: I→C 2, I→I 6, C→C 1. Summed: C→C 4, C→I 1, I→C 2, I→I 6
    per_episode = np.array([[[3, 1], [0, 0]], [[1, 0], [2, 6]]])
    assert metrics.fix_rate(per_episode) == pytest.approx(2 / 8)       # I→C / (I→C + I→I), not / all 13
    assert metrics.break_rate(per_episode) == pytest.approx(1 / 5)     # C→I / (C→C + C→I)
    assert metrics.fix_rate(per_episode.reshape(2, 4)) == pytest.approx(2 / 8)   # rows of four counts alike
    assert np.isnan(metrics.fix_rate([[[3, 1], [0, 0]]]))             # no incorrect answer: nothing to fix
    summary = metrics.transition_summary(per_episode, interval=lambda rows, stat: stat(rows))
    assert summary == {"c_to_c": 4, "c_to_i": 1, "i_to_c": 2, "i_to_i": 6, "fix_rate": 0.25, "break_rate": 0.2}
    with_ci = metrics.transition_summary(per_episode)
    assert with_ci["fix_rate"]["mean"] == pytest.approx(0.25) and len(with_ci["fix_rate"]["ci95"]) == 2
    assert metrics.transition_summary(np.zeros((3, 2, 2))) == {"c_to_c": 0, "c_to_i": 0, "i_to_c": 0, "i_to_i": 0}


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
    transitions = summary["transitions"]
    assert [transitions[k] for k in metrics.TRANSITIONS] == [4, 0, 1, 4]
    assert transitions["fix_rate"]["mean"] == pytest.approx(1 / 5)     # I→C 1 of the 5 incorrect answers
    assert transitions["break_rate"]["mean"] == pytest.approx(0 / 4)
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


# ------------------------------------------------------------------ end to end on a tiny random model
@pytest.fixture(scope="module")
def tiny_policy():
    """An HF policy on a tiny random Llama with the real SmolLM2 tokenizer."""
    from llm_marl.backends.hf import HFPolicy
    from llm_marl.models import tiny_model

    model, tokenizer = tiny_model(seed=0)
    return HFPolicy(model, tokenizer, name="tiny")


def tiny_config(**overrides) -> BenchConfig:
    settings = dict(env_id="gsm_symbolic_debate-v0", models=["tiny"], backend="hf", num_agents=2, num_turns=2,
                    episodes=3, seed=7, max_new_tokens=6, episodes_per_batch=2, env_kwargs={"num_tasks": 20})
    return BenchConfig(**{**settings, **overrides})


def test_bench_run_writes_episodes_summary_report_and_plots(tiny_policy, tmp_path):
    summary = run_benchmark(tiny_config(), tmp_path, policies={"tiny": tiny_policy}, progress=False)
    for name in ("run.json", "episodes.jsonl", "summary.json", "report.md", "accuracy_per_turn.png",
                 "transitions.png"):
        assert (tmp_path / name).is_file(), name
    records = read_episodes(tmp_path / "episodes.jsonl")
    assert sorted(r["episode"] for r in records) == [0, 1, 2]
    for r in records:
        assert len(r["correct"]) == 2 and all(len(turn) == 2 for turn in r["correct"])
        assert len(r["responses"]) == 2 and r["tokens"] > 0 and r["models"] == ["tiny", "tiny"]
        assert r["seed"] == 7 + r["episode"]
    assert summary["num_episodes"] == 3 and summary["seed"] == 7 and summary["env_shape"] == [2, 2]
    assert summary["tokens_total"] == sum(r["tokens"] for r in records)
    assert len(summary["accuracy_per_turn"]) == 2 and "transitions" in summary
    assert sum(summary["transitions"][k] for k in metrics.TRANSITIONS) == 3 * 2  # 3 episodes x 2 agents x 1 pair
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    report = (tmp_path / "report.md").read_text()
    assert "final majority-vote accuracy" in report and "C→I" in report and "seed 7" in report
    assert (tmp_path / "accuracy_per_turn.png").read_bytes()[:4] == b"\x89PNG"


def test_rebuilding_a_report_that_fails_keeps_the_old_files_whole(tiny_policy, tmp_path, monkeypatch):
    import llm_marl.benchmark as benchmark

    run_benchmark(tiny_config(), tmp_path, policies={"tiny": tiny_policy}, progress=False)
    before = {name: (tmp_path / name).read_bytes() for name in ("summary.json", "report.md", "accuracy_per_turn.png")}

    from matplotlib.figure import Figure

    def half_written(fig, path, **kwargs):          # the disk fills up in the middle of the file
        with open(path, "wb") as f:
            f.write(b"\x89PNG half")
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", half_written)
    with pytest.raises(OSError, match="disk full"):
        benchmark.write_report(tmp_path)
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_bench_resume_skips_finished_episodes(tiny_policy, tmp_path):
    run_benchmark(tiny_config(episodes=2), tmp_path, policies={"tiny": tiny_policy}, progress=False)
    before = (tmp_path / "episodes.jsonl").read_text().splitlines()
    with open(tmp_path / "episodes.jsonl", "a") as f:
        f.write('{"episode": 2, "torn')  # a write cut short by a crash
    calls = tiny_policy.generate_calls
    summary = run_benchmark(tiny_config(episodes=3), tmp_path, policies={"tiny": tiny_policy}, progress=False)
    after = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert after[:2] == before                       # finished episodes kept as they were
    assert [json.loads(line)["episode"] for line in after] == [0, 1, 2]
    assert tiny_policy.generate_calls - calls == 2   # only episode 2 ran: one batched call per turn
    assert summary["num_episodes"] == 3
    calls = tiny_policy.generate_calls
    run_benchmark(tiny_config(episodes=3), tmp_path, policies={"tiny": tiny_policy}, progress=False)
    assert tiny_policy.generate_calls == calls       # nothing left to run
    with pytest.raises(ValueError, match="other settings.*seed"):
        run_benchmark(tiny_config(seed=8), tmp_path, policies={"tiny": tiny_policy}, progress=False)


@pytest.mark.parametrize("baseline, shape", [("single", [1, 1]), ("majority", [4, 1])])
def test_baselines_run_on_the_same_tasks(tiny_policy, tmp_path, baseline, shape):
    summary = run_benchmark(tiny_config(baseline=baseline, episodes=2), tmp_path, policies={"tiny": tiny_policy},
                            progress=False)
    assert summary["env_shape"] == shape and summary["debate_shape"] == [2, 2]
    records = read_episodes(tmp_path / "episodes.jsonl")
    debate_tasks = task_schedule(20, 2, seed=7)
    assert [r["task_index"] for r in records] == debate_tasks
    assert all(len(r["answers"][-1]) == shape[0] for r in records)
    assert "transitions" not in summary and summary["final_majority_accuracy"] is not None


def test_mixed_team_seats_one_model_per_agent(tiny_policy, tmp_path):
    from llm_marl.backends.hf import HFPolicy
    from llm_marl.models import tiny_model

    other = HFPolicy(*tiny_model(seed=1), name="tiny-b")
    summary = run_benchmark(tiny_config(models=["tiny", "tiny-b"], num_agents=None, episodes=1), tmp_path,
                            policies={"tiny": tiny_policy, "tiny-b": other}, progress=False)
    assert summary["models"] == ["tiny", "tiny-b"]
    assert other.generate_calls > 0
