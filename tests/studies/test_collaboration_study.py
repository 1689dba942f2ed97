"""The compute-matched collaboration study (studies/collaboration): batch matching, counting, summaries and a tiny
end-to-end run."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from studies.collaboration.study import (
    LEVER_ARMS,
    SHARED_MICRO_BATCH,
    TRAINED_ARMS,
    ArmBatch,
    SamplingCounter,
    StudyConfig,
    comparisons,
    finished_arm,
    matched_batches,
    research_bar,
    run_study,
    setting_summary,
    train_arm,
)
from trainers.experimental.counterfactual import completions_per_transcript


def batch_completions(arm: str, batch: ArmBatch, config: StudyConfig) -> int:
    """What an arm's batch settings sample per step, computed from the settings alone."""
    n, t = config.num_agents, config.num_turns
    s = batch.settings
    if arm == "magrpo":
        return s["prompts_per_step"] * n * sum(s["num_generations"] ** k for k in range(1, t + 1))
    if arm == "solo":
        return s["prompts_per_step"] * s["num_generations"]
    if arm == "shared":
        return s["tasks_per_step"] * s["rows_per_task"]
    if arm == "mappo":
        return s["episodes_per_step"] * n * t
    return s["transcripts_per_step"] * completions_per_transcript(n, t, s["counterfactual_samples"])


@pytest.mark.parametrize("shape", [dict(), dict(prompts_per_step=2), dict(num_generations=2, counterfactual_samples=1),
                                   dict(num_agents=3, num_generations=2, counterfactual_samples=1, prompts_per_step=7)])
def test_every_trained_arm_samples_the_same_completions_per_step(shape):
    config = StudyConfig(**shape)
    batches = matched_batches(config)
    assert set(batches) == set(TRAINED_ARMS)
    for arm, batch in batches.items():
        assert batch.completions_per_step == config.completions_per_step
        assert batch_completions(arm, batch, config) == config.completions_per_step, arm


def test_counterfactual_cost_counts_messages_and_replays():
    # 2 agents x 2 turns, K=2: 4 messages; turn-0 messages: 2 alternatives + both agents' turn 1 for each -> 6 each;
    # turn-1 messages: 2 alternatives each -> 2 each; 4 + 2*6 + 2*2 = 20
    assert completions_per_transcript(2, 2, 2) == 20
    assert completions_per_transcript(2, 2, 1) == 4 + 2 * 3 + 2 * 1


def test_a_lever_arm_runs_only_when_named_with_the_batch_of_magrpo():
    assert "magrpo_incentives" not in matched_batches(StudyConfig())
    batches = matched_batches(StudyConfig(arms=("solo", "magrpo", *LEVER_ARMS)))
    assert batches["magrpo_incentives"].settings == batches["magrpo"].settings
    assert batches["magrpo_final_turn"].settings == batches["magrpo"].settings
    assert batches["magrpo_one_adapter"].settings == batches["magrpo"].settings


def test_a_shape_that_cannot_be_matched_says_which_arm_and_why():
    with pytest.raises(ValueError, match="shared and mappo cannot be matched"):
        matched_batches(StudyConfig(num_turns=3, num_generations=2))        # N·(2+4+8) = 28 rows, not a multiple of 6
    with pytest.raises(ValueError, match="counterfactual cannot be matched"):
        matched_batches(StudyConfig(counterfactual_samples=3))    # 4 + 3·(2·3) + 3·2 = 28 does not divide 40


