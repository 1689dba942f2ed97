"""Threads are chosen per call from the cores other processes leave free (not once, at load time)."""
from __future__ import annotations

import pytest

from llm_marl.hardware import CoreMeter, read_cpu_times


def scripted(readings):
    """A reader that returns the given ``(wall, machine busy, own)`` readings in turn."""
    values = iter(readings)
    return lambda: next(values)


def test_core_meter_counts_other_processes_only():
    meter = CoreMeter(read=scripted([(0, 0, 0), (1, 2.0, 2.0), (2, 3.5, 2.0), (3, 4.0, 2.5), (3.01, 9, 2.5)]), cores=2)
    assert meter.free_cores() == 2        # the machine was busy, but with this process's own work
    assert meter.free_cores() == 1        # others used 1.5 cores for 1 s
    assert meter.free_cores() == 2        # others used nothing
    assert meter.free_cores() == 2        # 10 ms later: too short a window, the last answer stands


def test_core_meter_never_goes_below_one_or_above_the_cores():
    meter = CoreMeter(read=scripted([(0, 0, 0), (1, 10.0, 0), (2, 10.0, 0)]), cores=4)
    assert meter.free_cores() == 1
    assert meter.free_cores() == 4


def test_core_meter_falls_back_to_the_load_average_without_proc_stat():
    meter = CoreMeter(read=lambda: None, cores=2)
    assert 1 <= meter.free_cores() <= 2


def test_real_cpu_times_advance():
    first = read_cpu_times()
    if first is None:
        pytest.skip("no /proc/stat on this system")
    total = sum(i * i for i in range(300_000))                # burn some CPU in this process
    second = read_cpu_times()
    assert total > 0 and second[0] > first[0] and second[2] > first[2] and second[1] >= first[1]


@pytest.mark.slow
@pytest.mark.ci_slow
@pytest.mark.native
def test_llamacpp_policy_sets_its_threads_before_every_call():
    import llama_cpp

    from llm_marl.backends import load_policy
    from llm_marl.policy import SamplingParams

    policy = load_policy("llamacpp", "smollm2-135m", seed=0)
    policy.core_meter = CoreMeter(read=scripted([(0, 0, 0), (1, 1.0, 0), (2, 1.0, 0)]), cores=2)
    conversation = [[{"role": "user", "content": "Say hi."}]]
    params = SamplingParams(max_new_tokens=3, temperature=0.0)
    policy.generate(conversation, params)
    assert policy.n_threads == 1 == llama_cpp.llama_n_threads(policy._ctx.ctx)       # another process held a core
    policy.generate(conversation, params)
    assert policy.n_threads == 2 == llama_cpp.llama_n_threads(policy._ctx.ctx)       # then it was free again
    policy.fixed_threads = 1                                                         # --threads wins
    policy.generate(conversation, params)
    assert policy.n_threads == 1


def test_hf_policy_takes_the_free_cores_at_each_call_and_an_explicit_count_wins():
    import torch

    from llm_marl.backends.hf import HFPolicy
    from llm_marl.models import tiny_model
    from llm_marl.policy import SamplingParams

    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer)
    policy.core_meter = CoreMeter(read=scripted([(0, 0, 0), (1, 1.0, 0), (2, 1.0, 0)]), cores=2)
    conversation = [[{"role": "user", "content": "Say hi."}]]
    params = SamplingParams(max_new_tokens=2, temperature=0.0)
    seen = []
    forward = model.forward

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return forward(*args, **kwargs)

    model.forward = spy
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        policy.generate(conversation, params)
        assert policy.last_threads == 1 and set(seen) == {1}           # another process held a core
        assert torch.get_num_threads() == 2                            # the process setting is restored
        seen.clear()
        policy.generate(conversation, params)
        assert policy.last_threads == 2 and set(seen) == {2}           # then it was free again
        torch.set_num_threads(1)                                       # the process setting caps the choice
        policy.core_meter = CoreMeter(read=scripted([(0, 0, 0), (1, 0.0, 0)]), cores=2)
        policy.generate(conversation, params)
        assert policy.last_threads == 1
        policy.threads = 2                                             # an explicit count wins
        seen.clear()
        policy.generate(conversation, params)
        assert policy.last_threads == 2 and set(seen) == {2} and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        HFPolicy(model, tokenizer, threads=0)


def test_a_seeded_hf_call_runs_on_the_process_threads_whatever_the_load():
    """The thread count can change how sums round, so a seeded call does not follow the free cores."""
    import torch

    from llm_marl.backends.hf import HFPolicy
    from llm_marl.models import tiny_model
    from llm_marl.policy import SamplingParams

    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer)
    policy.core_meter = CoreMeter(read=scripted([(0, 0, 0)] + [(t, 1.0 * t, 0) for t in range(1, 4)]), cores=2)
    conversation = [[{"role": "user", "content": "Say hi."}]]
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        policy.generate(conversation, SamplingParams(max_new_tokens=2, temperature=1.0, seed=1))
        assert policy.last_threads == 2                                 # another process holds a core: ignored
        policy.generate(conversation, SamplingParams(max_new_tokens=2, temperature=1.0))
        assert policy.last_threads == 1                                 # unseeded: the free cores
    finally:
        torch.set_num_threads(previous)


def test_short_openmp_spin_is_set_unless_the_user_chose_a_wait():
    from llm_marl.hardware import OPENMP_SPIN_COUNT, short_openmp_spin

    env = {}
    assert short_openmp_spin(env) == f"GOMP_SPINCOUNT={OPENMP_SPIN_COUNT}" and env == {"GOMP_SPINCOUNT": "3000"}
    for users in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "0"}):
        env = dict(users)
        assert "set by the user" in short_openmp_spin(env) and env == users


def test_the_cli_sets_the_short_spin_before_torch_loads():
    import subprocess
    import sys

    code = ("import os, sys; os.environ.pop('OMP_WAIT_POLICY', None); os.environ.pop('GOMP_SPINCOUNT', None); "
            "import llm_marl.cli; print(os.environ['GOMP_SPINCOUNT'], 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["3000", "False"]
