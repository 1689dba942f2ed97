"""The supervised start of the warm-start study (studies/information_split/supervised_start.py): the solver's answers
are right, the prompts are the ones a full-view agent is given in play, and training raises the demonstrations'
likelihood and leaves a checkpoint every seat of a study starts from."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from studies.information_split.study import Evaluator, StudyConfig
from studies.information_split.supervised_start import (
    SupervisedConfig,
    demonstration,
    demonstration_rows,
    main,
    sampled_diversity,
    train_supervised,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("env, kwargs", [("reference_game-v0", {"letter_position": "after"}),
                                         ("reference_game-v0", {"letter_position": "before", "num_candidates": 6}),
                                         ("split_arithmetic-v0", {}), ("hidden_profile-v0", {"num_requirements": 3})])
def test_the_solvers_answers_are_right_by_the_envs_verifier(env, kwargs):
    config = SupervisedConfig(study=StudyConfig(env=env, env_kwargs=kwargs), examples=1)
    full = config.full_view_env("train")
    for task in full.tasks[:200]:
        text = demonstration(full, task)
        assert full.verify(text, task).correct, text
        if env.startswith("split"):
            wrong = dict(task, answer=str(int(task["answer"]) + 1))
        else:                                       # another candidate's letter
            wrong = dict(task, answer="B" if task["answer"] == "A" else "A")
        assert not full.verify(demonstration(full, wrong), task).correct
    if env == "hidden_profile-v0":                   # four candidates ruled out, each by a negative fact it names
        for task in full.tasks[:50]:
            ruled_out = demonstration(full, task).split("Ruled out: ")[1].split(".")[0].split(", ")
            right = task["candidates"][ord(task["answer"]) - ord("A")]
            assert sorted([*ruled_out, right]) == sorted(task["candidates"])
            prompt = full.first_prompt(0, task)[1]["content"]
            negatives = [full.fact_text(task, fact) for facts in task["facts"] for fact in facts if not fact[2]]
            assert all(text in prompt for text in negatives)
            assert ruled_out == list(dict.fromkeys(text.split(" ")[0] for text in negatives))
    if kwargs.get("letter_position") == "after":       # the line the instruction asks to repeat, then the letter
        task = full.tasks[0]
        line = f"{task['target']} ({task['answer']})"
        assert line in full.view_text(task, 1) and demonstration(full, task).startswith(line + "\n")


def test_an_env_without_a_solver_or_a_full_view_of_two_turns_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="no solver-written answers for chess"):
        demonstration(type("Chess", (), {"metadata": {"name": "chess"}})(), {"answer": "e4"})
    with pytest.raises(ValueError, match="examples must be >= 1"):
        SupervisedConfig(examples=0)
    config = SupervisedConfig(study=StudyConfig(env="split_arithmetic-v0", solo_turns=2, model=str(tiny_model_dir)))
    from llm_marl.models import tiny_model

    model, tokenizer = tiny_model(seed=0)
    from llm_marl.team import Team

    policy = Team.adapter_per_agent(model, tokenizer, ["agent_0"]).policy("agent_0")
    with pytest.raises(ValueError, match="full view with 1 turn, not 2"):
        demonstration_rows(policy, config.full_view_env("train"), [0])


def test_the_prompts_are_the_ones_a_full_view_agent_answers_in_play(tiny_model_dir):
    from llm_marl.backends.hf import HFPolicy
    from llm_marl.policy import SamplingParams
    from llm_marl.rollout import RolloutEngine
    from llm_marl.team import Team

    config = SupervisedConfig(study=StudyConfig(env="reference_game-v0", model=str(tiny_model_dir),
                                                env_kwargs={"letter_position": "after"}), examples=3)
    evaluator_team = Evaluator(StudyConfig(env="reference_game-v0", model=str(tiny_model_dir), eval_tasks=3,
                                           env_kwargs={"letter_position": "after"})).team
    policy = evaluator_team.policy("agent_0")
    env = config.full_view_env("train")
    rows = demonstration_rows(policy, env, [4, 7])
    seen = []
    original = HFPolicy.generate

    def recording(self, conversations, params, **kwargs):
        seen.extend(self.encode(c) for c in conversations)
        return original(self, conversations, params, **kwargs)

    HFPolicy.generate = recording
    try:
        engine = RolloutEngine(env, Team.from_policies({"agent_0": (policy, "agent_0")}))
        engine.collect(seeds=[0, 1], task_indices=[4, 7], params=SamplingParams(max_new_tokens=2, temperature=0.0))
    finally:
        HFPolicy.generate = original
    assert seen == [prompt for prompt, _ in rows]
    tokenizer = policy.tokenizer
    for (_, target), index in zip(rows, [4, 7]):
        assert target[-1] == tokenizer.eos_token_id and target[-1] in policy.stop_ids
        assert tokenizer.decode(target[:-1]) == demonstration(env, env.tasks[index])


def test_training_raises_the_demonstrations_likelihood_and_every_seat_starts_from_it(tiny_model_dir, tmp_path):
    study = StudyConfig(env="split_arithmetic-v0", model=str(tiny_model_dir), eval_tasks=2, max_new_tokens=4)
    config = SupervisedConfig(study=study, examples=8, epochs=10, batch_size=4, learning_rate=1e-2, eval_tasks=2)
    before = Evaluator(study)
    rows = demonstration_rows(before.policy, config.full_view_env("train"), range(8))

    def mean_logprob(policy):
        with torch.no_grad():
            logprobs, mask = policy.token_logprobs([p for p, _ in rows], [t for _, t in rows], adapter="agent_0")
        return float((logprobs * mask).sum() / mask.sum())

    record = train_supervised(config, tmp_path, log=lambda _: None)
    assert len(record["losses"]) == config.steps == 20
    assert json.loads((tmp_path / "supervised.json").read_text())["checkpoint"] == record["checkpoint"]
    assert (tmp_path / "supervised.png").stat().st_size > 0
    assert record["held_out"]["tasks"] == 2 and 0 <= record["held_out"]["accuracy"] <= 1
    assert len(record["sampled_diversity"]["zero_advantage_groups"]) == study.num_turns
    started = Evaluator(replace(study, arms=("untrained",), warm_start=record["checkpoint"]))
    seats = started.untrained
    assert all(torch.equal(a, b) for a, b in zip(seats["agent_0"].values(), seats["agent_1"].values()))
    untrained, trained = mean_logprob(before.policy), mean_logprob(started.policy)
    # the tiny random base gains about 0.9 nat per target token in these 20 steps (measured); untrained: -10.8
    assert trained > untrained + 0.5, (untrained, trained)
    assert record["losses"][-1] < record["losses"][0]


def test_a_start_whose_sampled_groups_earn_equal_rewards_is_reported_as_too_sharp(tiny_model_dir, tmp_path):
    from llm_marl.team import Team
    from studies.collaboration.study import base_model

    near_greedy = StudyConfig(env="split_arithmetic-v0", model=str(tiny_model_dir), max_new_tokens=4,
                              temperature=1e-6)
    config = SupervisedConfig(study=near_greedy, examples=4, batch_size=4, eval_tasks=0, probe_steps=2)
    lines = []
    record = train_supervised(config, tmp_path, log=lines.append)
    probe = record["sampled_diversity"]
    assert probe["steps"] == 2 and probe["identical_groups"] == probe["zero_advantage_groups"] == [1.0, 1.0]
    assert probe["entropy_estimate"][-1] < 1e-3
    assert any(line.startswith("warning: 100% of MAGRPO's last-turn sample groups") and "(100% have identical" in line
               for line in lines)

    sampled = replace(config, study=replace(near_greedy, temperature=1.0))
    model, tokenizer = base_model(sampled.study)
    probe = sampled_diversity(sampled, Team.adapter_per_agent(model, tokenizer, ["agent_0", "agent_1"]))
    # the random tiny model never repeats its 4 sampled tokens exactly; nor is it ever right (every group earns 0)
    assert probe["identical_groups"] == [0.0, 0.0] and probe["zero_advantage_groups"] == [1.0, 1.0]
    assert min(probe["entropy_estimate"]) > 1.0
    with pytest.raises(ValueError, match="probe_steps >= 0"):
        SupervisedConfig(study=near_greedy, probe_steps=-1)


def test_the_command_refuses_a_bad_env_argument_in_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["--env", "reference_game-v0", "--env-arg", "num_candidates=1", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "num_candidates must be an int in [2, 8], got 1" in capsys.readouterr().err