@pytest.mark.parametrize("bad", [dict(num_turns=1), dict(num_agents=1), dict(num_generations=1), dict(steps=0),
                                 dict(arms=("solo", "debate")), dict(samples=0), dict(evaluate=("sampled",)),
                                 dict(evaluate=("greedy", "beam")), dict(kl_coef=-0.1)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        StudyConfig(**bad)


def scores(turn0, final, transitions):
    """Stored per-task scores as the study keeps them (without the per-seat arrays)."""
    per_turn = np.stack([turn0, final], axis=1)
    return {"tasks": list(range(len(final))), "samples": 1, "temperature": 0.0, "final": list(final),
            "team": list(final), "per_turn": per_turn.tolist(), "transitions": transitions}


def test_setting_summary_gives_the_collaboration_gain_and_transition_rates_of_the_same_episodes():
    # 4 tasks, 2 agents: task 0 both fixed (I→C 2), task 1 one broken (C→I 1, C→C 1), tasks 2-3 unchanged
    turn0, final = np.array([0.0, 1.0, 0.5, 1.0]), np.array([1.0, 0.5, 0.5, 1.0])
    transitions = [[0, 0, 2, 0], [1, 1, 0, 0], [1, 0, 0, 1], [2, 0, 0, 0]]
    summary = setting_summary(scores(turn0, final, transitions))
    assert summary["collaboration_gain"]["mean"] == pytest.approx(0.125)
    counts = {k: summary["transitions"][k] for k in ("c_to_c", "c_to_i", "i_to_c", "i_to_i")}
    assert counts == {"c_to_c": 4, "c_to_i": 1, "i_to_c": 2, "i_to_i": 1}
    assert summary["transitions"]["fix_rate"]["mean"] == pytest.approx(2 / 3)
    assert summary["transitions"]["break_rate"]["mean"] == pytest.approx(1 / 5)
    assert summary["turn0_accuracy"]["mean"] == pytest.approx(0.625)


def test_comparisons_pair_the_arms_by_task_including_shared_against_solo():
    finals = {"untrained": [0, 0, 0, 0], "solo": [1, 0, 0, 0], "shared": [1, 1, 0, 0], "magrpo": [1, 1, 1, 0]}
    arm_scores = {arm: {"greedy": {"final": final, "team": final}} for arm, final in finals.items()}
    paired = comparisons(arm_scores)
    assert paired["shared - solo"]["greedy"]["final_turn_accuracy"]["mean"] == pytest.approx(0.25)
    assert paired["shared - solo"]["greedy"]["final_turn_accuracy"]["better"] == 1
    assert paired["magrpo - shared"]["greedy"]["final_turn_accuracy"]["mean"] == pytest.approx(0.25)
    assert paired["magrpo - solo"]["greedy"]["team_answer_accuracy"]["mean"] == pytest.approx(0.5)
    assert paired["solo - untrained"]["greedy"]["final_turn_accuracy"]["mean"] == pytest.approx(0.25)
    assert "solo - shared" not in paired and "sampled" not in paired["shared - solo"]


def test_research_bar_needs_all_three_conditions():
    def arm(gain_low, fixed, broken):
        return {"greedy": {"collaboration_gain": {"low": gain_low}, "transitions": {"i_to_c": fixed, "c_to_i": broken}}}

    summaries = {"magrpo": arm(0.01, 5, 2), "mappo": arm(0.01, 2, 5)}
    paired = {"magrpo - solo": {"greedy": {"final_turn_accuracy": {"low": 0.02}}},
              "mappo - solo": {"greedy": {"final_turn_accuracy": {"low": 0.02}}}}
    bar = research_bar(summaries, paired)
    assert bar["magrpo"]["met"] and not bar["mappo"]["met"]
    assert not bar["mappo"]["i_to_c_above_c_to_i"]


def test_sampling_counter_counts_real_generations_and_restores_generate():
    from llm_marl.backends.hf import HFPolicy
    from llm_marl.models import tiny_model
    from llm_marl.policy import SamplingParams

    original = HFPolicy.generate
    policy = HFPolicy(*tiny_model(seed=0))
    with SamplingCounter().active() as counter:
        out = policy.generate([[{"role": "user", "content": "1 + 1 ="}]] * 2, SamplingParams(max_new_tokens=5, seed=0),
                              num_samples=3)
    assert HFPolicy.generate is original
    assert counter.completions == 6
    assert counter.answer_tokens == sum(g.num_tokens for row in out for g in row) > 0


@pytest.mark.parametrize("arm", ["solo", "shared", "magrpo", "mappo", "counterfactual", "magrpo_incentives",
                                 "magrpo_final_turn", "magrpo_one_adapter", "magrpo_after_solo",
                                 "magrpo_after_solo_scores"])
def test_each_arm_samples_the_matched_completions(arm, tiny_model_dir, tmp_path):
    config = StudyConfig(model=str(tiny_model_dir), steps=1, max_new_tokens=6, eval_tasks=2, hard_tasks=2, arms=(arm,))
    batch = matched_batches(config)[arm]
    trained = train_arm(arm, config, batch, tmp_path)
    assert trained.counts["completions"] == config.completions_per_step * config.steps
    # tokens: at most the budget, and the same budget for every arm
    assert 0 < trained.counts["answer_tokens"] <= config.completions_per_step * config.max_new_tokens
    assert set(trained.seats) == {"agent_0", "agent_1"}
    for seat, state in trained.seats.items():        # each seat's tensors are named for the seat's adapter
        assert state and all(f".{seat}." in name for name in state)
    one_adapter = arm in ("solo", "shared", "magrpo_one_adapter")     # one trained policy seated in both seats
    first, second = (trained.seats[seat] for seat in ("agent_0", "agent_1"))
    same = all(torch.equal(a, second[name.replace(".agent_0.", ".agent_1.")]) for name, a in first.items())
    assert same == one_adapter



class _Built(Exception):
    """Raised by a spy once an arm's trainer is built: the test reads its settings and trains nothing."""


@pytest.mark.parametrize("arm", ["solo", "shared", "magrpo", "mappo", "counterfactual", "magrpo_final_turn"])
def test_every_arm_trains_with_the_studys_kl_weight(arm, tiny_model_dir, tmp_path, monkeypatch):
    import trainers.magrpo
    import trainers.mappo
    import trainers.trl_bridge

    seen = []

    def spy(self):
        seen.append(self.config.kl_coef)
        raise _Built

    def spy_grpo(env, model, tokenizer, args, **kwargs):
        seen.append(args.beta)
        raise _Built

    monkeypatch.setattr(trainers.magrpo.MAGRPOTrainer, "train", spy)
    monkeypatch.setattr(trainers.mappo.MAPPOTrainer, "train", spy)
    monkeypatch.setattr(trainers.trl_bridge, "make_grpo_trainer", spy_grpo)
    for kl in (0.0, 0.05):
        config = StudyConfig(model=str(tiny_model_dir), steps=1, max_new_tokens=4, eval_tasks=2, hard_tasks=2,
                             arms=(arm,), kl_coef=kl)
        with pytest.raises(_Built):
            train_arm(arm, config, matched_batches(config)[arm], tmp_path / str(kl))
    assert seen == [0.0, 0.05]       # MAPPO's own default (0.05) and TRL's (beta) do not leak into the study


def test_the_shared_arm_takes_one_optimizer_step_per_matched_batch_of_micro_batches(tiny_model_dir, tmp_path):
    config = StudyConfig(model=str(tiny_model_dir), steps=2, max_new_tokens=6, eval_tasks=2, hard_tasks=2,
                         arms=("shared",))
    batch = matched_batches(config)["shared"]
    assert batch.settings["tasks_per_step"] * batch.settings["rows_per_task"] > SHARED_MICRO_BATCH  # accumulates
    trained = train_arm("shared", config, batch, tmp_path)
    assert trained.counts["completions"] == config.completions_per_step * 2
    assert [row["step"] for row in trained.history if "loss" in row] == [1, 2]


def test_a_tiny_study_writes_results_checkpoints_and_resumes(tmp_path, tiny_model_dir):
    from llm_marl.team_checkpoint import load_team

    config = StudyConfig(model=str(tiny_model_dir), arms=("untrained", "magrpo"), steps=1, max_new_tokens=6,
                         eval_tasks=3,
                         hard_tasks=2)
    lines = []
    results = run_study(config, tmp_path, log=lines.append)
    assert set(results["arms"]) == {"untrained", "magrpo"}
    greedy = results["arms"]["magrpo"]["greedy"]
    assert greedy["tasks"] == 3 and "collaboration_gain" in greedy
    assert results["matching"]["magrpo"]["sampled_in_training"]["completions"] == config.completions_per_step
    assert "magrpo - untrained" in results["paired_differences"]
    assert (tmp_path / "summary.png").stat().st_size > 0
    assert (tmp_path / "arms" / "magrpo" / "greedy" / "report.html").is_file()
    assert json.loads((tmp_path / "results.json").read_text())["config"]["steps"] == 1
    team = load_team(tmp_path / "arms" / "magrpo" / "team")
    assert team.agents == ["agent_0", "agent_1"]
    again = []
    run_study(config, tmp_path, log=again.append)
    assert any("already done" in line for line in again if line.startswith("magrpo"))


def test_arms_run_in_parallel_jobs_give_the_same_results_as_one_process(tmp_path, tiny_model_dir):
    config = StudyConfig(model=str(tiny_model_dir), arms=("untrained", "solo"), steps=1, max_new_tokens=4,
                         eval_tasks=2, hard_tasks=1, num_generations=2, counterfactual_samples=1)
    one = run_study(config, tmp_path / "one", log=lambda line: None)
    lines = []
    two = run_study(config, tmp_path / "two", log=lines.append, jobs=2)
    assert any(line.startswith("running 2 arms, 2 at a time") for line in lines)
    assert two["jobs"] == 2
    for arm in config.arms:
        stored = [json.loads((tmp_path / run / "arms" / arm / "arm.json").read_text()) for run in ("one", "two")]
        assert stored[0]["scores"] == stored[1]["scores"], arm
        assert stored[0]["counts"] == stored[1]["counts"], arm
    assert one["paired_differences"] == two["paired_differences"]
    with pytest.raises(ValueError, match="jobs"):
        run_study(config, tmp_path / "bad", jobs=0)


def test_seed_repeats_train_each_seed_again_and_report_the_spread(tmp_path, tiny_model_dir):
    from studies.collaboration.study import run_seeds

    config = StudyConfig(model=str(tiny_model_dir), arms=("solo", "magrpo"), steps=1, max_new_tokens=4,
                         eval_tasks=3, hard_tasks=1, num_generations=2, counterfactual_samples=1, evaluate=("greedy",))
    with pytest.raises(ValueError, match="two distinct seeds"):
        run_seeds(config, tmp_path, [3, 3])
    results = run_seeds(config, tmp_path, [0, 1], log=lambda line: None)
    records = {seed: json.loads((tmp_path / f"seed-{seed}" / "arms" / "magrpo" / "arm.json").read_text())
               for seed in (0, 1)}
    assert all(set(r["scores"]) == {"greedy"} for r in records.values())    # only the named setting was played
    assert records[0]["history"] != records[1]["history"]                   # each seed trained again
    spread = results["arms"]["magrpo"]["final_turn_minus_solo"]
    per_seed = [json.loads((tmp_path / f"seed-{seed}" / "results.json").read_text())["paired_differences"]
                ["magrpo - solo"]["greedy"]["final_turn_accuracy"]["mean"] for seed in (0, 1)]
    assert [spread["per_seed"][s]["mean"] for s in ("0", "1")] == per_seed
    assert spread["mean"] == pytest.approx(sum(per_seed) / 2)
    assert spread["min"] == min(per_seed) and spread["max"] == max(per_seed)
    assert set(results["arms"]["magrpo"]["research_bar_met"]) == {"0", "1"}
    assert (tmp_path / "seeds.png").stat().st_size > 0
    assert json.loads((tmp_path / "seeds.json").read_text())["seeds"] == [0, 1]


def test_a_record_that_played_more_settings_is_reused_for_fewer(tmp_path, tiny_model_dir):
    config = StudyConfig(model=str(tiny_model_dir), arms=("untrained",), steps=1, max_new_tokens=4, eval_tasks=2,
                         hard_tasks=1, evaluate=("greedy", "hard"))
    run_study(config, tmp_path, log=lambda line: None)
    lines = []
    fewer = run_study(replace(config, evaluate=("greedy",)), tmp_path, log=lines.append)
    assert any("already done" in line for line in lines)
    assert set(fewer["arms"]["untrained"]) >= {"greedy"} and "hard" not in fewer["arms"]["untrained"]
    assert finished_arm(replace(config, evaluate=("greedy", "sampled")), tmp_path, "untrained") is None


def test_the_after_solo_arm_trains_half_its_steps_alone_then_both_seats_from_that_adapter(tmp_path, tiny_model_dir,
                                                                                         monkeypatch):
    from trainers.common.checkpoint import latest_checkpoint
    from trainers.magrpo import MAGRPOTrainer

    entered = []         # each phase's team at the start of its training: agents and adapter tensors per agent
    train = MAGRPOTrainer.train

    def recording_train(self):
        entered.append({a: {k: v.clone() for k, v in self.team.policy(a).trainable_state_dict(a).items()}
                        for a in self.agents})
        return train(self)

    monkeypatch.setattr(MAGRPOTrainer, "train", recording_train)
    config = StudyConfig(model=str(tiny_model_dir), steps=2, max_new_tokens=6, eval_tasks=2, hard_tasks=2,
                         arms=("magrpo_after_solo",))
    batch = matched_batches(config)["magrpo_after_solo"]
    assert batch.how.startswith("1 step(s) as solo (10 prompts x G=4") and "then 1 of the magrpo tree" in batch.how
    trained = train_arm("magrpo_after_solo", config, batch, tmp_path)
    assert [row["phase"] for row in trained.history] == ["solo", "debate"]
    assert "turn1/joint_reward_mean" not in trained.history[0] and "turn1/joint_reward_mean" in trained.history[1]
    assert trained.counts["completions"] == 2 * config.completions_per_step    # 40 single answers, then one tree
    solo_phase, debate_phase = entered
    assert list(solo_phase) == ["agent_0"] and list(debate_phase) == ["agent_0", "agent_1"]
    # LoRA A starts random per adapter: at the debate's start agent_1 holds agent_0's adapter as the solo phase left it
    assert all(torch.equal(t, debate_phase["agent_1"][name.replace(".agent_0.", ".agent_1.")])
               for name, t in debate_phase["agent_0"].items())
    assert latest_checkpoint(tmp_path / "solo") is not None and latest_checkpoint(tmp_path / "debate") is not None


def test_the_show_scores_arms_debate_with_scores_and_their_control_is_the_solo_adapter_in_that_debate(
        tmp_path, tiny_model_dir, monkeypatch):
    from safetensors.torch import load_file

    from studies.collaboration.study import Evaluator
    from trainers.magrpo import MAGRPOTrainer

    config = StudyConfig(model=str(tiny_model_dir), steps=2, max_new_tokens=6, eval_tasks=2, hard_tasks=2,
                         arms=("solo_scores", "magrpo_after_solo_scores"), evaluate=("greedy",))
    assert config.arms == ("untrained", "solo", "solo_scores", "magrpo_after_solo_scores")   # the source comes first
    # the Evaluator switches the debate (and the harder debate) to show_scores and back; the vote has one turn
    evaluator = Evaluator(config)
    plain = evaluator.envs
    evaluator.use_debate({"show_scores": True})
    assert evaluator.envs["debate"].show_scores and evaluator.envs["hard"].show_scores
    evaluator.use_debate({})
    assert evaluator.envs is plain and not plain["debate"].show_scores

    trained_in = []
    train = MAGRPOTrainer.train

    def recording_train(self):
        trained_in.append(getattr(self.env, "show_scores", None) if self.env.num_turns > 1 else "solo")
        return train(self)

    monkeypatch.setattr(MAGRPOTrainer, "train", recording_train)
    results = run_study(config, tmp_path, log=lambda line: None)
    assert trained_in == ["solo", "solo", True]      # solo; the lever's solo phase; its debate phase with scores
    records = {arm: json.loads((tmp_path / "arms" / arm / "arm.json").read_text()) for arm in config.arms}
    assert records["solo_scores"]["train_seconds"] == 0
    assert records["solo_scores"]["counts"] == records["solo"]["counts"]

    def seats(arm):
        step = sorted((tmp_path / "arms" / arm / "team" / "checkpoints").glob("step-*"))[-1]
        return {seat: load_file(step / "agents" / seat / "adapter_model.safetensors")
                for seat in ("agent_0", "agent_1")}

    solo, replayed = seats("solo"), seats("solo_scores")
    assert all(torch.equal(t, replayed[seat][name]) for seat in solo for name, t in solo[seat].items())
    paired = results["paired_differences"]
    assert "magrpo_after_solo_scores - solo_scores" in paired and "magrpo_after_solo_scores - solo" in paired
    assert not any(key.endswith("- solo_scores") and not key.startswith("magrpo_after_solo_scores") for key in paired)
    bar = results["research_bar"]["magrpo_after_solo_scores"]
    assert {"final_above_solo", "final_above_solo_scores"} <= set(bar)


def test_a_replayed_arm_without_its_source_says_so(tmp_path, tiny_model_dir):
    from studies.collaboration.study import Evaluator, run_arm

    config = StudyConfig(model=str(tiny_model_dir), steps=1, max_new_tokens=4, eval_tasks=2, hard_tasks=1,
                         arms=("solo_scores",), evaluate=("greedy",))
    with pytest.raises(ValueError, match="run the solo arm first"):
        run_arm("solo_scores", config, tmp_path, Evaluator(config), log=lambda line: None)
