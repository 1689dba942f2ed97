"""The information-split study (studies/information_split): compute matching of its arms, the communication
ablation's masking, the own-view control never seeing another view, and a tiny end-to-end run that resumes."""
from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import llm_marl_envs
from llm_marl_envs.envs.split_arithmetic import SplitArithmeticEnv
from llm_marl_envs.testing import mentions
from studies.information_split.study import (
    ARMS,
    Evaluator,
    StudyConfig,
    matched_batches,
    train_arm,
)
from trainers.experimental.counterfactual import completions_per_transcript

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TRAINED = ARMS[1:]
TINY = dict(steps=1, max_new_tokens=6, eval_tasks=3, num_generations=2, counterfactual_samples=1, transcripts=2)


def tiny_config(model_dir, **overrides) -> StudyConfig:
    return StudyConfig(model=str(model_dir), **{**TINY, **overrides})


@contextlib.contextmanager
def received_conversations():
    """Every conversation any HF policy is asked to continue inside the block (the real generate runs)."""
    from llm_marl.backends.hf import HFPolicy

    original, seen = HFPolicy.generate, []

    def recording(policy, conversations, params, **kwargs):
        seen.extend([dict(m) for m in conversation] for conversation in conversations)
        return original(policy, conversations, params, **kwargs)

    HFPolicy.generate = recording
    try:
        yield seen
    finally:
        HFPolicy.generate = original


# ------------------------------------------------------------------ matching
def batch_completions(arm, batch, config):
    """What an arm's batch samples per step, computed from its settings alone."""
    n, t, s = config.num_agents, config.num_turns, batch.settings
    if arm == "magrpo":
        return s["prompts_per_step"] * n * sum(s["num_generations"] ** k for k in range(1, t + 1))
    if arm == "own_view_solo":
        return n * s["prompts_per_step"] * s["num_generations"]     # one trainer per role
    if arm == "full_view_solo":
        return s["prompts_per_step"] * s["num_generations"]
    if arm == "mappo":      # task trees of G answers per agent and node
        return s["episodes_per_step"] * n * sum(s["num_generations"] ** k for k in range(1, t + 1))
    return s["transcripts_per_step"] * completions_per_transcript(n, t, s["counterfactual_samples"])


@pytest.mark.parametrize("env", ["split_arithmetic-v0", "reference_game-v0", "hidden_profile-v0"])
@pytest.mark.parametrize("shape", [{}, {"prompts_per_step": 2}, {"num_generations": 2, "counterfactual_samples": 1}])
def test_every_trained_arm_samples_the_same_completions_per_step(env, shape):
    config = StudyConfig(env=env, **shape)
    batches = matched_batches(config)
    assert set(batches) == set(TRAINED)
    for arm, batch in batches.items():
        assert batch.completions_per_step == config.completions_per_step
        assert batch_completions(arm, batch, config) == config.completions_per_step, arm


