"""GreedyCache: a second play of the same greedy prompts with the same weights takes the kept answers instead of
generating them, plays exactly as without the cache, and never serves an answer across a weight change or to a
sampled request."""
import pytest
import torch

import llm_marl_envs
from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.rollout import GreedyCache, RolloutEngine
from llm_marl.team import Team

GREEDY = SamplingParams(max_new_tokens=8, temperature=0)
TASKS = [0, 1, 2]


@pytest.fixture()
def team(one_torch_thread):
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, 2)
    randomize_adapters(team, seed=0)     # the tiny base alone writes only newlines: give each seat its own text
    return team


def randomize_adapters(team: Team, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in team.policy("agent_0").model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)


def play(team: Team, cache: GreedyCache | None, masked: bool = False, params: SamplingParams = GREEDY):
    """Episodes of split_arithmetic-v0 on TASKS, and how many generate calls the policy made for them."""
    env = llm_marl_envs.make("split_arithmetic-v0", num_turns=2, mask_messages=masked)
    policy = team.policy("agent_0")
    calls = policy.generate_calls
    episodes = RolloutEngine(env, team, params, progress=False, greedy_cache=cache).collect(
        task_indices=TASKS, seeds=TASKS)
    return episodes, policy.generate_calls - calls


def trajectory(episodes) -> list:
    """Every agent turn's prompt ids, completion ids and text."""
    return [(t.prompt_ids, t.completion_ids, t.text) for e in episodes for turn in e.turns for t in turn.values()]


def test_the_masked_play_takes_the_teams_turn0_answers_and_plays_as_without_the_cache(team):
    fresh_masked, fresh_calls = play(team, None, masked=True)
    cache = GreedyCache()
    team_episodes, team_calls = play(team, cache)
    masked, masked_calls = play(team, cache, masked=True)
    assert (fresh_calls, team_calls) == (2, 2)              # one call per turn, both agents in one batch
    assert masked_calls == 1                                # turn 0 came from the team's play
    assert cache.hits == len(TASKS) * 2                     # every turn-0 answer of both agents
    assert trajectory(masked) == trajectory(fresh_masked)
    assert [e.turns[0]["agent_0"].text for e in masked] == [e.turns[0]["agent_0"].text for e in team_episodes]
    # the turn-1 prompts differ (the partner's message is masked), so none of them was served from the cache
    assert [e.turns[1]["agent_1"].prompt_ids for e in masked] != [e.turns[1]["agent_1"].prompt_ids
                                                                  for e in team_episodes]


def test_a_weight_change_makes_the_kept_answers_stale(team):
    cache = GreedyCache()
    play(team, cache)
    _, calls = play(team, cache)
    assert calls == 0                                       # the same prompts and weights: nothing generated
    randomize_adapters(team, seed=1)
    changed, calls = play(team, cache)
    assert calls == 2
    replayed, _ = play(team, None)
    assert trajectory(changed) == trajectory(replayed)      # the new weights' answers, not the kept ones


def test_sampled_requests_are_never_kept(team):
    cache = GreedyCache()
    sampled = SamplingParams(max_new_tokens=8, temperature=0.7, seed=0)
    _, first = play(team, cache, params=sampled)
    _, second = play(team, cache, params=sampled)
    assert (first, second) == (2, 2) and len(cache) == 0 and cache.hits == 0


def test_identical_greedy_requests_of_one_call_are_generated_once(team):
    """Task 0 twice and task 1: per turn 6 requests, 4 distinct; the repeated episode plays exactly as its twin."""
    env = llm_marl_envs.make("split_arithmetic-v0", num_turns=2)
    cache = GreedyCache()
    episodes = RolloutEngine(env, team, GREEDY, progress=False, greedy_cache=cache).collect(
        task_indices=[0, 0, 1], seeds=[0, 0, 1])
    assert (cache.misses, cache.hits) == (8, 4)                # 4 generated and 2 repeated, at each of 2 turns
    assert trajectory(episodes[:1]) == trajectory(episodes[1:2])
    fresh = RolloutEngine(env, team, GREEDY, progress=False).collect(task_indices=[0, 0, 1], seeds=[0, 0, 1])
    assert trajectory(episodes) == trajectory(fresh)
