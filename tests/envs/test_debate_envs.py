"""Scripted debate episodes: rewards equal verdicts; prompts carry the others' previous answers."""
import re

import pytest

import llm_marl_envs
from llm_marl_envs.data import hash_split
from verifiers.math import verify_answer
from verifiers.nli import verify_label


def play(env, scripts, seed=0, task_index=0):
    """Run a scripted episode; scripts[t][agent] is the answer. Returns per-step results."""
    obs, infos = env.reset(seed=seed, options={"task_index": task_index})
    steps = [(obs, None, None, infos)]
    for actions in scripts:
        obs, rewards, terms, truncs, infos = env.step(actions)
        steps.append((obs, rewards, terms, infos))
    return steps


GSM8K_SCRIPT = [
    {"agent_0": "a0t0: 16 - 3 - 4 = 9 eggs, 9 * 2 = \\boxed{18}", "agent_1": "a1t0: The answer is 17.",
     "agent_2": "a2t0: she makes $20"},
    {"agent_0": "a0t1: still \\boxed{18}", "agent_1": "a1t1: I was wrong, it is 18",
     "agent_2": "a2t1: #### 18"},
    {"agent_0": "a0t2: 18", "agent_1": "a1t2: \\boxed{18.0}", "agent_2": "a2t2: no idea"},
]


def test_gsm8k_scripted_episode_rewards_equal_verdicts_and_prompts_share_answers():
    env = llm_marl_envs.make("gsm8k_debate-v0", num_agents=3, num_turns=3)
    steps = play(env, GSM8K_SCRIPT)
    gold = env.task["answer"]
    assert gold == "18"  # GSM8K test row 0 (Janet's ducks)
    for t, actions in enumerate(GSM8K_SCRIPT):
        _, rewards, terms, infos = steps[t + 1]
        for agent, text in actions.items():
            assert rewards[agent] == verify_answer(text, gold).score
            assert infos[agent]["verdict"] == verify_answer(text, gold)
        assert all(terms.values()) == (t == 2)
    assert [r for r in steps[1][1].values()] == [1.0, 0.0, 0.0]
    assert steps[-1][3]["agent_0"]["correct"] == [[True, False, False], [True, True, True], [True, True, False]]
    # Turn-1 prompt of agent_0: the others' turn-0 answers, its own exactly once (its history).
    obs_t1 = steps[1][0]
    for agent in env.possible_agents:
        me = agent[-1]
        for other in "012":
            text = GSM8K_SCRIPT[0][f"agent_{other}"]
            assert obs_t1[agent].count(text) == 1, (agent, other)
        prompt = steps[1][3][agent]["messages"][-1]["content"]
        assert prompt.startswith("These are the answers of the other agents")
        assert GSM8K_SCRIPT[0][agent] not in prompt
        assert all(f"Agent {k}:" in prompt for k in "012" if k != me)
    # Turn-2 prompt shows turn-1 answers, not turn-0 ones.
    prompt2 = steps[2][3]["agent_1"]["messages"][-1]["content"]
    assert "a0t1" in prompt2 and "a2t1" in prompt2 and "a0t0" not in prompt2
    assert env.agents == []


def test_anli_scripted_episode():
    env = llm_marl_envs.make("anli_debate-v1", num_agents=2, num_turns=2)
    env.reset(seed=0, options={"task_index": 0})
    gold = env.task["answer"]
    assert gold in {"entailment", "neutral", "contradiction"}
    wrong = next(label for label in ("entailment", "neutral", "contradiction") if label != gold)
    script = [{"agent_0": f"\\boxed{{{gold}}}", "agent_1": f"The answer is {wrong}."},
              {"agent_0": f"Final answer: {gold}", "agent_1": f"I now think \\boxed{{{gold}}}"}]
    for actions in script:
        _, rewards, _, _, infos = env.step(actions)
        for agent, text in actions.items():
            assert rewards[agent] == verify_label(text, gold).score
    assert infos["agent_0"]["correct"] == [[True, False], [True, True]]


