"""LlamaCppPolicy's KV reuse across turns on the embedded SmolLM2 GGUF: the same tokens with and without
reuse, seeded samples reproduced, no reuse past a divergence, a bounded store, and prompts that keep the
agent's own answers as sampled."""
import pytest

import llm_marl_envs
from llm_marl.backends.llamacpp import LlamaCppPolicy
from llm_marl.backends.prefix_cache import CacheStats, common_prefix_length
from llm_marl.models import gguf_path
from llm_marl.policy import SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.team import Team

GREEDY = SamplingParams(max_new_tokens=24, temperature=0)
QUESTION = [{"role": "system", "content": "You are Agent 1. Be concise."},
            {"role": "user", "content": "A shop sells 3 pens for 2 dollars. How much do 12 pens cost?"}]


def load(**kwargs) -> LlamaCppPolicy:
    kwargs.setdefault("reuse_cache", True)
    return LlamaCppPolicy(gguf_path("smollm2-135m"), n_ctx=1024, max_batch=8, n_threads=1, **kwargs)


def debate(policy: LlamaCppPolicy, params: SamplingParams, reuse: bool, num_turns: int = 3):
    """Two debates of 2 agents on one policy; their per-turn (prompt ids, completion ids) and the counters."""
    policy.reuse_cache, policy.cache_stats = reuse, CacheStats()
    env = llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=num_turns, split="test")
    team = Team.from_policies({"agent_0": policy, "agent_1": policy})
    episodes = RolloutEngine(env, team, params, progress=False).collect(task_indices=[0, 1])
    return [(t.prompt_ids, t.completion_ids) for e in episodes for turn in e.turns for t in turn.values()], \
        policy.cache_stats


# Like batching, reuse can flip a greedy near-tie (llamacpp module docstring); these debates have none.
@pytest.mark.slow
@pytest.mark.ci_slow
@pytest.mark.native
def test_llamacpp_greedy_debates_are_the_same_with_and_without_kv_reuse():
    policy = load()
    plain, _ = debate(policy, GREEDY, reuse=False)
    reused, stats = debate(policy, GREEDY, reuse=True)
    assert reused == plain
    later_rows = 2 * 2 * 2                                   # turns 1 and 2 of 2 debates, 2 agents
    # turn 0: each agent's 2 prompts share its system message and instructions, prefilled once per agent
    assert (stats.misses, stats.shared, stats.shared_prefixes) == (0, 2 * 2, 2)
    assert stats.hits == later_rows and stats.partial == 0
    assert stats.splices == later_rows and stats.splice_fallbacks == 0
    assert stats.prefill_tokens_saved > stats.prefill_tokens
    for i in (i for i in range(len(reused)) if i % 6 < 4):         # turn t+1 extends turn t's tokens (per agent)
        (prompt, completion), (later, _) = reused[i], reused[i + 2]
        assert later[:len(prompt) + len(completion)] == prompt + completion
    assert len(policy.kv_cache) == 0 and len(policy.splicer) == 0   # collect cleared what the episodes left


@pytest.mark.slow
@pytest.mark.native
def test_llamacpp_seeded_sampled_debate_reproduces_with_kv_reuse():
    policy = load()
    params = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.9, seed=7)
    first, stats = debate(policy, params, reuse=True, num_turns=2)
    second, _ = debate(policy, params, reuse=True, num_turns=2)
    assert stats.hits == 4 and first == second


@pytest.mark.slow
@pytest.mark.native
def test_llamacpp_prompt_diverging_inside_a_stored_sequence_reuses_only_the_shared_prefix():
    policy = load()
    stored = policy.generate([QUESTION], GREEDY)[0][0]
    diverging = [QUESTION[0], {"role": "user", "content": "A shop sells 5 pens for 2 dollars. How many pens for 6?"}]
    ids = policy.prompt_ids(diverging)
    shared = common_prefix_length(ids, stored.prompt_ids)
    assert 0 < shared < len(stored.prompt_ids) - 5               # diverges inside the stored prompt

    # the restored sequence ends at the divergence: no stored cell past it stays visible
    memory, lib = policy._memory, policy._llama_cpp
    policy._extended = set()
    assert policy._restore(ids, 3) == shared
    assert (lib.llama_memory_seq_pos_min(memory, 3), lib.llama_memory_seq_pos_max(memory, 3)) == (0, shared - 1)
    lib.llama_memory_clear(memory, False)

    policy.cache_stats = CacheStats()
    reused = policy.generate([diverging], GREEDY)[0][0]
    assert (policy.cache_stats.partial, policy.cache_stats.prefill_tokens_saved) == (1, shared)
    fresh = load(reuse_cache=False).generate([diverging], GREEDY)[0][0]
    assert reused.completion_ids == fresh.completion_ids


@pytest.mark.slow
@pytest.mark.native
def test_llamacpp_store_is_bounded_and_cleared():
    policy = load()
    policy.generate([QUESTION], GREEDY)
    one = policy.kv_cache.nbytes
    assert len(policy.kv_cache) == 1 and one > 0
    policy.clear_cache()
    assert len(policy.kv_cache) == 0 and policy.kv_cache.nbytes == 0
    policy.kv_cache.max_bytes = one * 3 // 2                       # room for about one sequence
    other = [{"role": "user", "content": "Name a colour."}]
    policy.generate([QUESTION, other, [*QUESTION[:1], *other]], GREEDY)
    assert len(policy.kv_cache) == 1 and policy.kv_cache.nbytes <= policy.kv_cache.max_bytes
    policy.kv_cache.max_bytes = 0                                  # stores nothing, still answers
    policy.clear_cache()
    assert policy.generate([QUESTION], GREEDY)[0][0].completion_ids and len(policy.kv_cache) == 0


@pytest.mark.slow
@pytest.mark.native
def test_llamacpp_next_turn_prompt_keeps_the_answer_as_sampled_and_the_template_text():
    policy = load()
    answer = policy.generate([QUESTION], GREEDY)[0][0]
    turn1 = [*QUESTION, {"role": "assistant", "content": answer.text}, {"role": "user", "content": "Again?"}]
    ids = policy.prompt_ids(turn1)
    assert ids[:len(answer.prompt_ids) + len(answer.completion_ids)] == answer.prompt_ids + answer.completion_ids
    assert policy._model.detokenize(ids, special=True).decode() == policy._render(turn1)
    assert policy.cache_stats.splices == 1
    policy.splice_answers = False                                  # re-rendered: same text
    assert policy._model.detokenize(policy.prompt_ids(turn1), special=True).decode() == policy._render(turn1)


def test_llamacpp_reuse_is_opt_in_because_it_can_flip_greedy_near_ties():
    import inspect

    assert inspect.signature(LlamaCppPolicy.__init__).parameters["reuse_cache"].default is False
