"""Coding collaboration envs: scripted episodes check every reward component against hand-computed values."""
from __future__ import annotations

import time

import pytest

import llm_marl_envs
from verifiers.coding import CodingRewardConfig, extract_code, helper_names, score_collaboration

# HumanEval/0: has_close_elements(numbers, threshold) -> any two numbers closer than threshold (7 asserts)
AUX_DISTANCE = "```python\ndef aux(a, b):\n    return abs(a - b)\n```"
ENTRY_USES_AUX = """Here is my function:
```python
def has_close_elements(numbers, threshold):
    for i, a in enumerate(numbers):
        for b in numbers[i + 1:]:
            if aux(a, b) < threshold:
                return True
    return False
```"""
AUX_FULL_SOLUTION = """```python
def aux(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
```"""
ENTRY_THIN_WRAPPER = "```python\ndef has_close_elements(numbers, threshold):\n    return aux(numbers, threshold)\n```"
ENTRY_IGNORES_RESULT = """```python
def has_close_elements(numbers, threshold):
    aux(numbers[0], numbers[0])
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
```"""
ENTRY_ALONE = """```python
def has_close_elements(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
```"""
ENTRY_HALF_RIGHT = """```python
def has_close_elements(numbers, threshold):
    return aux(numbers[0], numbers[1]) < threshold
```"""


@pytest.fixture(scope="module")
def env():
    return llm_marl_envs.make("humaneval_coding-v0")


def _episode_step(env, actions: list[str]):
    env.reset(options={"task_index": 0})
    assert env.task["task_id"] == "HumanEval/0"
    _, rewards, _, _, infos = env.step({f"agent_{i}": text for i, text in enumerate(actions)})
    assert len(set(rewards.values())) == 1, "the reward is joint"
    verdict = infos["agent_0"]["verdict"]
    assert infos["agent_1"]["reward_components"] == verdict.details["components"]
    return rewards["agent_0"], verdict.details


@pytest.mark.parametrize("aux, entry, expected", [
    # structure 0.4+0.6, syntax 0.5, tests 7/7, uses aux +0.5, not a wrapper +1.0
    (AUX_DISTANCE, ENTRY_USES_AUX, {"structure": 1.0, "syntax": 0.5, "tests": 1.0, "cooperation": 1.5}),
    # thin wrapper: no +1.0
    (AUX_FULL_SOLUTION, ENTRY_THIN_WRAPPER, {"structure": 1.0, "syntax": 0.5, "tests": 1.0, "cooperation": 0.5}),
    # calls aux but drops its value: +0.5 +1.0 -0.5
    (AUX_DISTANCE, ENTRY_IGNORES_RESULT, {"structure": 1.0, "syntax": 0.5, "tests": 1.0, "cooperation": 1.0}),
    # never calls aux: no cooperation
    (AUX_DISTANCE, ENTRY_ALONE, {"structure": 1.0, "syntax": 0.5, "tests": 1.0, "cooperation": 0.0}),
])
def test_reward_components_match_hand_computed_values(env, aux, entry, expected):
    reward, details = _episode_step(env, [aux, entry])
    assert details["components"] == pytest.approx(expected)
    assert reward == pytest.approx(sum(expected.values()))
    assert details["passed"] == details["total"] == 7


def test_partial_tests_scale_the_tests_component(env):
    reward, details = _episode_step(env, [AUX_DISTANCE, ENTRY_HALF_RIGHT])
    passed, total = details["passed"], details["total"]
    assert total == 7 and 0 < passed < 7  # only looks at the first two numbers
    assert details["components"]["tests"] == pytest.approx(passed / 7)
    assert details["thin_wrapper"] is True  # one line: return aux(...) < threshold
    assert reward == pytest.approx(1.0 + 0.5 + passed / 7 + 0.5)


def test_missing_entry_point_stops_at_structure_without_running(env):
    start = time.monotonic()
    reward, details = _episode_step(env, [AUX_DISTANCE, "```python\ndef helper(x):\n    return x\n```"])
    assert reward == pytest.approx(0.4)
    assert details["stopped_at"] == "structure" and details["total"] is None
    assert time.monotonic() - start < 1.0


def test_syntax_error_stops_at_syntax_and_names_agent_and_line(env):
    broken = "```python\ndef has_close_elements(numbers, threshold):\n    return (numbers\n```"
    reward, details = _episode_step(env, [AUX_DISTANCE, broken])
    assert reward == pytest.approx(0.4 + 0.6)  # the def with a return is found line by line
    assert details["stopped_at"] == "syntax"
    assert details["syntax_error"].startswith("agent_1's code: SyntaxError at line 2")


