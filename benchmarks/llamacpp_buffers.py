"""Generated tokens per second of llama.cpp with its extra weight buffers on (llama.cpp's default) vs off.

Off is what the backend chooses on CPUs with AMX (:func:`llm_marl.hardware.llamacpp_extra_buffers`),
where ggml's AMX matmul crashes. On a CPU without AMX the backend keeps them on, so this measures
what turning them off would cost there, and that the "auto" choice loses nothing.

    PYTHONPATH=. python benchmarks/llamacpp_buffers.py [--rounds 6]

Both policies are loaded once, then timed in alternating rounds (on-off, off-on, ...) on the
same 8 prompts x 64 greedy tokens decoded as one batch, so machine drift hits both alike. The last
line is ``ratio=<off tokens/s / on tokens/s>`` (median over rounds of the paired ratios).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from llm_marl.hardware import short_openmp_spin  # noqa: E402

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch or llama.cpp start their runtime

from llm_marl.backends import LlamaCppPolicy  # noqa: E402
from llm_marl.hardware import cpu_info, free_cores, llamacpp_extra_buffers  # noqa: E402
from llm_marl.models import gguf_path  # noqa: E402
from llm_marl.policy import SamplingParams  # noqa: E402

PROMPTS = [[{"role": "user", "content": f"What is {a} + {b}? Think step by step, then answer."}]
           for a, b in [(3, 4), (12, 9), (25, 17), (8, 8), (41, 3), (6, 15), (30, 12), (7, 28)]]


def tokens_per_second(policy: LlamaCppPolicy, params: SamplingParams) -> float:
    """Generated tokens per wall second of one batched call over :data:`PROMPTS`."""
    began = time.perf_counter()
    out = policy.generate(PROMPTS, params)
    return sum(g.num_tokens for row in out for g in row) / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: the free cores)")
    args = parser.parse_args()
    threads = args.threads or free_cores()
    cpu = cpu_info()
    auto = llamacpp_extra_buffers(cpu.flags)
    print(f"cpu={cpu.model!r} features={' '.join(cpu.relevant_flags)} threads={threads} "
          f"load={os.getloadavg()[0]:.1f} auto: use_extra_bufts={auto.use_extra_bufts} ({auto.reason})")
    path = gguf_path(args.model)
    policies = {flag: LlamaCppPolicy(path, n_ctx=512, max_batch=len(PROMPTS), n_threads=threads, use_extra_bufts=flag)
                for flag in (True, False)}
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    for policy in policies.values():
        tokens_per_second(policy, params)                     # warm-up: page in weights, first-call set-up
    rates: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        for flag in ((True, False) if r % 2 == 0 else (False, True)):     # ABBA order: drift hits both alike
            rates[flag].append(tokens_per_second(policies[flag], params))
        print(f"round {r}: extra buffers on {rates[True][-1]:.1f} tok/s, off {rates[False][-1]:.1f} tok/s")
    ratios = [off / on for on, off in zip(rates[True], rates[False])]
    print(f"median tok/s: on {statistics.median(rates[True]):.1f}, off {statistics.median(rates[False]):.1f}; "
          f"load at end={os.getloadavg()[0]:.1f}")
    print(f"ratio={statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
