"""Episodes per second of the llama.cpp backend vs the HF backend, same env, model, episodes and seed.

Both runs go through the benchmark harness (:func:`llm_marl.benchmark.run_benchmark`, i.e.
the shared rollout engine), into fresh temporary run directories. Model loading is excluded
from the timing (both policies are loaded first); everything else an episode costs — prompt
formatting, generation, verification, record writing — is included.

    flock /work/cpu.lock env PYTHONPATH=. python benchmarks/bench_backends.py

Defaults: 8 episodes of 2 agents x 2 turns, 128 new tokens, 4 episodes per generate call (8
prompts) for BOTH backends — HF decodes them as one padded batch, llama.cpp as 8 sequences of one
context (``max_batch`` = prompts per call) — and 2 CPU threads for each (``--threads``).

Goal: ratio >= 5. The last line is ``ratio=<llamacpp episodes/s / hf episodes/s>``.

Measured (2 cores, ``OMP_WAIT_POLICY=PASSIVE``, under the CPU lock; 1-minute load at start -> end,
this run's own 2 threads included; tokens/s = generated tokens per second):

    setting                               load       llama.cpp eps (tok/s)  HF eps (tok/s)  ratio
    defaults                              1.3 -> 1.7  0.133 (52)             0.091 (41)      1.46
    defaults, again                       1.7 -> 1.8  0.126 (50)             0.072 (32)      1.76
    --num-turns 3                         1.7 -> 2.0  0.063 (37)             0.042 (27)      1.50
    --episodes-per-batch 8 (16 prompts)   1.8 -> 1.9  0.126 (57)             0.102 (44)      1.23
    defaults, a foreign job started       0.8 -> 2.6  0.068 (27)             0.080 (36)      0.85

The former single-stream llama.cpp backend (a loop over prompts), same harness and defaults, load
1.1 -> 1.9: 0.091 episodes/s (37 tok/s) — about HF's speed; batching made llama.cpp ~1.4x faster.

The goal is NOT met, and cannot be on this CPU with this model:

* The embedded GGUF is Q4_1, which ggml multiplies with per-row dot products on AVX2 (no Q4_1
  matrix kernel), so the CPU time per token hardly falls with the batch. One thread, 300 tokens of
  context (CPU time; this VM's per-core speed varies by ~40% between runs): decode 10-15 ms/token
  for 1 sequence, 8.3-11.5 for 8 to 32 sequences; prompt prefill ~7 ms/token. Batching saves
  per-step overhead, not arithmetic: at most ~240 tok/s of pure decoding on 2 cores.
* Every debate turn re-sends the whole history: 4 episodes of 2 x 2 turns prefill 4481 prompt
  tokens for 1643 generated ones, and prefill is 55% of llama.cpp's generate time (39% at turn 0,
  64% at turn 1). That caps this workload near 75 generated tok/s, a ratio of about 2 against HF's
  32-44 tok/s (HF prefills in large bf16 matmuls, cheaply; its cost is per decode step).
* llama.cpp's threads meet at a barrier after every op: a foreign process on one core halves its
  speed (last row), which is why the backend uses :func:`free_cores` threads by default.

What would move it: keep each agent's KV cache between turns (only the new suffix of a prompt
prefilled: ~40% fewer prompt tokens at 2 turns, more at 3); a weight format ggml has AVX2 matrix
kernels for (requantized to Q4_0, which it repacks: 7.2 ms/token at batch 16, one thread, in one
measurement — a modest gain, and no longer the weights HF runs); or hardware whose batched kernels
pay (AVX512-VNNI/AMX, ARM i8mm, a GPU).
Against batched HF on these 2 cores, even all of them together would not reach 5x.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from llm_marl.hardware import short_openmp_spin  # noqa: E402

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch or llama.cpp start their runtime

import torch  # noqa: E402

from llm_marl.benchmark import BenchConfig, run_benchmark  # noqa: E402
from llm_marl.hardware import free_cores  # noqa: E402
from llm_marl.backends import load_policy  # noqa: E402


def episodes_per_second(config: BenchConfig, policy) -> tuple[float, float, dict]:
    """Run ``config`` with a ready policy in a fresh directory; returns (episodes/s, CPU seconds, summary)."""
    with tempfile.TemporaryDirectory() as out:
        began, cpu_began = time.perf_counter(), time.process_time()
        summary = run_benchmark(config, out, policies={config.models[0]: policy}, progress=False)
        elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    return config.episodes / elapsed, cpu, summary


def main() -> None:
    """Time both backends and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="gsm_symbolic_debate-v0")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--num-agents", type=int, default=2)
    parser.add_argument("--num-turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--episodes-per-batch", type=int, default=4,
                        help="episodes advanced together: each turn, their prompts go to the backend in one call")
    parser.add_argument("--max-batch", type=int, default=None,
                        help="llama.cpp sequences decoded together (default: episodes-per-batch x agents, "
                             "i.e. every prompt of a call, as HF does)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="CPU threads of BOTH backends (llama.cpp n_threads, torch intra-op threads)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    max_batch = args.max_batch or args.episodes_per_batch * args.num_agents
    torch.set_num_threads(args.threads)
    print(f"env={args.env} model={args.model} episodes={args.episodes} agents={args.num_agents} "
          f"turns={args.num_turns} max_new_tokens={args.max_new_tokens} seed={args.seed} cores={os.cpu_count()} "
          f"free_cores={free_cores()} load={os.getloadavg()[0]:.1f} OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')} GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'unset')} "
          f"threads={args.threads} episodes_per_batch={args.episodes_per_batch} llamacpp_max_batch={max_batch}")
    results = {}
    for backend in ("llamacpp", "hf"):
        config = BenchConfig(env_id=args.env, models=[args.model], backend=backend, episodes=args.episodes,
                             num_agents=args.num_agents, num_turns=args.num_turns, seed=args.seed,
                             max_new_tokens=args.max_new_tokens, episodes_per_batch=args.episodes_per_batch)
        options = {"max_batch": max_batch, "n_threads": args.threads} if backend == "llamacpp" else {}
        policy = load_policy(backend, args.model, seed=args.seed, **options)
        eps, cpu, summary = episodes_per_second(config, policy)
        results[backend] = eps
        tokens_per_s = summary["tokens_total"] / summary["wall_time_total_s"]
        print(f"{backend:9s} {eps:.3f} episodes/s  {tokens_per_s:.0f} tokens/s  "
              f"{summary['tokens_total'] / cpu:.0f} tokens/CPU-s  "
              f"tokens/episode={summary['tokens_per_episode']['mean']:.0f}  "
              f"accuracy(last turn)={summary['accuracy_per_turn'][-1]['mean']:.2f}  load={os.getloadavg()[0]:.1f}")
    print(f"load at end={os.getloadavg()[0]:.1f}")
    print(f"ratio={results['llamacpp'] / results['hf']:.2f}")


if __name__ == "__main__":
    main()