@pytest.mark.parametrize("bad", [{"env": "arithmetic_debate-v0"}, {"arms": ("solo",)}, {"num_turns": 1},
                                 {"num_generations": 1}, {"steps": 0}, {"mappo_critic_depth": 0},
                                 {"mappo_critic_depth": 2.5}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        StudyConfig(**bad)


@pytest.mark.parametrize("arm", TRAINED)
def test_each_arm_samples_the_matched_completions_in_a_real_step(arm, tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, arms=(arm,))
    trained = train_arm(arm, config, matched_batches(config)[arm], tmp_path)
    assert trained.counts["completions"] == config.completions_per_step * config.steps
    assert 0 < trained.counts["answer_tokens"] <= config.completions_per_step * config.max_new_tokens
    assert set(trained.seats) == {"agent_0", "agent_1"}
    for seat, state in trained.seats.items():
        assert state and all(f".{seat}." in name for name in state)


# ------------------------------------------------------------------ the own-view control sees its view only
def first_prompt_index(env):
    """The first user message of every task and agent of ``env`` -> the (env, task, role) that produce it."""
    index = {}
    for task_index in range(len(env.tasks)):
        _, infos = env.reset(options={"task_index": task_index})
        for agent in env.possible_agents:
            content = next(m["content"] for m in infos[agent]["messages"] if m["role"] == "user")
            roles = env.agent_roles(env.agent_index(agent))
            index.setdefault(content, []).append((env, env.task, roles))
    return index


def other_view_facts_in(conversation, index):
    """Private facts of a view the conversation's agent lacks that its first prompt (system and first user message)
    holds; the conversation's task and roles are looked up by its first user message (KeyError: not a prompt of
    these envs)."""
    opening = conversation[:next(i for i, m in enumerate(conversation) if m["role"] == "user") + 1]
    text = "\n".join(m["content"] for m in opening)
    leaked = set()
    for env, task, roles in index[opening[-1]["content"]]:
        allowed = "\n".join([env.task_statement(task), *(f for r in roles for f in env.private_facts(task, r))])
        leaked |= {fact for r in range(len(env.role_names)) if r not in roles for fact in env.private_facts(task, r)
                   if not mentions(allowed, fact) and mentions(text, fact)}
    return sorted(leaked)


def own_view_prompts(config, tmp_path):
    """Every conversation the own_view_solo arm's policy receives in training and in its evaluation, and the index of
    the envs' first prompts (each role alone on the train split; the team on the test split)."""
    from studies.information_split.study import run_arm

    with received_conversations() as seen:
        run_arm("own_view_solo", config, tmp_path, Evaluator(config), log=lambda line: None)
    index = {}
    for seat in range(config.num_agents):
        index.update(first_prompt_index(config.make_env("train", view="own", seat=seat, turns=config.solo_turns)))
    index.update(first_prompt_index(config.make_env("test")))
    return seen, index


def test_the_own_view_agent_never_sees_another_view_in_training_or_evaluation(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, arms=("own_view_solo",))
    seen, index = own_view_prompts(config, tmp_path)
    # training: both roles' trainers (C / (N·G) prompts x G each); evaluation: 3 tasks x 2 seats x 2 turns
    assert len(seen) >= 2 + config.eval_tasks * 2 * 2
    roles_seen = {next(m["content"] for m in c if m["role"] == "user").split("What you know (as the ")[1][:30]
                  for c in seen}
    assert len(roles_seen) == 2                     # both roles' views were given (to their own agents)
    for conversation in seen:
        assert other_view_facts_in(conversation, index) == [], conversation


def test_the_own_view_check_fails_when_a_prompt_leaks_the_other_view(tiny_model_dir, tmp_path, monkeypatch):
    def leaky_view(self, task, role):
        hint = f" (the other number is {task['b']})" if role == 0 else ""
        return f"The first number is {task['a']}.{hint}" if role == 0 else original(self, task, role)

    original = SplitArithmeticEnv.view_text
    monkeypatch.setattr(SplitArithmeticEnv, "view_text", leaky_view)
    config = tiny_config(tiny_model_dir, arms=("own_view_solo",), eval_tasks=2)
    seen, index = own_view_prompts(config, tmp_path)
    leaks = [other_view_facts_in(c, index) for c in seen]
    assert any(leaks)
    assert all(leak == [] for c, leak in zip(seen, leaks) if "holder of the first number" not in c[1]["content"])


# ------------------------------------------------------------------ the communication ablation
def test_a_masked_partners_text_never_reaches_a_prompt_of_the_ablation(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, arms=("magrpo",), eval_tasks=4)
    evaluator = Evaluator(config)
    # random adapters, so that each seat writes distinctive text (the tiny base alone writes only newlines)
    noise = torch.Generator().manual_seed(0)
    evaluator.load({seat: {name: torch.randn(t.shape, generator=noise) * 2 for name, t in state.items()}
                    for seat, state in evaluator.untrained.items()})
    agents = evaluator.envs["masked"].possible_agents
    assert evaluator.envs["masked"].mask_messages and not evaluator.envs["team"].mask_messages

    def played(setting):
        with received_conversations() as seen:
            _, episodes = evaluator.play(setting, tmp_path, label="test")
        partner_texts = [(e["responses"][0][j], agents[j]) for e in episodes for j in range(len(agents))]
        user_texts = [m["content"] for c in seen for m in c if m["role"] == "user"]
        return [text.strip() for text, _ in partner_texts if len(text.strip()) >= 4], user_texts

    texts, prompts = played("team")
    assert texts and any(text in prompt for text in texts for prompt in prompts)   # unmasked: the messages arrive
    texts, prompts = played("masked")
    assert texts
    assert not any(text in prompt for text in texts for prompt in prompts)
    assert any("Message from Agent 1:" in prompt for prompt in prompts)    # the message's place is there, empty


# ------------------------------------------------------------------ the command, end to end
def test_the_command_runs_every_arm_writes_results_and_resumes(tiny_model_dir, tmp_path):
    from llm_marl.team_checkpoint import load_team
    from studies.information_split import run

    argv = ["--env", "split_arithmetic-v0", "--out", str(tmp_path), "--model", str(tiny_model_dir), "--steps", "1",
            "--eval-tasks", "3", "--max-new-tokens", "6", "--num-generations", "2", "--counterfactual-samples", "1",
            "--transcripts", "2", "--jobs", "1", "--threads", "1"]
    run.main(argv)
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["arms"]) == set(ARMS)
    assert results["command"].startswith("python -m studies.information_split.run --env split_arithmetic-v0")
    assert results["date"] and results["machine"]["processor"]
    c = results["completions_per_step"]
    assert {arm: m["sampled_in_training"]["completions"] for arm, m in results["matching"].items()} == \
        dict.fromkeys(ARMS[1:], c)
    for arm in ("magrpo", "mappo", "counterfactual"):
        assert set(results["arms"][arm]) >= {"team", "masked"}
        assert results["arms"][arm]["team"]["tasks"] == 3 and len(results["arms"][arm]["team"]["seats"]) == 2
        assert {f"{arm} - untrained", f"{arm} - own_view_solo", f"{arm} - masked {arm}"} <= \
            set(results["paired_differences"])
        assert set(results["research_bar"][arm]) == {"above_untrained", "above_own_view_solo", "above_masked",
                                                     "met"}
        assert (tmp_path / "arms" / arm / "masked" / "report.html").is_file()
        assert load_team(tmp_path / "arms" / arm / "team").agents == ["agent_0", "agent_1"]
    assert "full" in results["arms"]["full_view_solo"] and "team" not in results["arms"]["full_view_solo"]
    assert list(results["arms"]["untrained"]) == ["team", "train_seconds", "eval_seconds", "play_seconds",
                                                  "checkpoint", "commit", "finished"]
    assert {arm["commit"] for arm in results["arms"].values()} == {results["commit"]}
    assert set(results["arms"]["magrpo"]["play_seconds"]) == {"team", "masked"}
    protocol = results["protocol"]
    assert len(protocol["untrained"]) == 2 and len(protocol["untrained"][0]["turn0_messages"]) == 2
    assert protocol["magrpo"][0]["task_id"] == protocol["untrained"][0]["task_id"]
    assert (tmp_path / "summary.png").stat().st_size > 0
    assert (tmp_path / "training.png").stat().st_size > 0
    assert set(results["training"]) == {"own_view_solo (role 0)", "own_view_solo (role 1)", "full_view_solo",
                                        "magrpo", "mappo", "counterfactual"}
    assert all(curve["step"] == [1] for curve in results["training"].values())
    stamps = {arm: (tmp_path / "arms" / arm / "arm.json").stat().st_mtime_ns for arm in ARMS}
    lines = []
    from studies.information_split.study import run_study

    run_study(StudyConfig(**{**TINY, "max_new_tokens": 6}, model=str(tiny_model_dir), env="split_arithmetic-v0"),
              tmp_path, log=lines.append)
    assert sum("already done" in line for line in lines) == len(ARMS)
    assert stamps == {arm: (tmp_path / "arms" / arm / "arm.json").stat().st_mtime_ns for arm in ARMS}


def test_the_evaluation_batch_bounds_the_episodes_played_together_and_changes_no_answer_or_key(tiny_model_dir,
                                                                                                tmp_path):
    from llm_marl.backends.hf import HFPolicy

    answers, widths = {}, {}
    for batch in (2, 128):
        config = tiny_config(tiny_model_dir, arms=("untrained",), eval_tasks=5, eval_batch=batch)
        evaluator = Evaluator(config)
        noise = torch.Generator().manual_seed(2)     # random adapters: each seat writes distinctive text
        evaluator.load({seat: {n: torch.randn(t.shape, generator=noise) for n, t in state.items()}
                        for seat, state in evaluator.untrained.items()})
        original, calls = HFPolicy.generate, []

        def recording(policy, conversations, params, **kwargs):
            calls.append(len(conversations))
            return original(policy, conversations, params, **kwargs)

        HFPolicy.generate = recording
        try:
            _, episodes = evaluator.play("team", tmp_path / str(batch))
        finally:
            HFPolicy.generate = original
        answers[batch], widths[batch] = [e["responses"] for e in episodes], max(calls)
    assert widths == {2: 2 * 2, 128: 5 * 2}          # episodes at once × the team's two agents
    assert answers[2] == answers[128] and any(r.strip() for e in answers[2] for turn in e for r in turn)
    assert tiny_config(tiny_model_dir, eval_batch=2).key("magrpo") == tiny_config(tiny_model_dir).key("magrpo")
    with pytest.raises(ValueError, match="eval_batch must be >= 1"):
        tiny_config(tiny_model_dir, eval_batch=0)


def test_an_arm_stopped_during_its_evaluation_is_evaluated_from_its_checkpoint_not_trained_again(
        tiny_model_dir, tmp_path, monkeypatch):
    import studies.information_split.study as study

    config = tiny_config(tiny_model_dir, arms=("magrpo",), eval_tasks=2)
    train, play = study.train_arm, Evaluator.play
    trained_seats = {}

    def train_then_perturb(*args, **kwargs):       # the real step, then weights that differ from the start
        arm = train(*args, **kwargs)
        noise = torch.Generator().manual_seed(3)
        arm.seats = {seat: {n: t + torch.randn(t.shape, generator=noise) for n, t in state.items()}
                     for seat, state in arm.seats.items()}
        trained_seats.update(arm.seats)
        return arm

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt("stopped during the evaluation")

    monkeypatch.setattr(study, "train_arm", train_then_perturb)
    monkeypatch.setattr(Evaluator, "play", stopped)
    with pytest.raises(KeyboardInterrupt):
        study.run_arm("magrpo", config, tmp_path, Evaluator(config), log=lambda _: None)
    assert not (tmp_path / "arms" / "magrpo" / "arm.json").exists()
    first_counts = json.loads((tmp_path / "arms" / "magrpo" / "trained.json").read_text())["counts"]

    def trained_again(*args, **kwargs):
        raise AssertionError("the arm was trained again")

    monkeypatch.setattr(study, "train_arm", trained_again)
    monkeypatch.setattr(Evaluator, "play", play)
    evaluator = Evaluator(config)
    record = study.run_arm("magrpo", config, tmp_path, evaluator, log=lambda _: None)
    assert record["counts"] == first_counts and first_counts["completions"] > 0
    assert record["checkpoint"].endswith("step-000001") and "team" in record["scores"]
    for seat in evaluator.seats:                     # the seats it played are the ones trained and saved
        assert distance(evaluator.policy.trainable_state_dict(seat), trained_seats[seat]) == 0
        assert distance(evaluator.untrained[seat], trained_seats[seat]) > 0.5
    other = replace(config, learning_rate=1e-3)      # other settings: that training is not this arm's
    with pytest.raises(AssertionError, match="trained again"):
        study.run_arm("magrpo", other, tmp_path, Evaluator(other), log=lambda _: None)


@pytest.mark.parametrize("arm, stop_at", [("magrpo", 2), ("mappo", 2), ("counterfactual", 2),
                                          ("own_view_solo", 2), ("own_view_solo", 3)])
def test_a_training_stopped_mid_way_resumes_from_its_checkpoint_with_the_whole_runs_counts(
        arm, stop_at, tiny_model_dir, tmp_path, monkeypatch):
    """Stopped at its ``stop_at``-th step (own_view_solo: role 0's steps 1-2, then role 1's), a step-1 checkpoint
    on every step: the second call trains only the steps not yet checkpointed, and ends where an uninterrupted
    training ends (weights, counts, history)."""
    import studies.information_split.study as study
    from trainers.common.trainer import Trainer

    config = tiny_config(tiny_model_dir, arms=(arm,), steps=2)
    batch = matched_batches(config)[arm]
    settings = study.collaboration._trainer_config_kwargs
    monkeypatch.setattr(study.collaboration, "_trainer_config_kwargs",
                        lambda *args: {**settings(*args), "save_every": 1})
    whole = train_arm(arm, config, batch, tmp_path / "whole")
    step, steps_trained, stopped = Trainer.train_step, [], []

    def counted_step(trainer):
        steps_trained.append(trainer.step + 1)
        if len(steps_trained) == stop_at and not stopped:
            stopped.append(trainer.step + 1)
            raise KeyboardInterrupt("stopped during training")
        return step(trainer)

    monkeypatch.setattr(Trainer, "train_step", counted_step)
    with pytest.raises(KeyboardInterrupt):
        train_arm(arm, config, batch, tmp_path / "stopped")
    steps_trained.clear()
    resumed = train_arm(arm, config, batch, tmp_path / "stopped")
    roles = 2 if arm == "own_view_solo" else 1
    assert len(steps_trained) == 2 * roles - (stop_at - 1)          # the checkpointed steps are not trained again
    assert resumed.counts == whole.counts and resumed.counts["completions"] == 2 * config.completions_per_step
    assert [row["step"] for row in resumed.history] == [row["step"] for row in whole.history] == [1, 2] * roles
    for seat in whole.seats:
        assert distance(resumed.seats[seat], whole.seats[seat]) < 1e-5
    other = replace(config, learning_rate=1e-3)     # a folder trained with other settings is not resumed
    steps_trained.clear()
    train_arm(arm, other, batch, tmp_path / "stopped")
    assert len(steps_trained) == 2 * roles


def test_an_arm_with_other_settings_is_run_again(tiny_model_dir, tmp_path):
    from studies.information_split.study import finished_arm, run_study

    config = tiny_config(tiny_model_dir, arms=("untrained",), eval_tasks=2)
    run_study(config, tmp_path, log=lambda line: None)
    assert finished_arm(config, tmp_path, "untrained") is not None
    assert finished_arm(tiny_config(tiny_model_dir, arms=("untrained",), eval_tasks=3), tmp_path, "untrained") is None


@pytest.mark.parametrize("env, chance", [("reference_game-v0", 0.25), ("split_arithmetic-v0", None)])
def test_results_give_the_envs_chance_accuracy(env, chance, tiny_model_dir, tmp_path):
    from studies.information_split.study import run_study

    results = run_study(tiny_config(tiny_model_dir, env=env, arms=("untrained",), eval_tasks=2), tmp_path,
                        log=lambda line: None)
    assert results["chance_accuracy"] == chance
    assert json.loads((tmp_path / "results.json").read_text())["chance_accuracy"] == chance
    assert (tmp_path / "summary.png").stat().st_size > 0


def test_a_reused_arm_names_the_checkpoint_in_the_study_it_is_reused_by(tiny_model_dir, tmp_path):
    import shutil

    from studies.information_split.study import finished_arm, run_study

    config = tiny_config(tiny_model_dir, arms=("full_view_solo",), eval_tasks=2)
    run_study(config, tmp_path / "first", log=lambda line: None)
    shutil.copytree(tmp_path / "first", tmp_path / "copy")
    shutil.rmtree(tmp_path / "first")
    checkpoint = Path(finished_arm(config, tmp_path / "copy", "full_view_solo")["checkpoint"])
    assert checkpoint.is_dir() and checkpoint.is_relative_to(tmp_path / "copy")
    results = run_study(config, tmp_path / "copy", log=lambda line: None)
    assert results["arms"]["full_view_solo"]["checkpoint"] == str(checkpoint)


def test_the_untrained_play_is_shared_by_studies_that_differ_only_in_training_or_reward():
    base = StudyConfig(env="reference_game-v0")
    trained_otherwise = replace(base, steps=40, learning_rate=1e-4, num_generations=3,
                                env_kwargs={"format_reward": 0.1})
    assert base.key("untrained") == trained_otherwise.key("untrained")
    for arm in ("own_view_solo", "magrpo"):
        assert base.key(arm) != trained_otherwise.key(arm)
    assert base.key("untrained") == replace(base, seed=1).key("untrained")      # greedy play ignores the seed
    for played_otherwise in (replace(base, eval_tasks=100), replace(base, max_new_tokens=20),
                             replace(base, env_kwargs={"num_candidates": 3})):
        assert base.key("untrained") != played_otherwise.key("untrained")


def test_an_untrained_team_stored_under_its_older_seeded_key_still_matches_its_own_seed(tiny_model_dir, tmp_path):
    from studies.information_split.study import finished_arm, run_study

    config = tiny_config(tiny_model_dir, arms=("untrained",), eval_tasks=2, seed=3)
    run_study(config, tmp_path, log=lambda line: None)
    path = tmp_path / "arms" / "untrained" / "arm.json"
    record = json.loads(path.read_text())
    seeded = config.accepted_keys("untrained")[1]          # the key written before the seed was left out
    assert record["key"] == config.key("untrained") != seeded
    path.write_text(json.dumps({**record, "key": seeded}))
    assert finished_arm(config, tmp_path, "untrained") is not None
    assert finished_arm(replace(config, seed=4), tmp_path, "untrained") is None     # another seed's older key
    assert set(replace(config, seed=4).accepted_keys("untrained")) & {seeded} == set()
    assert config.accepted_keys("magrpo") == (config.key("magrpo"),)


def test_a_seed_repeat_plays_the_untrained_team_once_and_copies_its_play_to_the_other_seeds(
        tiny_model_dir, tmp_path, monkeypatch):
    from studies.information_split import study

    played = []
    run_arm = study.run_arm
    monkeypatch.setattr(study, "run_arm", lambda arm, *args, **kwargs: played.append(arm) or run_arm(
        arm, *args, **kwargs))
    lines = []
    config = tiny_config(tiny_model_dir, arms=("untrained", "own_view_solo"), eval_tasks=2)
    results = study.run_seeds(config, tmp_path, [0, 1], log=lines.append)
    assert played.count("untrained") == 1 and played.count("own_view_solo") == 2
    assert any("untrained: its play in" in line for line in lines)
    first, second = (json.loads((tmp_path / f"seed-{s}" / "results.json").read_text()) for s in (0, 1))
    assert first["arms"]["untrained"]["team"] == second["arms"]["untrained"]["team"]
    assert results["seeds"] == [0, 1]


def test_the_mappo_critic_depth_is_in_the_mappo_arms_key_only():
    base = StudyConfig(env="split_arithmetic-v0")
    shallower, whole = replace(base, mappo_critic_depth=4), replace(base, mappo_critic_depth=None)
    assert len({base.key("mappo"), shallower.key("mappo"), whole.key("mappo")}) == 3
    for arm in ("untrained", "own_view_solo", "full_view_solo", "magrpo", "counterfactual"):
        assert base.key(arm) == shallower.key(arm) == whole.key(arm)


@pytest.mark.parametrize("depth,expected", [(1, 1), (None, None), (8, None)])
def test_the_mappo_arm_runs_the_critic_at_the_studys_depth(tiny_model_dir, depth, expected, tmp_path):
    from llm_marl.team import Team
    from studies.collaboration.study import _trainer_config_kwargs
    from studies.information_split.study import base_model, team_trainer

    config = tiny_config(tiny_model_dir, arms=("mappo",), mappo_critic_depth=depth)
    model, tokenizer = base_model(config)
    team = Team.adapter_per_agent(model, tokenizer, ["agent_0", "agent_1"])
    trainer = team_trainer("mappo", config, matched_batches(config)["mappo"], team,
                           {**_trainer_config_kwargs(config, tmp_path), "progress": False})
    layers = model.config.num_hidden_layers            # 2: a depth of 8 is the whole stack
    assert trainer.config.critic_depth == expected
    assert trainer.critic.depth == (expected or layers)


def test_the_command_reads_the_mappo_critic_depth(capsys):
    from studies.information_split import run

    assert run.critic_depth("all") is None and run.critic_depth("6") == 6
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--out", "unused", "--mappo-critic-depth", "deep"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "expected a number of layers or 'all'" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        run.main(["--out", "unused", "--mappo-critic-depth", "0"])
    assert "mappo_critic_depth must be None" in capsys.readouterr().err


def test_the_env_kwargs_reach_every_env_of_the_study():
    config = StudyConfig(env_kwargs={"operators": "+-"}, eval_tasks=10)
    assert config.make_env("train", view="own", seat=1, turns=1).operators == "+-"
    assert llm_marl_envs.make("split_arithmetic-v0").operators == "+"


def test_the_command_passes_env_arguments_and_refuses_bad_ones_in_one_line(capsys):
    from studies.information_split import run

    assert run.env_argument("format_reward=0.1") == ("format_reward", 0.1)
    assert run.env_argument("operators=+-") == ("operators", "+-")
    for argv, message in ((["--env-arg", "format_reward"], "expected NAME=VALUE"),
                          (["--env-arg", "format_reward=1.5"], "format_reward must be a number in [0, 1)"),
                          (["--env-arg", "colour=red"], "unknown keyword argument(s) ['colour']")):
        with pytest.raises(SystemExit) as exit_info:
            run.main(["--env", "reference_game-v0", "--out", "unused", *argv])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and "Traceback" not in err


def test_training_curves_read_the_last_turn_of_each_arms_history():
    from studies.information_split.study import training_curves

    def magrpo_row(step, rewards, zero, role=None):
        row = {"step": step, "turn0/agent_0/reward_mean": 0.0, "turn0/agent_0/zero_advantage_groups": 1.0,
               "turn1/joint_reward_mean": 9.0}
        for i, (reward, share) in enumerate(zip(rewards, zero)):
            row[f"turn1/agent_{i}/reward_mean"], row[f"turn1/agent_{i}/zero_advantage_groups"] = reward, share
        return row if role is None else {**row, "role": role}

    solo = [{"step": 1, "role": role, "turn0/agent_0/reward_mean": 0.1 * (role + 1),
             "turn0/agent_0/zero_advantage_groups": 0.5} for role in (0, 1)]
    records = {"untrained": {"history": []},
               "own_view_solo": {"history": solo},
               "magrpo": {"history": [magrpo_row(1, [0.2, 0.4], [0.0, 0.5]), {"eval/accuracy": 0.3},
                                      magrpo_row(2, [1.0, 0.0], [1.0, 1.0])]},
               "mappo": {"history": [{"step": 1, "reward_mean": 0.25}]}}
    curves = training_curves(records)
    assert list(curves) == ["own_view_solo (role 0)", "own_view_solo (role 1)", "magrpo", "mappo"]
    assert curves["own_view_solo (role 1)"] == {"step": [1], "last_turn_reward": [pytest.approx(0.2)],
                                                "zero_advantage_share": [0.5]}
    assert curves["magrpo"]["step"] == [1, 2]                     # the row without a step is not a training step
    assert curves["magrpo"]["last_turn_reward"] == [pytest.approx(0.3), pytest.approx(0.5)]   # turn 1, not turn 0
    assert curves["magrpo"]["zero_advantage_share"] == [pytest.approx(0.25), 1.0]
    assert curves["mappo"] == {"step": [1], "last_turn_reward": [0.25], "zero_advantage_share": [None]}


# ------------------------------------------------------------------ the warm start
def saved_random_team(model_dir, out):
    """A team checkpoint of the tiny model whose two seats hold distinct random adapters; the seats' tensors."""
    from llm_marl.team_checkpoint import save_team

    evaluator = Evaluator(tiny_config(model_dir, arms=("untrained",)))
    noise = torch.Generator().manual_seed(1)
    seats = {seat: {name: torch.randn(t.shape, generator=noise) for name, t in state.items()}
             for seat, state in evaluator.untrained.items()}
    evaluator.load(seats)
    return save_team(out, 1, evaluator.team, env=evaluator.envs["team"]), seats


def distance(a, b):
    """The largest difference of two seats' adapters (tensor names hold the seat: compared in order)."""
    assert len(a) == len(b)
    return max((x - y).abs().max().item() for x, y in zip(a.values(), b.values()))


def test_every_arm_and_the_untrained_team_start_from_the_warm_start(tiny_model_dir, tmp_path):
    checkpoint, warm = saved_random_team(tiny_model_dir, tmp_path / "start")
    fresh = Evaluator(tiny_config(tiny_model_dir, arms=("untrained",))).untrained
    config = tiny_config(tiny_model_dir, arms=("magrpo", "own_view_solo"), warm_start=str(checkpoint))
    evaluator = Evaluator(config)
    for seat in evaluator.seats:                     # the untrained team is the warm start, seat by seat
        assert distance(evaluator.untrained[seat], warm[seat]) == 0
        assert distance(fresh[seat], warm[seat]) > 0.5
    batches = matched_batches(config)
    for arm in ("magrpo", "own_view_solo"):
        trained = train_arm(arm, config, batches[arm], tmp_path / arm)
        for seat in evaluator.seats:                 # one step (of at most a small change) from its own start
            other = warm["agent_1" if seat == "agent_0" else "agent_0"]
            assert distance(trained.seats[seat], warm[seat]) < 0.05 < distance(trained.seats[seat], other)
            assert distance(trained.seats[seat], fresh[seat]) > 0.5


def test_the_warm_start_is_part_of_every_arms_key(tiny_model_dir, tmp_path):
    first, _ = saved_random_team(tiny_model_dir, tmp_path / "a")
    config = tiny_config(tiny_model_dir, warm_start=str(first))
    cold = tiny_config(tiny_model_dir)
    keys = {arm: config.key(arm) for arm in ARMS}
    assert all(keys[arm] != cold.key(arm) for arm in ARMS)
    moved = tmp_path / "moved"
    first.rename(moved)                               # the same weights elsewhere: the same study
    assert {arm: replace(config, warm_start=str(moved)).key(arm) for arm in ARMS} == keys
    weights = next((moved / "agents" / "agent_1").glob("*.safetensors"))
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights))
    save_file({name: t + 1 for name, t in tensors.items()}, str(weights))   # trained again: another study
    assert replace(config, warm_start=str(moved)).key("untrained") != keys["untrained"]


def test_a_warm_start_that_cannot_start_the_seats_is_refused(tiny_model_dir, tmp_path, capsys):
    from studies.information_split import run

    with pytest.raises(ValueError, match="does not exist"):
        tiny_config(tiny_model_dir, warm_start=str(tmp_path / "nowhere"))
    checkpoint, _ = saved_random_team(tiny_model_dir, tmp_path / "start")
    with pytest.raises(ValueError, match="trained on base model"):
        StudyConfig(warm_start=str(checkpoint))                     # the embedded model, not the tiny one
    settings = checkpoint / "agents" / "agent_0" / "adapter_config.json"
    saved = json.loads(settings.read_text())
    settings.write_text(json.dumps({**saved, "r": saved["r"] * 2}))
    config = tiny_config(tiny_model_dir, warm_start=str(checkpoint))
    with pytest.raises(ValueError, match=r"agent 'agent_0' was trained with other LoRA settings.*'r'"):
        Evaluator(config)
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--env", "split_arithmetic-v0", "--out", "unused", "--warm-start", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "nowhere" in err and "Traceback" not in err
