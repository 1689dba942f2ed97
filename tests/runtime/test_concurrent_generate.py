"""Separate HF models on the CPU sample concurrently, a share of the cores each, with the same samples as one by one."""
import threading

import pytest
import torch

from llm_marl.backends.hf import HFPolicy, concurrent_threads, generate_all
from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.team import Team
from tests.toy_env import SayNumberEnv

PROMPTS = [[{"role": "user", "content": "say 3"}], [{"role": "user", "content": "write a longer line, please"}]]


def separate_policies(n=2):
    """``n`` different tiny models, each with its own tokenizer, and 2 free cores for each."""
    policies = []
    for seed in range(n):
        model, tokenizer = tiny_model(seed=seed)
        policy = HFPolicy(model, tokenizer)
        policy.core_meter.free_cores = lambda: 2
        policies.append(policy)
    return policies


@pytest.fixture()
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def record_calls(policies):
    """Wrap each policy's generate to record (thread name, threads=) of every call."""
    calls = []
    for policy in policies:
        inner = policy.generate

        def generate(*args, _inner=inner, **kwargs):
            threads = kwargs.get("threads")
            calls.append((threading.current_thread().name, threads() if callable(threads) else threads))
            return _inner(*args, **kwargs)
        policy.generate = generate
    return calls


@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
def test_concurrent_calls_sample_what_sequential_calls_sample(two_threads, temperature):
    policies = separate_policies()
    calls = record_calls(policies)
    params = SamplingParams(max_new_tokens=6, temperature=temperature)
    work = [(policy, PROMPTS, {"num_samples": 3}) for policy in policies]
    results = {}
    for concurrent in (False, True):
        torch.manual_seed(11)
        # one after the other on 1 thread each, as the concurrent calls run: the same sums in the same order
        torch.set_num_threads(2 if concurrent else 1)
        results[concurrent] = generate_all(work, params, concurrent=concurrent)
    assert [name.startswith("generate") for name, _ in calls] == [False, False, True, True]
    # one after the other, each call takes the free cores (its seed was drawn here, not given by the caller)
    assert [threads for _, threads in calls] == [1, 1, 1, 1]
    assert torch.get_num_threads() == 2                                   # this thread's setting is restored
    for one, other in zip(results[False], results[True]):
        for group, same in zip(one, other):
            assert [g.completion_ids for g in group] == [g.completion_ids for g in same]
            for g, h in zip(group, same):                  # buffers placed elsewhere may round otherwise
                assert g.logprobs == pytest.approx(h.logprobs, abs=1e-5)
    if temperature > 0:                               # each call drew its own seed: the two models' noise differs
        assert results[True][0] != results[True][1]


def test_a_finished_call_hands_its_cores_to_the_one_still_decoding(two_threads):
    first, second = separate_policies()
    finished, seen = threading.Event(), []
    inner = first.generate

    def first_generate(*args, **kwargs):
        try:
            return inner(*args, **kwargs)
        finally:
            finished.set()
    first.generate = first_generate

    def before_forward(module, args):
        if not seen:
            assert finished.wait(60), "the first call never finished"
        seen.append(torch.get_num_threads())
    handle = second.model.register_forward_pre_hook(before_forward)
    try:
        generate_all([(first, PROMPTS, {}), (second, PROMPTS, {})], SamplingParams(max_new_tokens=4))
    finally:
        handle.remove()
    assert seen[0] == 1 and seen[-3:] == [2, 2, 2]      # prefill on its share; the 3 decode steps on both cores
    assert torch.get_num_threads() == 2


def test_when_the_calls_stay_one_after_the_other(two_threads):
    policies = separate_policies()
    assert concurrent_threads(policies) == 1
    assert concurrent_threads(policies[:1]) is None                       # nothing to overlap
    policies[1].tokenizer = policies[0].tokenizer
    assert concurrent_threads(policies) is None                           # a shared fast tokenizer
    policies = separate_policies()
    policies[0].threads = 2
    assert concurrent_threads(policies) is None                           # the user fixed the threads
    policies[0].threads = None
    policies[0].lockstep = True
    assert concurrent_threads(policies) is None                           # sharded weights: collectives
    policies[0].lockstep = False
    for policy in policies:
        policy.core_meter.free_cores = lambda: 1
    assert concurrent_threads(policies) is None                           # fewer free cores than models
    for policy in policies:
        policy.core_meter.free_cores = lambda: 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert concurrent_threads(policies) is None                       # workers would not inherit autocast


def test_an_error_in_one_call_reaches_the_caller(two_threads):
    policies = separate_policies()
    work = [(policies[0], PROMPTS, {}), (policies[1], PROMPTS, {"adapters": ["nope", None]})]
    with pytest.raises(ValueError, match="unknown adapter 'nope'"):
        generate_all(work, SamplingParams(max_new_tokens=2))
    assert torch.get_num_threads() == 2


def test_the_rollout_engine_samples_separate_models_concurrently(two_threads):
    policies = separate_policies()
    team = Team.separate([(p.model, p.tokenizer) for p in policies])
    for agent in team.agents:
        team.policy(agent).core_meter.free_cores = lambda: 2
    calls = record_calls([team.policy(agent) for agent in team.agents])
    engine = RolloutEngine(SayNumberEnv(), team, SamplingParams(max_new_tokens=3, temperature=1.0), progress=False)
    engine.sample([("agent_0", PROMPTS[0]), ("agent_1", PROMPTS[1])])
    assert [threads for _, threads in calls] == [1, 1]
    calls.clear()
    engine.concurrent_policies = False
    engine.sample([("agent_0", PROMPTS[0]), ("agent_1", PROMPTS[1])])
    assert [threads for _, threads in calls] == [2, 2]                # the free cores, one call after the other
