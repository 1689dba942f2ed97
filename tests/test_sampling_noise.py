"""Every generate call of a rollout draws fresh noise; the whole run stays reproducible from its seed."""
from __future__ import annotations

import pytest
import torch

from llm_marl.backends.hf import HFPolicy
from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.team import Team
from toy_env import SayNumberEnv


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


def test_each_turn_of_a_seeded_rollout_gets_its_own_seed_and_the_run_replays(tiny_hf):
    def play():
        recorder = RecordingPolicy(tiny_hf)
        team = Team.from_policies({"agent_0": recorder, "agent_1": recorder})
        engine = RolloutEngine(SayNumberEnv(num_turns=3), team, progress=False)
        params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=11)
        episodes = engine.collect(seeds=[0, 1], task_indices=[2, 2], params=params)
        return recorder.seeds, [[{a: t.completion_ids for a, t in turn.items()} for turn in e.turns] for e in episodes]

    seeds, tokens = play()
    assert len(seeds) == 3                                  # one batched call per turn
    assert len(set(seeds)) == 3, f"turns reused one seed: {seeds}"
    assert play() == (seeds, tokens)                        # the same seed replays the same episodes


def test_each_level_of_a_seeded_tree_gets_its_own_seed(tiny_hf):
    recorder = RecordingPolicy(tiny_hf)
    team = Team.from_policies({"agent_0": recorder, "agent_1": recorder})
    engine = RolloutEngine(SayNumberEnv(num_turns=2), team, progress=False)
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=5)
    roots = engine.reset_nodes([1])
    level0 = engine.expand(roots, 2, params=params)
    engine.expand(level0[0].children[:1], 2, params=params)
    assert len(recorder.seeds) == 2 and recorder.seeds[0] != recorder.seeds[1]
