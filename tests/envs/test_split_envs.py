"""Information-split envs: a brute-force solver proves each split, no prompt leaks a view its agent lacks,
masked messages never arrive, bad input is a ValueError, and the bench runs the own/full-view baselines."""
from __future__ import annotations

import json
from collections import Counter

import pytest

import llm_marl_envs
from llm_marl_envs.envs.split_arithmetic import SplitArithmeticEnv
from llm_marl_envs.testing import (
    check_masked_messages,
    check_views_do_not_leak,
    held_out_test,
    information_split_test,
    text_env_api_test,
    undetermined_shares,
)
from verifiers.choice import verify_choice

SPLIT_ENVS = ["split_arithmetic-v0", "reference_game-v0", "hidden_profile-v0"]


def factory(env_id):
    return lambda **kwargs: llm_marl_envs.make(env_id, **kwargs)


# ------------------------------------------------------------------ the split, proved
@pytest.mark.parametrize("env_id", SPLIT_ENVS)
def test_no_view_alone_determines_the_answer_and_all_views_together_do(env_id):
    env = llm_marl_envs.make(env_id)                  # the test split, 500 tasks
    shares = information_split_test(factory(env_id))
    assert len(env.tasks) == 500
    assert shares == dict.fromkeys(env.role_names, 1.0), shares


@pytest.mark.parametrize("env_id", SPLIT_ENVS)
def test_splits_are_disjoint_by_content(env_id):
    held_out_test(llm_marl_envs.make(env_id, split="train"), llm_marl_envs.make(env_id, split="test"))


@pytest.mark.parametrize("env_id, kwargs", [
    ("split_arithmetic-v0", {"view": "own", "num_agents": 1, "seat": 1}),
    ("reference_game-v0", {"view": "full", "num_agents": 1, "num_turns": 1}),
    ("hidden_profile-v0", {"view": "own", "num_agents": 2, "num_turns": 3}),
    ("hidden_profile-v0", {"mask_messages": True, "num_turns": 3}),
])
def test_other_layouts_are_compliant(env_id, kwargs):
    text_env_api_test(lambda: llm_marl_envs.make(env_id, num_tasks=20, **kwargs), num_cycles=5)


def test_the_leak_check_catches_a_view_that_leaks():
    class Leaky(SplitArithmeticEnv):
        def view_text(self, task, role):
            hint = f" (the other number is {task['b']})" if role == 0 else ""
            return super().view_text(task, role) + hint

    with pytest.raises(AssertionError, match=r"agent_0 .* holds the private facts \['\d+'\]"):
        check_views_do_not_leak(lambda **kwargs: Leaky(num_tasks=5, **kwargs), range(3))


def test_the_masking_check_catches_a_mask_that_lets_text_through():
    class Unmasked(SplitArithmeticEnv):
        def next_prompt(self, agent_index):
            self.mask_messages, masked = False, self.mask_messages
            try:
                return super().next_prompt(agent_index)
            finally:
                self.mask_messages = masked

    with pytest.raises(AssertionError, match=r"mask_messages=True: the prompt of agent_0 .*'MARKER-agent_1-T0'"):
        check_masked_messages(lambda **kwargs: Unmasked(num_tasks=5, **kwargs), range(2))


def test_masked_partner_message_is_an_empty_message():
    env = llm_marl_envs.make("split_arithmetic-v0", mask_messages=True)
    env.reset(options={"task_index": 0})
    _, _, _, _, infos = env.step({"agent_0": "my number is 12", "agent_1": "mine is 34, add them"})
    prompt = infos["agent_0"]["messages"][-1]["content"]
    assert prompt.startswith("Message from Agent 1:\n\nGive your final answer now.")
    assert "34" not in prompt and "12" not in infos["agent_1"]["messages"][-1]["content"]


