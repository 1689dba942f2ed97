"""HFPolicy's KV reuse across turns and its token-level trajectories: same tokens with and without reuse,
bounded memory, and chat-template prompts that keep the earlier turn's tokens (or count why not)."""
import inspect
import warnings

import pytest
import torch

import llm_marl_envs
from llm_marl.backends.hf import HFPolicy, cache_keyword
from llm_marl.backends.prefix_cache import CacheStats, PrefixCache, common_prefix_length, shared_prefixes
from llm_marl.models import DEFAULT_MODEL, load_tokenizer, tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.team import Team

GREEDY = SamplingParams(max_new_tokens=10, temperature=0)


@pytest.fixture()
def team(one_torch_thread):
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, 2)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():                      # both adapters differ from the base and from each other
        for name, param in team.policy("agent_0").model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    return team


def debate_engine(team: Team, num_turns: int = 3) -> RolloutEngine:
    env = llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=num_turns)
    return RolloutEngine(env, team, GREEDY, progress=False)


def trajectory(episodes) -> list:
    """Every agent turn's prompt ids, completion ids and text."""
    return [(t.prompt_ids, t.completion_ids, t.text) for e in episodes for turn in e.turns for t in turn.values()]


def collect_with(policy: HFPolicy, engine: RolloutEngine, reuse: bool, **kwargs):
    policy.reuse_cache, policy.cache_stats = reuse, CacheStats()
    return engine.collect(**kwargs), policy.cache_stats


@pytest.mark.parametrize("splice", [True, False])
def test_greedy_debates_are_the_same_with_and_without_kv_reuse(team, splice):
    policy = team.policy("agent_0")
    policy.splice_answers = splice
    engine = debate_engine(team)
    plain, _ = collect_with(policy, engine, False, num_episodes=3)
    reused, stats = collect_with(policy, engine, True, num_episodes=3)
    assert trajectory(reused) == trajectory(plain)
    for a, b in zip(reused, plain):
        for turn_a, turn_b in zip(a.turns, b.turns):
            for agent in turn_a:
                assert turn_a[agent].logprobs == pytest.approx(turn_b[agent].logprobs, abs=1e-4)
    later_rows = 3 * 2 * 2                                   # turns 1 and 2 of 3 episodes, 2 agents (mixed adapters)
    # turn 0: the 3 prompts of each agent share their system message and instructions, run once per adapter
    assert (stats.misses, stats.shared, stats.shared_prefixes) == (0, 3 * 2, 2)
    assert stats.hits + stats.partial == later_rows
    if splice:                                               # the prompts keep the sampled ids: every turn extends
        assert stats.hits == later_rows and stats.prefill_tokens_saved > stats.prefill_tokens
    else:                     # re-tokenized random answers often split otherwise: only their shared prefix is reused
        assert stats.prefill_tokens_saved > 0
    assert len(policy.kv_cache) == 0                         # collect cleared what the finished episodes left


@pytest.mark.parametrize("joint_mode", ["aligned", "cross"])
def test_magrpo_trees_are_the_same_with_and_without_kv_reuse(team, joint_mode):
    """A sampled root level, then two greedy levels whose prompts continue their parents' sampled answers.

    With and without reuse the logits differ by float rounding (a shared prefix plus an incremental prefill
    against one full prefill), so the identity is asked of what rounding cannot move: the greedy levels run
    with reuse in one tree and without in the other. The sampled level runs with reuse in both trees, the
    same computation twice, which the same seed must reproduce (whole sampled trees: the next test).
    """
    policy = team.policy("agent_0")
    engine = debate_engine(team)
    sampled = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)   # distinct answers for the children
    trees = {}
    for reuse in (False, True):
        policy.cache_stats = CacheStats()
        frontier, levels = engine.reset_nodes([0, 1], seeds=[0, 1]), []
        for params in (sampled, GREEDY, GREEDY):
            policy.reuse_cache = reuse or params is sampled
            expansions = engine.expand(frontier, 2, joint_mode, params=params)
            levels.append([[(g.prompt_ids, g.completion_ids) for gs in e.samples.values() for g in gs]
                           for e in expansions])
            frontier = [child for e in expansions for child, done in zip(e.children, e.done) if not done]
        engine.clear_caches()
        trees[reuse] = levels
    first_answers = [tuple(completion) for rows in trees[True][0] for _, completion in rows]
    assert len(set(first_answers)) > len(first_answers) // 2  # the sampled level really branched
    assert trees[True][0] == trees[False][0]                  # seeded sampling reproduces the sampled level
    assert trees[True][1:] == trees[False][1:]                # greedy levels: same tokens with and without reuse
    first_level_rows = 2 * 2                                  # 2 roots x 2 agents, prompts shared by the G samples
    # the roots' prompts share their prefix (run once per adapter); every later prompt reuses its parent's cache
    assert policy.cache_stats.misses == 0 and policy.cache_stats.shared == first_level_rows
    # (a partial hit: a sampled answer whose text re-tokenizes to other ids, without answer splicing)
    assert policy.cache_stats.hits > policy.cache_stats.partial and len(policy.kv_cache) == 0