def test_anli_local_and_hub_shapes_give_the_same_record():
    from llm_marl_envs.envs.anli_debate import anli_record

    local = anli_record({"uid": "u1", "context": "P", "hypothesis": "H", "label": "c"}, 0)
    hub = anli_record({"uid": "u1", "premise": "P", "hypothesis": "H", "label": 2}, 0)
    assert local == hub == {"task_id": "anli_r3/u1", "premise": "P", "hypothesis": "H", "answer": "contradiction"}
    with pytest.raises(ValueError, match="unknown label"):
        anli_record({"uid": "u", "context": "P", "hypothesis": "H", "label": "x"}, 0)


def test_gsm_symbolic_generates_offline_and_gold_answer_scores_one():
    env = llm_marl_envs.make("gsm_symbolic_debate-v0", num_agents=2, num_turns=1, num_tasks=10)
    obs, _ = env.reset(seed=1)
    gold = env.task["answer"]
    assert env.task["question"] in obs["agent_0"]
    _, rewards, terms, _, _ = env.step({"agent_0": f"\\boxed{{{gold}}}", "agent_1": "\\boxed{-123456789}"})
    assert rewards == {"agent_0": 1.0, "agent_1": 0.0}
    assert all(terms.values())
    train = llm_marl_envs.make("gsm_symbolic_debate-v0", split="train", num_tasks=10)
    assert [t["question"] for t in train.tasks] != [t["question"] for t in env.tasks]


def test_show_scores_puts_verifier_scores_in_the_next_prompt():
    env = llm_marl_envs.make("gsm8k_debate-v0", num_agents=2, num_turns=2, show_scores=True)
    env.reset(options={"task_index": 0})
    _, _, _, _, infos = env.step({"agent_0": "\\boxed{18}", "agent_1": "\\boxed{3}"})
    assert "Agent 1 (verifier score 0):" in infos["agent_0"]["messages"][-1]["content"]
    assert "Agent 0 (verifier score 1):" in infos["agent_1"]["messages"][-1]["content"]


def test_stop_on_consensus_ends_early_only_when_all_agree():
    env = llm_marl_envs.make("gsm8k_debate-v0", num_agents=3, num_turns=3, stop_on_consensus=True)
    env.reset(options={"task_index": 0})
    _, _, terms, _, _ = env.step({"agent_0": "\\boxed{7}", "agent_1": "7", "agent_2": "\\boxed{8}"})
    assert not any(terms.values())
    _, _, terms, _, _ = env.step({"agent_0": "\\boxed{7}", "agent_1": "the answer is 7.0", "agent_2": "7"})
    assert all(terms.values()) and env.agents == []


def test_single_agent_debate_is_self_refinement():
    env = llm_marl_envs.make("gsm8k_debate-v0", num_agents=1, num_turns=2)
    env.reset(options={"task_index": 0})
    _, _, _, _, infos = env.step({"agent_0": "\\boxed{3}"})
    assert infos["agent_0"]["messages"][-1]["content"].startswith("Review your previous answer")


def test_same_seed_same_task_different_seed_usually_different():
    a = llm_marl_envs.make("gsm8k_debate-v0")
    b = llm_marl_envs.make("gsm8k_debate-v0")
    assert a.reset(seed=7)[0] == b.reset(seed=7)[0]
    ids = {a.reset(seed=s)[1]["agent_0"]["task_id"] for s in range(10)}
    assert len(ids) > 5


def test_render_modes():
    env = llm_marl_envs.make("gsm8k_debate-v0", num_turns=1, render_mode="ansi")
    env.reset(options={"task_index": 0})
    env.step({"agent_0": "\\boxed{18}", "agent_1": "\\boxed{1}"})
    text = env.render()
    assert "agent_0 (score 1, correct=True)" in text and "agent_1 (score 0, correct=False)" in text
    with pytest.raises(ValueError, match="render_mode"):
        llm_marl_envs.make("gsm8k_debate-v0", render_mode="rgb_array")