def test_feedback_between_turns_lists_every_check(env):
    env.reset(options={"task_index": 0})
    obs, _, terms, _, _ = env.step({"agent_0": AUX_DISTANCE, "agent_1": ENTRY_HALF_RIGHT})
    assert not any(terms.values())
    feedback = obs["agent_0"]
    assert "helper `aux`: defined and returns a value" in feedback
    assert "entry point `has_close_elements`: defined" in feedback
    assert "asserts passed" in feedback and "first failing assert: `assert candidate(" in feedback
    assert "AssertionError" in feedback and "only wraps a helper" in feedback
    assert "agent_1 wrote `has_close_elements`" in feedback  # the teammate's code
    _, _, terms, _, _ = env.step({"agent_0": AUX_DISTANCE, "agent_1": ENTRY_USES_AUX})
    assert all(terms.values()) and env.verdicts[-1]["agent_0"].score == pytest.approx(4.0)


def test_feedback_warns_when_entry_ignores_aux(env):
    env.reset(options={"task_index": 0})
    obs, *_ = env.step({"agent_0": AUX_DISTANCE, "agent_1": ENTRY_ALONE})
    assert "does not call any helper" in obs["agent_1"]


def test_roles_cannot_be_taken_over():
    task = llm_marl_envs.make("humaneval_coding-v0").tasks[0]
    # agent 0 also writes the entry point, agent 1 redefines aux: both foreign definitions are dropped
    aux = AUX_DISTANCE.replace("```\n", "") + "\ndef has_close_elements(numbers, threshold):\n    return True\n```"
    entry = ENTRY_USES_AUX + "\n```python\ndef aux(a, b):\n    return 0\n```"
    verdict = score_collaboration([extract_code(aux), extract_code(entry)], task)
    assert verdict.details["program"].count("def aux") == 1 and "return abs(a - b)" in verdict.details["program"]
    assert verdict.details["program"].count("def has_close_elements") == 1
    assert verdict.score == pytest.approx(4.0)


def test_three_agents_split_helper_credit():
    env = llm_marl_envs.make("humaneval_coding-v0", num_agents=3)
    assert helper_names(3) == ["aux", "aux_1"]
    env.reset(options={"task_index": 0})
    aux_1 = "```python\ndef aux_1(values):\n    return sorted(values)\n```"
    _, rewards, _, _, infos = env.step({"agent_0": AUX_DISTANCE, "agent_1": aux_1, "agent_2": ENTRY_USES_AUX})
    components = infos["agent_2"]["reward_components"]
    # both helpers defined: 0.4; entry 0.6; calls 1 of 2 helpers: 0.5 * 1/2; not a wrapper: 1.0
    assert components == pytest.approx({"structure": 1.0, "syntax": 0.5, "tests": 1.0, "cooperation": 1.25})
    assert rewards == {a: pytest.approx(3.75) for a in ("agent_0", "agent_1", "agent_2")}
    assert "`aux_1`" in env.messages["agent_1"][1]["content"]


def test_reward_weights_are_parameters():
    config = CodingRewardConfig(tests=2.0, not_wrapper=0.0)
    env = llm_marl_envs.make("humaneval_coding-v0", reward_config=config)
    reward, details = _episode_step(env, [AUX_DISTANCE, ENTRY_USES_AUX])
    assert reward == pytest.approx(1.0 + 0.5 + 2.0 + 0.5) and details["max_score"] == pytest.approx(
        0.4 + 0.6 + 0.5 + 2.0 + 0.5
    )
    with pytest.raises(ValueError, match="syntax"):
        CodingRewardConfig(syntax=-1)
    with pytest.raises(ValueError, match="num_agents"):
        llm_marl_envs.make("humaneval_coding-v0", num_agents=1)


def test_extract_code_from_fences_and_prose():
    assert extract_code("Sure:\n```python\ndef f():\n    return 1\n```\nDone.") == "def f():\n    return 1"
    assert extract_code("```py\na = 1\n```\ntext\n```\nb = 2\n```") == "a = 1\n\nb = 2"
    assert extract_code("Here it is:\ndef f():\n    return 2") == "def f():\n    return 2"
    assert extract_code("```python\ndef f():\n    return 3") == "def f():\n    return 3"  # unterminated fence


