"""Prompt-lookup drafts in HFPolicy's greedy decode: the same tokens and log-probs as one token per step,
in fewer steps where answers repeat the prompt; the lookup, the width choice and the dropped drafts' states."""
import pytest
import torch

import llm_marl_envs
from llm_marl.backends.hf import HFPolicy, forget_rejected_drafts, reserved_cache
from llm_marl.backends.prompt_lookup import PromptLookup, accepted_drafts, step_width
from llm_marl.models import DEFAULT_MODEL, load, tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.team import Team


def test_lookup_drafts_what_followed_the_latest_earlier_three_tokens():
    lookup = PromptLookup([5, 6, 7, 1, 2, 5, 6, 7, 3, 4, 9, 5, 6])
    assert lookup.draft(4) == []                         # [9, 5, 6] occurs nowhere before: no draft
    lookup.extend([7])
    assert lookup.draft(2) == [3, 4]                     # [5, 6, 7]: the latest earlier occurrence (not the first)
    assert lookup.draft(10) == [3, 4, 9, 5, 6, 7]        # at most what follows it
    assert lookup.draft(0) == []


def test_lookup_matches_only_at_token_boundaries():
    # as 4-byte little-endian integers, [1, 1, 1, 1] holds the bytes of [256, 256, 256] one byte off
    lookup = PromptLookup([7, 1, 1, 1, 1, 8, 256, 256, 256])
    assert lookup.draft(3) == []
    lookup = PromptLookup([256, 256, 256, 8, 1, 1, 1, 1, 256, 256, 256])   # the misaligned match is passed over
    assert lookup.draft(3) == [8, 1, 1]


def test_accepted_drafts_stop_at_the_first_disagreement():
    assert accepted_drafts([4, 5, 6], [4, 5, 9, 1]) == 2
    assert accepted_drafts([4, 5], [4, 5, 8]) == 2
    assert accepted_drafts([7], [4, 7]) == 0
    assert accepted_drafts([], [4]) == 0


def test_step_width_is_wide_at_few_rows_and_one_at_many():
    reliable = [[1] * 6] * 4
    assert step_width(reliable, [0.95] * 4, free_positions=30) == 7          # the weights dominate the step
    assert step_width([[1] * 6] * 128, [0.8] * 128, free_positions=30) == 1  # compute dominates
    assert step_width([[]] * 4, [0.9] * 4, free_positions=30) == 1            # nothing to draft
    assert step_width([[1] * 6] * 4, [0.05] * 4, free_positions=30) == 1      # drafts that never hold


def test_rejected_drafts_are_cropped_or_masked():
    cache = reserved_cache(room=8)
    keys = torch.randn(2, 1, 5, 2)
    cache.update(keys, keys.clone(), 0)
    mask = torch.ones(2, 5, dtype=torch.long)
    # the last step fed 3 drafts per row: row 0 kept 1, row 1 kept 2 -> 1 column cropped, 1 masked in row 0
    mask = forget_rejected_drafts(cache, mask, fed=3, kept=[1, 2])
    assert cache.layers[0].keys.shape[-2] == 4 and mask.shape == (2, 4)
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    torch.testing.assert_close(cache.layers[0].keys, keys[:, :, :4])


def echo_model(seed: int = 0):
    """The tiny random model, whose greedy answers repeat themselves (so drafts get accepted)."""
    model, tokenizer = tiny_model(seed=seed)
    return model, tokenizer


@pytest.mark.parametrize("reuse", [False, True])
def test_greedy_tokens_and_logprobs_are_the_same_with_and_without_drafts(one_torch_thread, reuse):
    model, tokenizer = echo_model()
    team = Team.adapter_per_agent(model, tokenizer, 2)
    policy = team.policy("agent_0")
    policy.reuse_cache = reuse
    env = llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=3)
    engine = RolloutEngine(env, team, SamplingParams(max_new_tokens=24, temperature=0), progress=False)
    runs = {}
    for drafts in (0, 6):
        policy.draft_tokens = drafts
        steps, accepted = policy.decode_steps, policy.draft_tokens_accepted
        episodes = engine.collect(num_episodes=3)
        runs[drafts] = (episodes, policy.decode_steps - steps, policy.draft_tokens_accepted - accepted)
    (plain, plain_steps, none), (drafted, drafted_steps, accepted) = runs[0], runs[6]
    assert none == 0 and accepted > 0
    assert drafted_steps < plain_steps
    for a, b in zip(drafted, plain):
        for turn_a, turn_b in zip(a.turns, b.turns):
            for agent in turn_a:
                assert (turn_a[agent].prompt_ids, turn_a[agent].completion_ids, turn_a[agent].text) == \
                    (turn_b[agent].prompt_ids, turn_b[agent].completion_ids, turn_b[agent].text)
                assert turn_a[agent].logprobs == pytest.approx(turn_b[agent].logprobs, abs=1e-4)


def test_sampling_feeds_no_drafts_and_keeps_its_seeded_samples(one_torch_thread):
    model, tokenizer = echo_model()
    policy = HFPolicy(model, tokenizer, reuse_cache=False)
    conversation = [[{"role": "user", "content": "say abc abc abc abc"}]]
    params = SamplingParams(max_new_tokens=16, temperature=0.8, seed=3)
    policy.draft_tokens = 0
    plain = policy.generate(conversation, params, num_samples=3)
    policy.draft_tokens = 6
    drafted = policy.generate(conversation, params, num_samples=3)
    assert policy.draft_tokens_fed == 0
    assert [g.completion_ids for g in drafted[0]] == [g.completion_ids for g in plain[0]]


def test_draft_tokens_must_not_be_negative():
    model, tokenizer = echo_model()
    with pytest.raises(ValueError, match="draft_tokens must be >= 0"):
        HFPolicy(model, tokenizer, draft_tokens=-1)


@pytest.mark.slow
@pytest.mark.ci_slow
def test_real_model_greedy_debates_are_the_same_with_and_without_drafts(one_torch_thread):
    model, tokenizer = load(DEFAULT_MODEL, dtype=torch.float32)
    team = Team.adapter_per_agent(model, tokenizer, 2)
    policy = team.policy("agent_0")
    env = llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=2, split="test")
    engine = RolloutEngine(env, team, SamplingParams(max_new_tokens=32, temperature=0), progress=False)
    runs = {}
    for drafts in (0, 6):
        policy.draft_tokens = drafts
        steps, fed = policy.decode_steps, policy.draft_tokens_fed
        episodes = engine.collect(task_indices=[9, 13, 15])   # test tasks whose answers grow over the turns
        runs[drafts] = ([(t.completion_ids, t.text) for e in episodes for turn in e.turns for t in turn.values()],
                        policy.decode_steps - steps, policy.draft_tokens_fed - fed)
    assert runs[6][0] == runs[0][0]
    assert runs[6][2] > 0 and runs[6][1] < runs[0][1]
