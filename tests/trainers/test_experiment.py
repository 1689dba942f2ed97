"""Held-out scores (trainers.common.evaluation) and the before/after run of the examples (trainers.common.experiment):
per-task reduction, pairing, the one summary shape, the one-command run."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from llm_marl.models import tiny_model
from llm_marl.team import Team
from llm_marl_envs.metrics import answer_sources, fix_rate
from tests.toy_env import SayNumberEnv
from trainers.common.evaluation import (
    EvalResult,
    HeldOutScores,
    compare,
    format_comparison,
    held_out_scores,
    scores_from,
)
from trainers.common.experiment import merged_history, train_and_compare
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer


def result_of(correct_per_episode, answers_per_episode=None) -> EvalResult:
    """An EvalResult whose records carry only what scores_from reads (2 agents, 2 turns)."""
    records = []
    for i, correct in enumerate(correct_per_episode):
        answers = (answers_per_episode or [None] * len(correct_per_episode))[i]
        if answers is None:
            answers = [["1" if c else "0" for c in turn] for turn in correct]
        records.append({"correct": correct, "answers": answers})
    return EvalResult(
        num_episodes=len(records),
        team_reward=0.0,
        team_reward_ci=(0.0, 0.0),
        rewards=[0.0] * len(records),
        accuracy_per_turn=None,
        accuracy_per_turn_ci=None,
        episodes=records,
        num_turns=2,
    )


def test_scores_average_samples_per_task_and_agents_at_the_last_turn():
    # task 0: two samples; task 1: two samples. Rows are consecutive plays of a task.
    result = result_of([
        [[False, False], [True, False]],     # task 0 sample 0: final 0.5, I→C once, I→I once
        [[True, True], [True, True]],        # task 0 sample 1: final 1.0, C→C twice
        [[False, False], [False, False]],    # task 1 sample 0: final 0.0
        [[True, False], [False, False]],     # task 1 sample 1: final 0.0, C→I once
    ])
    scores = scores_from(result, [7, 9], samples=2, temperature=0.7)
    assert scores.final.tolist() == [0.75, 0.0]
    assert scores.per_turn.tolist() == [[0.5, 0.75], [0.25, 0.0]]
    # transitions summed over agents, turn pairs and samples: C→C, C→I, I→C, I→I
    assert scores.transitions.tolist() == [[2, 0, 1, 1], [0, 1, 0, 3]]
    assert fix_rate(scores.transitions) == pytest.approx(1 / 5)


def test_team_answer_is_the_majority_vote_of_final_answers():
    # three agents: two agree on the right answer -> the vote is right though one agent is wrong
    result = result_of([[[True, True, False], [True, True, False]]],
                       [[["5", "5", "6"], ["5", "5", "6"]]])
    scores = scores_from(result, [0], samples=1, temperature=0.0)
    assert scores.final.tolist() == [pytest.approx(2 / 3)]
    assert scores.team.tolist() == [1.0]


def test_compare_pairs_by_task_and_reports_the_fix_rate_change():
    before = scores_from(result_of([[[False, False], [False, False]]] * 20), list(range(20)), 1, 0.0)
    after = scores_from(result_of([[[False, False], [True, True]]] * 10 + [[[False, False], [False, False]]] * 10),
                        list(range(20)), 1, 0.0)
    out = compare(before, after)
    diff = out["final_turn_accuracy"]["paired_difference"]
    assert diff["mean"] == pytest.approx(0.5) and diff["low"] > 0 and diff["better"] == 10 and diff["tie"] == 10
    assert out["transitions"]["before"]["i_to_c"] == 0 and out["transitions"]["after"]["i_to_c"] == 20
    assert out["transitions"]["after"]["fix_rate"]["mean"] == pytest.approx(20 / 40)
    assert out["transitions"]["fix_rate_change"]["mean"] == pytest.approx(0.5)
    assert out["per_turn"][0]["paired_difference"]["mean"] == 0.0
    with pytest.raises(ValueError, match="same tasks"):
        compare(before, scores_from(result_of([[[False, False], [False, False]]] * 20), list(range(1, 21)), 1, 0.0))


def test_answer_sources_say_whether_each_seat_kept_its_answer_took_a_partners_or_wrote_a_new_one():
    # seat 0 takes seat 1's "7"; seat 1 keeps "7" (whitespace ignored); seat 2 writes "9"
    assert answer_sources([["5", "7", "8"], ["7", " 7 ", "9"]]).tolist() == [[0, 1, 0], [1, 0, 0], [0, 0, 1]]
    # an empty answer is new, even when the seat was empty before; the last two turns are compared
    assert answer_sources([["1", "2"], ["3", ""], ["3", None]]).tolist() == [[1, 0, 0], [0, 0, 1]]
    assert answer_sources([["4", "4"]]).tolist() == [[0, 0, 0], [0, 0, 0]]     # one turn: nothing to trace
    with pytest.raises(ValueError, match="at least one"):
        answer_sources([])


def test_compare_reports_the_collaboration_gain_and_what_each_seat_did_at_its_last_turn():
    # before: nobody changes; after: seat 0 is right at once, seat 1 is wrong and then takes seat 0's answer
    before = scores_from(result_of([[[True, False], [True, False]]] * 20, [[["5", "3"], ["5", "3"]]] * 20),
                         list(range(20)), 1, 0.0)
    after = scores_from(result_of([[[True, False], [True, True]]] * 12 + [[[False, False], [False, False]]] * 8,
                                  [[["5", "3"], ["5", "5"]]] * 12 + [[["4", "3"], ["4", "2"]]] * 8),
                        list(range(20)), 1, 0.0)
    out = compare(before, after)
    assert out["collaboration_gain"]["before"]["mean"] == 0.0
    gain = out["collaboration_gain"]["after"]                  # 12 tasks go from 0.5 to 1.0, 8 stay at 0
    assert gain["mean"] == pytest.approx(0.3) and gain["low"] > 0 and gain["better"] == 12 and gain["tie"] == 8
    seat0, seat1 = out["seats"]["after"]
    assert seat0["turn0_accuracy"]["mean"] == pytest.approx(0.6) and seat1["turn0_accuracy"]["mean"] == 0.0
    assert seat1["final_turn_accuracy"]["mean"] == pytest.approx(0.6)
    assert seat0["final_answer_from"] == {"kept": 20, "partner": 0, "new": 0}
    assert seat1["final_answer_from"] == {"kept": 0, "partner": 12, "new": 8}
    assert out["seats"]["before"][1]["final_answer_from"] == {"kept": 20, "partner": 0, "new": 0}
    assert "final - turn 0 after 0.300" in format_comparison("greedy", out)


def test_one_summary_shape_for_a_setting_and_its_arrays_read_back():
    # 4 tasks, 2 agents: task 0 both fixed (I→C 2), task 1 one broken (C→I 1, C→C 1), tasks 2-3 unchanged
    result = result_of([[[False, False], [True, True]], [[True, True], [True, False]],
                        [[True, False], [True, False]], [[True, True], [True, True]]])
    scores = scores_from(result, [0, 1, 2, 3], samples=1, temperature=0.0)
    summary = scores.to_dict()
    assert summary["turn0_accuracy"]["mean"] == pytest.approx((0 + 1 + 0.5 + 1) / 4)
    assert summary["final_turn_accuracy"]["mean"] == pytest.approx((1 + 0.5 + 0.5 + 1) / 4)
    assert summary["collaboration_gain"]["mean"] == pytest.approx(0.5 / 4)
    assert summary["collaboration_gain"]["better"] == 1 and summary["collaboration_gain"]["worse"] == 1
    transitions = summary["transitions"]
    assert {k: transitions[k] for k in ("c_to_c", "c_to_i", "i_to_c", "i_to_i")} == \
        {"c_to_c": 4, "c_to_i": 1, "i_to_c": 2, "i_to_i": 1}
    assert transitions["fix_rate"]["mean"] == pytest.approx(2 / 3)      # I→C / (I→C + I→I)
    assert transitions["break_rate"]["mean"] == pytest.approx(1 / 5)    # C→I / (C→C + C→I)
    again = HeldOutScores.from_arrays(json.loads(json.dumps(scores.to_arrays())))
    assert again.to_dict() == summary and again.sources.tolist() == scores.sources.tolist()


@pytest.fixture()
def trainer(tmp_path):
    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, 2)
    config = MAGRPOConfig(num_generations=2, max_new_tokens=4, max_steps=1, eval_tasks=3, learning_rate=5e-2,
                          temperature=1.0, output_dir=str(tmp_path / "run"), report_to=("jsonl",), progress=False)
    return MAGRPOTrainer(SayNumberEnv(num_turns=2), team, config, eval_env=SayNumberEnv(num_turns=2, num_tasks=5))


def test_held_out_scores_draw_independent_samples_and_replay_with_the_seed(trainer):
    with pytest.raises(ValueError, match="greedy"):
        held_out_scores(trainer, [0, 1], samples=2, temperature=0.0)
    first = held_out_scores(trainer, [0, 1, 2], samples=3, temperature=1.0, seed=4)
    again = held_out_scores(trainer, [0, 1, 2], samples=3, temperature=1.0, seed=4)
    assert len(first.episodes) == 9 and [e["task_index"] for e in first.episodes] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    texts = [e["responses"] for e in first.episodes]
    assert texts == [e["responses"] for e in again.episodes]              # the seed replays the episodes
    assert len({json.dumps(t) for t in texts[:3]}) > 1                    # plays of one task differ
    torch.manual_seed(123)                                                # the global RNG does not decide them
    assert texts == [e["responses"] for e in held_out_scores(trainer, [0, 1, 2], samples=3, temperature=1.0,
                                                             seed=4).episodes]
    other = held_out_scores(trainer, [0, 1, 2], samples=3, temperature=1.0, seed=5)
    assert texts != [e["responses"] for e in other.episodes]


def test_train_and_compare_writes_results_of_a_real_update(trainer, tmp_path):
    base = {k: v.clone() for k, v in trainer.team.policy("agent_0").trainable_state_dict("agent_0").items()}
    results = train_and_compare(trainer, tmp_path / "out", eval_tasks=3, samples=2, temperature=1.0,
                                env_id="say_number")
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["held_out_tasks"] == 3 and saved["env"] == "say_number"
    for key in ("before", "after", "paired_difference"):
        assert set(saved["final_turn_accuracy"][key]) >= {"mean", "low", "high"}
    assert saved["greedy"]["per_turn"][1]["turn"] == 1 and "fix_rate_change" in saved["transitions"]
    assert (tmp_path / "out" / "learning_curve.png").stat().st_size > 0
    assert (tmp_path / "out" / "eval-sampled-after" / "report.html").is_file()
    checkpoint = results["checkpoint"]
    assert checkpoint and Path(checkpoint).parent.resolve() == (tmp_path / "run" / "checkpoints").resolve()
    after = trainer.team.policy("agent_0").trainable_state_dict("agent_0")
    assert any(not torch.equal(base[k], after[k]) for k in base)          # training moved the adapter
    with pytest.raises(ValueError, match="held-out tasks"):
        train_and_compare(trainer, tmp_path / "out2", eval_tasks=99, samples=1, temperature=1.0, env_id="x")
    assert np.isfinite(saved["wall_time_s"]["total"])


def test_held_out_scores_advance_at_most_parallel_episodes_together(trainer):
    policy = trainer.team.policy("agent_0")
    calls = policy.generate_calls
    whole = held_out_scores(trainer, [0, 1, 2, 3, 4], parallel=None)
    assert policy.generate_calls - calls == 2                             # 2 turns, all 5 episodes in one batch
    calls = policy.generate_calls
    chunked = held_out_scores(trainer, [0, 1, 2, 3, 4], parallel=2)
    assert policy.generate_calls - calls == 3 * 2                         # chunks of 2, 2 and 1 episodes
    assert [e["responses"] for e in chunked.episodes] == [e["responses"] for e in whole.episodes]


def test_train_and_compare_resumed_at_max_steps_only_evaluates_the_checkpoint(trainer, tmp_path):
    train_and_compare(trainer, tmp_path / "first", eval_tasks=3, samples=2, temperature=1.0, env_id="say_number")
    checkpoint = trainer.latest_checkpoint()
    trained = {k: v.clone() for k, v in trainer.team.policy("agent_0").trainable_state_dict("agent_0").items()}

    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, 2)
    config = MAGRPOConfig(num_generations=2, max_new_tokens=4, max_steps=1, eval_tasks=3, learning_rate=5e-2,
                          temperature=1.0, output_dir=str(tmp_path / "evaluate"), report_to=("jsonl",), progress=False)
    fresh = MAGRPOTrainer(SayNumberEnv(num_turns=2), team, config, eval_env=SayNumberEnv(num_turns=2, num_tasks=5))
    results = train_and_compare(fresh, tmp_path / "second", eval_tasks=3, samples=2, temperature=1.0,
                                env_id="say_number", resume=checkpoint)
    loaded = fresh.team.policy("agent_0").trainable_state_dict("agent_0")
    assert all(torch.equal(trained[k], loaded[k]) for k in trained)       # after = the checkpoint's weights
    assert fresh.latest_checkpoint() is None and results["checkpoint"] == str(checkpoint)
    assert [r["step"] for r in results["train_history"]] == [1]           # the checkpoint run's logged step
    first = json.loads((tmp_path / "first" / "results.json").read_text())
    assert results["greedy"]["final_turn_accuracy"]["after"] == first["greedy"]["final_turn_accuracy"]["after"]
    assert results["greedy"]["final_turn_accuracy"]["before"] == first["greedy"]["final_turn_accuracy"]["before"]
    with pytest.raises(ValueError, match="untrained team first"):    # 'before' would be the trained team
        train_and_compare(fresh, tmp_path / "third", eval_tasks=3, samples=0, temperature=1.0, env_id="say_number")


def test_train_and_compare_refuses_an_empty_evaluation(trainer, tmp_path):
    with pytest.raises(ValueError, match="greedy=False needs samples"):
        train_and_compare(trainer, tmp_path / "out", eval_tasks=3, samples=0, temperature=1.0, env_id="x",
                          greedy=False)
    with pytest.raises(ValueError, match="samples must be >= 0"):
        train_and_compare(trainer, tmp_path / "out", eval_tasks=3, samples=-1, temperature=1.0, env_id="x")


def test_merged_history_keeps_one_record_per_step_in_order():
    logged = [{"step": 1, "r": 0.1}, {"step": 2, "r": 0.2}]
    restored = [{"step": 1, "r": 0.1}, {"step": 2, "r": 0.25}, {"step": 3, "r": 0.3}]   # a resumed MAPPO's train()
    assert merged_history(logged, restored) == restored
    assert merged_history(logged, []) == logged
