"""Every generate call of a rollout draws fresh noise; the whole run stays reproducible from its seed."""
from __future__ import annotations

import pytest
import torch

from llm_marl.backends.hf import HFPolicy
from llm_marl.backends.prefix_cache import CacheStats
from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.team import Team
from tests.toy_env import SayNumberEnv


class RecordingPolicy:
    """Delegates to a real policy and records the seed of every generate call."""

    def __init__(self, policy: HFPolicy) -> None:
        self.policy, self.name, self.seeds = policy, policy.name, []

    def generate(self, conversations, params, *, adapters=None, num_samples=1):
        self.seeds.append(params.seed)
        return self.policy.generate(conversations, params, adapters=adapters, num_samples=num_samples)


@pytest.fixture(scope="module")
def tiny_hf():
    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    return HFPolicy(model, tokenizer, name="tiny")


def test_for_call_derives_distinct_reproducible_seeds():
    params = SamplingParams(seed=7)
    seeds = [params.for_call(t).seed for t in range(50)]
    assert len(set(seeds)) == 50
    assert seeds == [params.for_call(t).seed for t in range(50)]
    assert params.for_call(0).seed != SamplingParams(seed=8).for_call(0).seed
    assert all(0 <= s < 2**31 for s in seeds)
    unseeded = SamplingParams()
    assert unseeded.for_call(3) is unseeded          # the backend's own generator already draws fresh noise


def test_a_derived_seed_changes_the_samples_of_one_conversation(tiny_hf):
    conversation = [[{"role": "user", "content": "say a number"}]]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
    again = tiny_hf.generate(conversation, params)[0][0].completion_ids
    assert tiny_hf.generate(conversation, params)[0][0].completion_ids == again
    others = {tuple(tiny_hf.generate(conversation, params.for_call(t))[0][0].completion_ids) for t in range(4)}
    assert len(others) > 1


def play(policy: HFPolicy, seed: int = 11):
    """A seeded 3-turn rollout of 2 episodes through a wrapper that, like any user wrapper, hides ``clear_cache``:
    the seeds of its generate calls and every turn's completion ids."""
    recorder = RecordingPolicy(policy)
    team = Team.from_policies({"agent_0": recorder, "agent_1": recorder})
    engine = RolloutEngine(SayNumberEnv(num_turns=3), team, progress=False)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=seed)
    episodes = engine.collect(seeds=[0, 1], task_indices=[2, 2], params=params)
    return recorder.seeds, [[{a: t.completion_ids for a, t in turn.items()} for turn in e.turns] for e in episodes]


def test_each_turn_of_a_seeded_rollout_gets_its_own_seed_and_the_run_replays(tiny_hf):
    seeds, tokens = play(tiny_hf)
    assert len(seeds) == 3                                  # one batched call per turn
    assert len(set(seeds)) == 3, f"turns reused one seed: {seeds}"
    assert play(tiny_hf) == (seeds, tokens)                 # the same seed replays the same episodes


def test_a_seeded_rollout_replays_with_a_warm_or_a_cleared_cache(tiny_hf):
    tiny_hf.clear_cache()
    tiny_hf.cache_stats = CacheStats()
    _, first = play(tiny_hf)
    assert len(tiny_hf.kv_cache) > 0 and tiny_hf.cache_stats.shared > 0   # the first turn ran a shared prefix
    tiny_hf.cache_stats = CacheStats()
    _, warm = play(tiny_hf)            # the wrapper hid clear_cache: every first-turn prompt is in the store
    assert tiny_hf.cache_stats.shared == tiny_hf.cache_stats.misses == 0
    tiny_hf.clear_cache()
    _, cleared = play(tiny_hf)
    assert warm == first and cleared == first


def test_a_seeded_rollout_replays_on_one_thread_and_on_two(tiny_hf):
    before = torch.get_num_threads()
    runs = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            tiny_hf.clear_cache()
            runs[threads] = play(tiny_hf)[1]
            assert tiny_hf.last_threads == threads  # a seeded call runs on the process setting, whatever the load
    finally:
        torch.set_num_threads(before)
    assert runs[1] == runs[2]


def test_a_rows_samples_do_not_depend_on_the_rows_beside_it(tiny_hf):
    """Other rows change the batch's padding and the nucleus's candidate width; the row's noise is its own."""
    tiny_hf.clear_cache()
    short = [{"role": "user", "content": "say a number"}]
    longer = [{"role": "user", "content": "write a much longer line than the other one, with many words in it"}]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=4)
    alone = tiny_hf.generate([short], params, num_samples=2)[0]
    tiny_hf.clear_cache()
    together = tiny_hf.generate([short, longer, longer], params, num_samples=2)[0]
    assert [g.completion_ids for g in together] == [g.completion_ids for g in alone]
    assert alone[0].completion_ids != alone[1].completion_ids   # the G samples of one prompt still differ


def test_each_level_of_a_seeded_tree_gets_its_own_seed(tiny_hf):
    recorder = RecordingPolicy(tiny_hf)
    team = Team.from_policies({"agent_0": recorder, "agent_1": recorder})
    engine = RolloutEngine(SayNumberEnv(num_turns=2), team, progress=False)
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=5)
    roots = engine.reset_nodes([1])
    level0 = engine.expand(roots, 2, params=params)
    engine.expand(level0[0].children[:1], 2, params=params)
    assert len(recorder.seeds) == 2 and recorder.seeds[0] != recorder.seeds[1]