@pytest.mark.parametrize("kwargs, match", [
    ({"num_agents": 0}, "num_agents"), ({"num_turns": 0}, "num_turns"), ({"max_action_chars": 0}, "max_action_chars"),
])
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        llm_marl_envs.make("gsm8k_debate-v0", **kwargs)


def test_arithmetic_debate_generates_offline_and_gold_answer_scores_one():
    env = llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=1, num_tasks=10)
    obs, _ = env.reset(seed=1)
    gold = env.task["answer"]
    assert "arithmetic problem" in obs["agent_0"]
    _, rewards, _, _, _ = env.step({"agent_0": f"\\boxed{{{gold}}}", "agent_1": "\\boxed{-123456789}"})
    assert rewards == {"agent_0": 1.0, "agent_1": 0.0}
    train = llm_marl_envs.make("arithmetic_debate-v0", split="train", num_tasks=10)
    assert [t["question"] for t in train.tasks] != [t["question"] for t in env.tasks]
    with pytest.raises(ValueError, match="min_terms"):
        llm_marl_envs.make("arithmetic_debate-v0", min_terms=3, max_terms=2)
    with pytest.raises(ValueError, match=r"operators must be a non-empty string of '\+-' characters, got '\*'"):
        llm_marl_envs.make("arithmetic_debate-v0", operators="*")


def test_arithmetic_default_is_two_digit_additions_and_operators_filter_the_stream():
    expressions = [t["question"].split(": ")[1] for t in llm_marl_envs.make("arithmetic_debate-v0").tasks]
    assert len(set(expressions)) == len(expressions) == 500
    assert all(re.fullmatch(r"[1-9]\d \+ [1-9]\d =", e) for e in expressions), expressions[:5]
    mixed = llm_marl_envs.make("arithmetic_debate-v0", operators="-+", max_terms=3, num_tasks=200).tasks
    assert {op for t in mixed for op in t["question"].split() if op in "+-"} == {"+", "-"}


def test_a_problem_space_too_small_for_num_tasks_is_a_clear_error():
    env = llm_marl_envs.make("arithmetic_debate-v0", min_digits=1, max_digits=1, num_tasks=200)
    with pytest.raises(ValueError, match=r"gave only \d+ distinct test problems in \d+ draws, fewer than "
                                         r"num_tasks=200: the problem space is too small"):
        _ = env.tasks
    assert len(llm_marl_envs.make("arithmetic_debate-v0", min_digits=1, max_digits=1, num_tasks=20).tasks) == 20


@pytest.mark.parametrize("env_id", ["arithmetic_debate-v0", "gsm_symbolic_debate-v0"])
def test_generated_splits_follow_the_hash_of_the_question(env_id):
    for split in ("train", "test"):
        tasks = llm_marl_envs.make(env_id, split=split, num_tasks=50).tasks
        assert {hash_split(t["question"]) for t in tasks} == {split}


def test_clones_of_an_unloaded_env_share_one_task_list(monkeypatch):
    """The rollout engine clones one template per episode: the problems are generated once, not per clone."""
    env = llm_marl_envs.make("arithmetic_debate-v0", num_tasks=20)
    calls = []
    original = type(env).load_tasks

    def counting(self):
        calls.append(self)
        return original(self)

    monkeypatch.setattr(type(env), "load_tasks", counting)
    twins = [env.clone() for _ in range(5)]
    for seed, twin in enumerate(twins):
        twin.reset(seed=seed, options={"task_index": seed})
    assert len(calls) == 1
    assert all(twin.tasks is env.tasks for twin in twins)
    assert [twin.task["task_id"] for twin in twins] == [env.tasks[i]["task_id"] for i in range(5)]
    twins[0].step({agent: "\\boxed{1}" for agent in twins[0].agents})
    assert twins[1].turn == 0 and env.task is None      # clones still evolve independently