def test_sampled_magrpo_trees_replay_with_kv_reuse(team):
    """Every level sampled, with reuse: a second run with the same seed grows the same tree."""
    policy = team.policy("agent_0")
    engine = debate_engine(team)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)
    trees = []
    for _ in range(2):
        frontier, levels = engine.reset_nodes([0, 1], seeds=[0, 1]), []
        for level in range(3):
            expansions = engine.expand(frontier, 2, "aligned", params=params.for_call(level))
            levels.append([[(g.prompt_ids, g.completion_ids) for gs in e.samples.values() for g in gs]
                           for e in expansions])
            frontier = [child for e in expansions for child, done in zip(e.children, e.done) if not done]
        engine.clear_caches()
        trees.append(levels)
    assert len(trees[0]) == 3 and trees[0][2]                     # three levels grew
    assert trees[0] == trees[1]
    assert policy.cache_stats.hits > 0


def test_seeded_sampling_reproduces_the_episode_with_kv_reuse(team):
    policy = team.policy("agent_0")
    engine = debate_engine(team)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=11)
    first, stats = collect_with(policy, engine, True, num_episodes=2, params=params)
    second, _ = collect_with(policy, engine, True, num_episodes=2, params=params)
    assert stats.hits > 0
    assert trajectory(first) == trajectory(second)


def test_spliced_prompts_decode_to_the_text_the_env_shows(team):
    policy = team.policy("agent_0")
    episodes, stats = collect_with(policy, debate_engine(team), True, num_episodes=2)
    assert stats.splices > 0
    for episode in episodes:
        for before, turn in zip(episode.turns, episode.turns[1:]):
            for agent, act in turn.items():
                assert act.messages[-2] == {"role": "assistant", "content": before[agent].text}
                rendered = policy.tokenizer.apply_chat_template(
                    act.messages, add_generation_prompt=True, tokenize=False
                )
                assert policy.tokenizer.decode(act.prompt_ids) == rendered
                assert act.prompt_ids[:len(before[agent].prompt_ids) + len(before[agent].completion_ids)] == \
                    before[agent].prompt_ids + before[agent].completion_ids


ANSWERS = ["The sum is \\boxed{71}.", "44 + 27 = 71", "  two leading spaces", "\n\nafter blank lines",
           "ends in a newline\n", "naïve 🙂 中文"]


@pytest.mark.parametrize("template_of", ["tiny", DEFAULT_MODEL])
@pytest.mark.parametrize("answer", ANSWERS)
def test_next_turn_prompt_extends_this_turn_or_the_fallback_is_counted(team, template_of, answer):
    """The tiny model and the embedded SmolLM2 share a tokenizer today; both are checked so a change shows."""
    model, tokenizer = team.policy("agent_0").model, team.policy("agent_0").tokenizer
    if template_of != "tiny":
        tokenizer = load_tokenizer(template_of)
    turn0 = [{"role": "user", "content": "What is 44 + 27?"}]
    turn1 = [*turn0, {"role": "assistant", "content": answer}, {"role": "user", "content": "Others said 72. Again?"}]
    end = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    outputs = {}
    for reuse in (False, True):
        policy = HFPolicy(model, tokenizer, reuse_cache=reuse, splice_answers=False)
        prompt = policy.encode(turn0)
        sequence = prompt + tokenizer(answer, add_special_tokens=False)["input_ids"] + end   # as if sampled so
        with policy.using("agent_1"):
            policy.kv_cache.put("agent_1", sequence, kv_of(model, sequence))
        outputs[reuse] = policy.generate([turn1], GREEDY, adapters=["agent_1"])[0][0].completion_ids
        stats = policy.cache_stats
    assert outputs[True] == outputs[False]
    if policy.encode(turn1)[:len(sequence)] == sequence:
        assert stats.hits == 1
    else:                  # leading whitespace merges with the template's "assistant\n": counted, the rest reused
        assert stats.partial == 1 and stats.hits == 0 and stats.prefill_tokens_saved >= len(prompt) - 2
    if not answer[0].isspace():                                   # the template keeps ordinary answers as a prefix
        assert stats.hits == 1