# ------------------------------------------------------------------ the protocol
def test_split_arithmetic_scripted_episode_pays_only_the_last_turn():
    env = llm_marl_envs.make("split_arithmetic-v0", operators="+-*")
    obs, infos = env.reset(seed=5, options={"task_index": 7})
    task = env.task
    assert f"The first number is {task['a']}." in obs["agent_0"] and "second number is" not in obs["agent_0"]
    assert f"The second number is {task['b']}." in obs["agent_1"] and "first number is" not in obs["agent_1"]
    assert infos["agent_0"]["roles"] == ["holder of the first number"]
    gold = task["answer"]
    _, rewards, terms, _, infos = env.step({"agent_0": f"\\boxed{{{gold}}}", "agent_1": f"I hold {task['b']}"})
    assert rewards == {"agent_0": 0.0, "agent_1": 0.0} and not any(terms.values())
    assert infos["agent_0"]["correct"][0][0] is True          # judged, not paid
    assert infos["agent_0"]["messages"][-1]["content"].startswith(f"Message from Agent 1:\nI hold {task['b']}")
    _, rewards, terms, _, infos = env.step({"agent_0": f"The result is {gold}.", "agent_1": "\\boxed{-1000000}"})
    assert rewards == {"agent_0": 1.0, "agent_1": 0.0} and all(terms.values()) and env.agents == []
    assert infos["agent_1"]["answers"][-1] == [gold, "-1000000"]


def test_task_index_pins_the_task_whatever_the_seed():
    for env_id in SPLIT_ENVS:
        env = llm_marl_envs.make(env_id)
        first = env.reset(seed=1, options={"task_index": 42})[0]
        assert env.reset(seed=99, options={"task_index": 42})[0] == first
        assert env.task is env.tasks[42]


def test_own_view_seat_and_full_view_prompts():
    own = llm_marl_envs.make("reference_game-v0", view="own", num_agents=1, seat=1, num_turns=1)
    obs, infos = own.reset(options={"task_index": 0})
    assert "as the listener" in obs["agent_0"] and "The target is" not in obs["agent_0"]
    assert "on your own" in obs["agent_0"] and "partner" not in obs["agent_0"]
    assert infos["agent_0"]["roles"] == ["listener"]
    full = llm_marl_envs.make("reference_game-v0", view="full", num_agents=1, num_turns=1)
    obs, infos = full.reset(options={"task_index": 0})
    assert "The target is the " in obs["agent_0"] and "A. " in obs["agent_0"]
    assert infos["agent_0"]["roles"] == ["speaker", "listener"]
    _, rewards, _, _, _ = full.step({"agent_0": f"\\boxed{{{full.task['answer']}}}"})
    assert rewards == {"agent_0": 1.0}


def test_reference_game_letters_after_the_objects():
    """``letter_position="after"``: the same tasks, each letter written after its object, and the last turn asks
    for the target's line before the letter; an answer that repeats the line is read as its letter."""
    before = llm_marl_envs.make("reference_game-v0", view="own", num_agents=1, seat=1, num_turns=1, num_tasks=20)
    after = llm_marl_envs.make("reference_game-v0", view="own", num_agents=1, seat=1, num_turns=1, num_tasks=20,
                               letter_position="after")
    assert after.tasks == before.tasks
    obs = after.reset(options={"task_index": 0})[0]["agent_0"]
    task = after.task
    for letter, obj in zip("ABCD", task["objects"]):
        assert f"\n{obj} ({letter})" in obs and f"{letter}. {obj}" not in obs
    assert "Repeat the target's line from the listener's list, then give its letter (A-D)" in obs
    assert "Repeat" not in before.reset(options={"task_index": 0})[0]["agent_0"]
    full = llm_marl_envs.make("reference_game-v0", view="full", num_agents=1, num_turns=1, letter_position="after")
    full.reset(options={"task_index": 0})
    target, letter = full.task["target"], full.task["answer"]
    _, rewards, _, _, _ = full.step({"agent_0": f"The target is the {target} ({letter})."})
    assert rewards == {"agent_0": 1.0}