def test_random_strings_are_scored_without_the_sandbox():
    env = llm_marl_envs.make("mbpp_coding-v0")
    env.reset(seed=0)
    start = time.monotonic()
    for _ in range(20):
        if not env.agents:
            env.reset()
        _, rewards, *_ = env.step({a: env.action_space(a).sample() for a in env.agents})
        assert all(r <= 1.0 for r in rewards.values())
    assert time.monotonic() - start < 2.0


def test_datasets_and_splits(data_dir):
    def ids(env_id: str, split: str) -> list[str]:
        return [t["task_id"] for t in llm_marl_envs.make(env_id, split=split).tasks]

    # CoMLRL's splits: HumanEval train test[33:163], eval test[:32]; CoopHumanEval eval [:16], train [16:]
    assert ids("humaneval_coding-v0", "test") == [f"HumanEval/{n}" for n in range(32)]
    assert ids("humaneval_coding-v0", "train") == [f"HumanEval/{n}" for n in range(33, 163)]
    assert len(ids("humaneval_coding-v0", "all")) == 164
    assert ids("coophumaneval_coding-v0", "test") == [f"CoopHumanEval/{n}" for n in range(16)]
    assert ids("coophumaneval_coding-v0", "train") == [f"CoopHumanEval/{n}" for n in range(16, 82)]
    assert len(ids("coophumaneval_coding-v0", "all")) == 82
    sizes = {
        split: len(llm_marl_envs.make("mbpp_coding-v0", split=split).tasks) for split in ("train", "validation", "test")
    }
    assert sizes == {"train": 374, "validation": 90, "test": 500}
    for env_id in ("humaneval_coding-v0", "coophumaneval_coding-v0"):
        with pytest.raises(ValueError, match=r"has the splits \['test', 'train', 'all'\], got split='validation'"):
            _ = llm_marl_envs.make(env_id, split="validation").tasks


@pytest.mark.parametrize("env_id", ["mbpp_coding-v0", "humaneval_coding-v0"])
def test_reference_solutions_pass_as_the_entry_point(env_id):
    env = llm_marl_envs.make(env_id)
    for index in (0, 5, 17):
        env.reset(options={"task_index": index})
        task = env.task
        solution = task["canonical_solution"]
        entry = solution if env_id == "mbpp_coding-v0" else task["problem"] + solution
        _, rewards, *_ = env.step({"agent_0": AUX_DISTANCE, "agent_1": f"```python\n{entry}\n```"})
        details = env.verdicts[-1]["agent_0"].details
        assert details["passed"] == details["total"] > 0, (task["task_id"], details.get("test_reason"))


def test_decorators_and_extra_helpers_are_kept():
    task = llm_marl_envs.make("humaneval_coding-v0").tasks[0]
    aux = (
        "```python\nimport functools\n\ndef _gap(a, b):\n    return abs(a - b)\n\n@functools.lru_cache(maxsize=None)\n"
        "def aux(a, b):\n    return _gap(a, b)\n\nprint('example run')\n```"
    )
    verdict = score_collaboration([extract_code(aux), extract_code(ENTRY_USES_AUX)], task)
    program = verdict.details["program"]
    assert "@functools.lru_cache(maxsize=None)\ndef aux" in program and "def _gap" in program
    assert "print('example run')" not in program  # module-level calls are dropped
    assert program.startswith("from typing import List")  # the prompt's imports come first
    assert verdict.score == pytest.approx(4.0)


def test_mbpp_rows_of_both_shapes_normalise_alike(data_dir):
    from llm_marl_envs.data import read_jsonl
    from llm_marl_envs.envs.mbpp_coding import mbpp_record

    full = next(r for r in read_jsonl(data_dir / "mbpp" / "mbpp.jsonl") if r["task_id"] == 11)
    sanitized = {"source_file": "x", "task_id": 11, "prompt": full["text"], "code": full["code"],
                 "test_imports": ["import math"], "test_list": full["test_list"]}  # the hub's sanitized fields
    a, b = mbpp_record(full, 0), mbpp_record(sanitized, 0)
    assert a["entry_point"] == b["entry_point"] == "remove_Occ" and a["task_id"] == b["task_id"] == "mbpp/11"
    assert b["test"].startswith("import math\n") and a["test"] == "\n".join(full["test_list"])
    assert a["signature"] == "def remove_Occ(s,ch):" and "\r" not in a["canonical_solution"]