def test_a_prefix_shared_by_a_calls_prompts_runs_once_per_adapter(team):
    policy = team.policy("agent_0")
    system = {"role": "system", "content": "You are one agent of a team. Answer with a number in \\boxed{}."}
    conversations = [[system, {"role": "user", "content": f"What is {i} + {3 * i}?"}] for i in range(4)]
    adapters = ["agent_0", "agent_1"] * 2
    outputs, stats = {}, {}
    for reuse in (False, True):
        policy.reuse_cache, policy.cache_stats = reuse, CacheStats()
        policy.clear_cache()
        outputs[reuse] = [[(g.completion_ids, g.logprobs) for g in group]
                          for group in policy.generate(conversations, GREEDY, adapters=adapters, num_samples=2)]
        stats[reuse] = policy.cache_stats
    prompts = [policy.encode(c) for c in conversations]
    shared = min(common_prefix_length(prompts[0], p) for p in prompts[1:])
    assert shared >= 16
    assert [[ids for ids, _ in group] for group in outputs[True]] == [
        [ids for ids, _ in group] for group in outputs[False]
    ]
    for group_on, group_off in zip(outputs[True], outputs[False]):
        for (_, on), (_, off) in zip(group_on, group_off):
            assert on == pytest.approx(off, abs=1e-4)
    assert (stats[False].shared, stats[False].prefill_tokens) == (0, sum(map(len, prompts)))
    on = stats[True]
    assert (on.misses, on.shared, on.shared_prefixes) == (0, 4, 2)          # one prefix per adapter, 2 prompts each
    assert on.prefill_tokens == 2 * shared + sum(len(p) - shared for p in prompts)
    assert all(len(key[1]) > shared for key in policy.kv_cache._entries)     # the prefixes left with the call
    policy.cache_stats = CacheStats()
    policy.clear_cache()
    policy.generate(
        conversations[:2], GREEDY, adapters=["agent_0", "agent_1"]
    )  # one prompt per adapter: nothing shared
    assert (policy.cache_stats.shared_prefixes, policy.cache_stats.misses) == (0, 2)


def test_shared_prefixes_groups_prompts_by_what_they_share():
    system_a, system_b = list(range(100, 120)), list(range(200, 230))
    prompts = [system_a + [1, 2], system_b + [5], system_a + [3], system_b + [6, 7], [9] * 40, system_b + [5]]
    assert sorted(shared_prefixes(prompts)) == sorted([tuple(system_a), tuple(system_b)])
    assert shared_prefixes([[9] * 40] * 3) == [tuple([9] * 39)]              # G samples of one prompt: all but the last
    assert shared_prefixes([system_a + [1], system_a + [2]], min_length=21) == []   # too short to be worth a pass
    assert shared_prefixes([system_a + [1]]) == []