def test_reference_game_leaves_a_lone_listener_at_chance():
    """The target is uniform over the listener's letters and no likelier to be the scene's most typical object."""
    env = llm_marl_envs.make("reference_game-v0")
    letters = Counter(task["answer"] for task in env.tasks)
    assert set(letters) == set("ABCD") and all(0.18 < n / len(env.tasks) < 0.32 for n in letters.values()), letters

    def most_typical(objects):            # shares the most attribute values with the others
        words = [set(o.split()) for o in objects]
        return max(range(len(objects)), key=lambda i: sum(len(words[i] & w) for w in words))

    typical = sum(task["objects"][most_typical(task["objects"])] == task["target"] for task in env.tasks)
    assert typical / len(env.tasks) < 0.25 + 0.08


def test_hidden_profile_favours_a_wrong_candidate_and_a_lone_recruiter_cannot_beat_a_coin():
    env = llm_marl_envs.make("hidden_profile-v0")
    never_favourite = 0
    for task in env.tasks:
        for role in (0, 1):
            told = Counter(c for c, _, met in task["facts"][role] if met)
            ruled_out = {c for c, _, met in task["facts"][role] if not met}
            favourite = "ABCDE".index(task["favourites"][role])
            right, look_alike = "ABCDE".index(task["answer"]), "ABCDE".index(task["look_alikes"][role])
            assert told[favourite] > max(n for c, n in told.items() if c != favourite)     # favours a wrong one
            assert told[right] == told[look_alike]                                          # indistinguishable
            open_ = sorted(set(range(5)) - ruled_out - {favourite})
            assert len(open_) == 2 and right in open_
            never_favourite += open_[0] == right       # the rule "never my favourite, then the first letter"
    assert 0.4 < never_favourite / (2 * len(env.tasks)) < 0.6


@pytest.mark.parametrize("env_id", SPLIT_ENVS)
def test_format_reward_pays_a_readable_wrong_answer_and_never_counts_it_right(env_id):
    env = llm_marl_envs.make(env_id, format_reward=0.1)
    env.reset(seed=0, options={"task_index": 3})
    gold = str(env.task["answer"])
    wrong = next(a for a in ("A", "B", "C", "D", "-7", "0") if a != gold)
    _, rewards, _, _, _ = env.step(dict.fromkeys(env.agents, f"\\boxed{{{gold}}}"))   # turn 0: judged, not paid
    assert rewards == dict.fromkeys(env.possible_agents, 0.0)
    _, rewards, _, _, infos = env.step({"agent_0": f"\\boxed{{{gold}}}", "agent_1": f"\\boxed{{{wrong}}}"})
    assert rewards == {"agent_0": 1.0, "agent_1": 0.1}
    assert infos["agent_1"]["correct"][-1] == [True, False] and infos["agent_1"]["answers"][-1][1] == wrong
    env.reset(seed=0, options={"task_index": 3})
    env.step(dict.fromkeys(env.agents, "hello"))
    _, rewards, _, _, _ = env.step(dict.fromkeys(env.agents, "I cannot tell."))   # nothing the verifier can read
    assert rewards == dict.fromkeys(env.possible_agents, 0.0)
    plain = llm_marl_envs.make(env_id)                                   # the default pays only right answers
    plain.reset(seed=0, options={"task_index": 3})
    plain.step(dict.fromkeys(plain.agents, "hello"))
    _, rewards, _, _, _ = plain.step({"agent_0": f"\\boxed{{{gold}}}", "agent_1": f"\\boxed{{{wrong}}}"})
    assert rewards == {"agent_0": 1.0, "agent_1": 0.0}


