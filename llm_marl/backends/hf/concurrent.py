"""Sampling from several HF models at once: :func:`generate_all` runs their generate calls in threads, a share of
the cores each, where :func:`concurrent_threads` finds that faster."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch

from ...policy import Generation, SamplingParams
from .policy import HFPolicy


def concurrent_threads(policies: Sequence[Any], seeded: bool = False) -> int | None:
    """Torch threads for each of ``policies``' generate calls if they should run at once, else ``None``.

    Different models cannot share a decode batch, and a small batch's decode step streams all of its model's
    weights, which one core reads nearly as fast as two: two models sampling at once on a core each finish before
    the same two one after the other on both cores (the Performance page has the figure). So separate HF models on
    the CPU sample concurrently, a share of the free cores each, when every one of them: is an :class:`HFPolicy` on
    the CPU without a fixed ``threads`` or sharded weights, has its own tokenizer (a fast tokenizer is not safe to
    share between threads), and there are at least as many free cores as policies; not under autocast (worker
    threads would not inherit it). ``seeded``: the share is of the process's threads, not of the free cores (a
    seeded run must not follow the machine's load, see :meth:`HFPolicy.call_threads`).
    """
    if len(policies) < 2 or not all(isinstance(p, HFPolicy) and p.threads is None and p.device.type == "cpu"
                                    and not p.lockstep for p in policies):
        return None
    if len({id(p.tokenizer) for p in policies}) < len(policies) or torch.is_autocast_enabled("cpu"):
        return None
    cores = torch.get_num_threads()
    if not seeded:
        cores = min(cores, min(p.core_meter.free_cores() for p in policies))
    return cores // len(policies) if cores >= len(policies) else None


def generate_all(calls: Sequence[tuple[Any, list, dict[str, Any]]], params: SamplingParams,
                 concurrent: bool = True) -> list[list[list[Generation]]]:
    """``[policy.generate(conversations, params, **kwargs) for policy, conversations, kwargs in calls]``, at once
    where :func:`concurrent_threads` allows it (and ``concurrent``), else one after the other.

    Without a seed in ``params``, several HF calls each get a seed drawn from torch's global generator here, in
    call order, so the samples are the same whether the calls ran concurrently or not (and reproducible under
    ``torch.manual_seed``); those calls still take the free cores. Unseeded, when a concurrent call finishes, the
    calls still decoding take its cores from their next step on; seeded, each call keeps its share.
    """
    seeded = params.seed is not None
    hf_calls = all(isinstance(policy, HFPolicy) for policy, _, _ in calls)
    if len(calls) > 1 and not seeded and hf_calls:
        seeds = torch.randint(0, 2**31 - 1, (len(calls),)).tolist()
        call_params = [replace(params, seed=int(seed)) for seed in seeds]
    else:
        call_params = [params] * len(calls)
    threads = concurrent_threads([policy for policy, _, _ in calls], seeded) if concurrent else None
    if threads is None:
        return [policy.generate(conversations, p, **free_threads(policy, seeded, kwargs)) for
                (policy, conversations, kwargs), p in zip(calls, call_params)]
    cores, running = threads * len(calls), [len(calls)]
    lock = threading.Lock()

    def share() -> int:                    # a finished call's cores go to the calls still decoding
        return threads if seeded else max(1, cores // max(1, running[0]))

    def run(policy, conversations, p, kwargs):
        try:
            return policy.generate(conversations, p, threads=share, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    before = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(len(calls), thread_name_prefix="generate") as pool:
            futures = [pool.submit(run, policy, conversations, p, kwargs)
                       for (policy, conversations, kwargs), p in zip(calls, call_params)]
            return [future.result() for future in futures]
    finally:
        torch.set_num_threads(before)      # the workers' settings touch process-wide pools (MKL)


def free_threads(policy: Any, seeded: bool, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for one call run alone: a call whose seed :func:`generate_all` drew (the caller gave none) runs
    on the threads an unseeded call would take."""
    if seeded or not isinstance(policy, HFPolicy) or "threads" in kwargs:
        return kwargs
    return {**kwargs, "threads": policy.call_threads(seeded=False)}