def kv_of(model, ids: list[int]):
    """Per-layer keys and values ``[heads, tokens, dim]`` of one sequence."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), **cache_keyword(model, cache), use_cache=True)
    return [(layer.keys[0], layer.values[0]) for layer in cache.layers]


@pytest.mark.parametrize("answer", ANSWERS)
def test_splicing_keeps_the_sampled_ids_and_the_text(one_torch_thread, answer):
    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer)
    turn0 = [{"role": "user", "content": "What is 44 + 27?"}]
    turn1 = [*turn0, {"role": "assistant", "content": answer}, {"role": "user", "content": "Again?"}]
    prompt = policy.encode(turn0)
    by_char = [i for ch in answer for i in tokenizer(ch, add_special_tokens=False)["input_ids"]]   # not canonical
    policy.splicer.remember(turn0, prompt, by_char + [policy.stop_ids[0]], answer)
    spliced = policy.encode(turn1)
    assert spliced[:len(prompt) + len(by_char)] == prompt + by_char
    assert tokenizer.decode(spliced) == tokenizer.apply_chat_template(turn1, add_generation_prompt=True, tokenize=False)
    assert policy.cache_stats.splices == 1


def test_weight_updates_and_the_byte_cap_never_serve_stale_or_unbounded_caches(team):
    policy = team.policy("agent_0")
    conversation = [{"role": "user", "content": "say 3"}]
    first = policy.generate([conversation] * 2, GREEDY, adapters=["agent_0", "agent_1"])
    assert len(policy.kv_cache) == 2
    both = policy.kv_cache.nbytes
    follow_up = [[*conversation, {"role": "assistant", "content": g[0].text}, {"role": "user", "content": "more"}]
                 for g in first]
    with policy.using("agent_0"):
        params = policy.trainable_parameters("agent_0")
        optimizer = torch.optim.AdamW(params, lr=0.5, fused=True)   # fused steps leave tensor versions alone
        sum(p.sum() for p in params).backward()
        optimizer.step()
    policy.cache_stats = CacheStats()
    updated = policy.generate(follow_up, GREEDY, adapters=["agent_0", "agent_1"])
    assert policy.cache_stats.hits == 0                           # the update cleared the store
    assert len(policy.kv_cache) == 2                              # the follow-ups' caches
    policy.reuse_cache = False
    again = policy.generate(follow_up, GREEDY, adapters=["agent_0", "agent_1"])
    assert [g[0].completion_ids for g in again] == [g[0].completion_ids for g in updated]
    policy.reuse_cache, policy.kv_cache.max_bytes = True, both * 3 // 4
    policy.kv_cache.clear()
    policy.generate([conversation] * 2, GREEDY, adapters=["agent_0", "agent_1"])
    assert len(policy.kv_cache) == 1 and policy.kv_cache.nbytes <= policy.kv_cache.max_bytes


def test_prefix_cache_finds_the_longest_prefix_and_evicts_least_recently_used():
    def layers(n):
        return [(torch.zeros(2, n, 4), torch.zeros(2, n, 4))]

    store = PrefixCache(max_bytes=2 * 2 * 2 * 6 * 4 * 4)          # room for 12 tokens of one layer
    store.put("a", [1, 2, 3], layers(3))
    store.put("a", [1, 2, 9, 9], layers(4))
    store.put("b", [1, 2, 3, 4, 5], layers(5))
    assert store.longest_prefix("a", [1, 2, 3, 7]) == (("a", (1, 2, 3)), 3)
    assert store.longest_prefix("a", [1, 2, 3]) == (("a", (1, 2, 3)), 2)   # the last token must run
    assert store.longest_prefix("a", [5]) == (None, 0)
    store.put("a", [7] * 6, layers(6))              # 18 tokens > 12: the least recently used go until it fits
    assert len(store) == 2 and store.longest_prefix("b", [1, 2, 3, 4, 5, 6]) == (None, 0)
    assert store.longest_prefix("a", [1, 2, 9, 9, 1]) == (("a", (1, 2, 3)), 2)   # [1, 2, 9, 9] went first
    assert store.nbytes <= store.max_bytes


def test_cache_keyword_follows_the_forward_signature(team):
    class Renamed:                                   # transformers >= 5.24
        def forward(self, input_ids=None, cache=None):
            pass

    class Old:                                       # transformers < 5.24
        def forward(self, input_ids=None, past_key_values=None):
            pass

    marker = object()
    assert cache_keyword(Renamed(), marker) == {"cache": marker}
    assert cache_keyword(Old(), marker) == {"past_key_values": marker}
    peft_model = team.policy("agent_0").model        # a PeftModel: the base model's forward decides
    base_forward = inspect.signature(type(peft_model.get_base_model()).forward).parameters
    expected = "cache" if "cache" in base_forward else "past_key_values"
    assert list(cache_keyword(peft_model, marker)) == [expected]


def test_rollouts_and_scoring_pass_the_cache_without_deprecation_warnings(team):
    policy = team.policy("agent_0")
    engine = debate_engine(team, num_turns=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        episodes, _ = collect_with(policy, engine, True, num_episodes=2)
        turn = episodes[0].turns[1]["agent_0"]
        policy.token_logprobs([turn.prompt_ids] * 2, [turn.completion_ids] * 2, adapter="agent_0")