@pytest.mark.parametrize("env_id, kwargs, match", [
    ("split_arithmetic-v0", {"view": "both"}, r"view must be one of \['split', 'full', 'own'\], got 'both'"),
    ("split_arithmetic-v0", {"num_agents": 3}, r"view='split' seats one agent per role .* num_agents=2, got 3"),
    ("split_arithmetic-v0", {"view": "own", "num_agents": 1}, r"needs seat=k"),
    ("split_arithmetic-v0", {"view": "own", "num_agents": 1, "seat": 2}, r"seat must be an int in \[0, 2\)"),
    ("split_arithmetic-v0", {"seat": 0}, r"seat picks the role .* view='split'"),
    ("split_arithmetic-v0", {"view": "own", "mask_messages": True}, r"mask_messages hides .* no agent a partner"),
    ("split_arithmetic-v0", {"view": "full", "num_agents": 1, "mask_messages": True}, r"no agent a partner"),
    ("split_arithmetic-v0", {"mask_messages": "yes"}, r"mask_messages must be True or False"),
    ("split_arithmetic-v0", {"num_tasks": 0}, r"num_tasks must be an int >= 1"),
    ("split_arithmetic-v0", {"split": "dev"}, r"split must be one of \['train', 'test'\]"),
    ("split_arithmetic-v0", {"min_digits": 3, "max_digits": 2}, r"min_digits <= max_digits"),
    ("split_arithmetic-v0", {"operators": "+/"}, r"operators must be .*'\+/'"),
    ("split_arithmetic-v0", {"format_reward": 1.0}, r"format_reward must be a number in \[0, 1\) .* got 1.0"),
    ("split_arithmetic-v0", {"format_reward": -0.1}, r"format_reward must be a number in \[0, 1\)"),
    ("split_arithmetic-v0", {"format_reward": "0.1"}, r"format_reward must be a number .* got '0.1'"),
    ("reference_game-v0", {"num_candidates": 9}, r"num_candidates must be an int in \[2, 8\]"),
    ("reference_game-v0", {"num_attributes": 5}, r"num_attributes must be one of \[2, 3, 4\]"),
    ("reference_game-v0", {"letter_position": "left"}, r"letter_position must be one of .* got 'left'"),
    ("hidden_profile-v0", {"num_requirements": 2}, r"num_requirements must be an int in \[3, 6\]"),
])
def test_bad_arguments_are_value_errors_naming_the_problem(env_id, kwargs, match):
    with pytest.raises(ValueError, match=match):
        llm_marl_envs.make(env_id, **kwargs)


def test_a_task_space_too_small_for_num_tasks_is_a_value_error():
    env = llm_marl_envs.make("split_arithmetic-v0", min_digits=1, max_digits=1)
    with pytest.raises(ValueError, match=r"only \d+ distinct 'test' tasks .* fewer than num_tasks=500"):
        env.reset(seed=0)


def test_every_option_value_still_splits_the_information():
    for env_id, kwargs in [("split_arithmetic-v0", {"operators": "+-*", "min_digits": 1, "max_digits": 3}),
                           ("reference_game-v0", {"num_candidates": 2, "num_attributes": 2}),
                           ("reference_game-v0", {"num_candidates": 8, "num_attributes": 4}),
                           ("reference_game-v0", {"num_candidates": 3, "letter_position": "after"}),
                           ("hidden_profile-v0", {"num_requirements": 3}),
                           ("hidden_profile-v0", {"num_requirements": 6})]:
        env = llm_marl_envs.make(env_id, num_tasks=50, **kwargs)
        assert set(undetermined_shares(env).values()) == {1.0}, (env_id, kwargs)


# ------------------------------------------------------------------ the choice verifier
@pytest.mark.parametrize("response, answer", [
    ("B", "B"), ("**(b).**", "B"), ("\\boxed{C}", "C"), ("It is the second one. \\boxed{b}", "B"),
    ("The answer is (D).", "D"), ("Answer: option c", "C"), ("I pick candidate A, final.", "A"),
    ("A red small circle is (B)\nso my final answer is \\boxed{D}", "D"), ("\\boxed{E}", None),
])
def test_verify_choice_letters(response, answer):
    verdict = verify_choice(response, "D", 4)
    assert verdict.details["answer"] == answer
    assert verdict.score == (1.0 if answer == "D" else 0.0)


def test_verify_choice_names_hedges_and_bad_gold():
    names = ["Ana", "Ben", "Chloe"]
    assert verify_choice("Ben.", "B", 3, names=names).correct
    assert verify_choice("We should hire Ben", "B", 3, names=names).correct
    assert not verify_choice("We should hire Ben", "B", 3).correct           # without names a name is no answer
    hedge = verify_choice("\\boxed{A or B}", "B", 3)
    assert hedge.score == 0.0 and hedge.details["reason"] == "ambiguous"
    assert verify_choice("", "A", 3).details["reason"] == "empty response"
    for gold, n, match in [("E", 4, "gold must be one of"), ("A", 9, "num_choices must be"), ("A", 1, "num_choices")]:
        with pytest.raises(ValueError, match=match):
            verify_choice("A", gold, n)
    with pytest.raises(ValueError, match="one name per option"):
        verify_choice("A", "A", 3, names=["Ana"])


# ------------------------------------------------------------------ the bench baselines
def test_bench_runs_own_view_full_view_and_team_on_the_same_tasks(tiny_model_dir, tmp_path, capsys, one_torch_thread):
    from llm_marl.cli import main

    out = tmp_path / "bench"
    argv = ["bench", "split_arithmetic-v0", "--model", str(tiny_model_dir), "--backend", "hf", "--episodes", "3",
            "--baseline", "own_view,full_view,team", "--max-new-tokens", "4", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    result = json.loads((out / "comparison.json").read_text())
    assert list(result["baselines"]) == ["own_view", "full_view", "team"]
    assert [row["env_shape"] for row in result["baselines"].values()] == [[2, 1], [1, 1], [2, 2]]
    assert {(p["a"], p["b"]) for p in result["paired_team_answer_difference"]} == {
        ("full_view", "own_view"), ("team", "own_view"), ("team", "full_view")}
    records = {b: [json.loads(line) for line in (out / b / "episodes.jsonl").read_text().splitlines()]
               for b in result["baselines"]}
    assert [r["task_index"] for r in records["own_view"]] == [r["task_index"] for r in records["team"]] \
        == [r["task_index"] for r in records["full_view"]]
    for own, full in zip(records["own_view"], records["full_view"]):   # agent 0's prompt: its own view, or all
        assert "The first number is" in own["question"] and "The second number is" not in own["question"]
        assert "The first number is" in full["question"] and "The second number is" in full["question"]
    assert "own_view: each of the 2 roles alone" in (out / "comparison.md").read_text()
    assert main(["bench", "arithmetic_debate-v0", "--baseline", "own_view", "--out", str(tmp_path / "x")]) == 2
    assert "needs an env whose agents hold private views" in capsys.readouterr().err


@pytest.mark.parametrize("env_id, kwargs, choices", [("reference_game-v0", {}, 4),
                                                     ("reference_game-v0", {"num_candidates": 3}, 3),
                                                     ("hidden_profile-v0", {}, 5)])
def test_chance_accuracy_is_one_right_letter_among_the_tasks_choices(env_id, kwargs, choices):
    env = llm_marl_envs.make(env_id, num_tasks=50, **kwargs)
    assert env.chance_accuracy == pytest.approx(1 / choices)
    for task in env.tasks:              # a uniform guess among the choices is right with probability 1 / choices
        assert sum(bool(env.verify(f"\\boxed{{{letter}}}", task).correct) for letter in "ABCDEFGH"[:choices]) == 1


def test_an_exact_answer_has_no_chance_accuracy():
    assert llm_marl_envs.make("split_arithmetic-v0").chance_accuracy is None
