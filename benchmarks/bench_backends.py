"""Episodes per second of the llama.cpp backend vs the HF backend, same env, model, episodes and seed.

    PYTHONPATH=. python benchmarks/bench_backends.py

Both runs go through the benchmark harness (:func:`llm_marl.benchmark.run_benchmark`, i.e. the shared
rollout engine), into fresh temporary run directories. Model loading is excluded from the timing
(both policies are loaded first); everything else an episode costs (prompt formatting, generation,
verification, record writing) is included.

Defaults: 8 episodes of 2 agents x 2 turns, 128 new tokens, 4 episodes per generate call (8 prompts)
for both backends (HF decodes them as one padded batch, llama.cpp as 8 sequences of one context,
``max_batch`` = prompts per call) and 2 CPU threads for each (``--threads``). Printed per backend:
episodes/s and generated tokens/s, and the 1-minute load at the start and end of the run.

Goal: ratio >= 5. The last line is ``ratio=<llamacpp episodes/s / hf episodes/s>``.

What bounds it on a CPU: on AVX2, ggml has no batched matrix kernel for some weight types, so
batching saves per-step overhead rather than arithmetic; every debate turn re-sends the whole history
unless the KV cache is kept (``reuse_cache``); HF prefills in large matmuls, cheaply; and llama.cpp's
threads meet at a barrier after every op, so a foreign process on one core slows it down (the backend
takes the free cores by default). The current figures, with their command, date, commit and machine,
are on the documentation's Performance page (``docs/performance.md``).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from llm_marl.hardware import short_openmp_spin  # noqa: E402

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch or llama.cpp start their runtime

import torch  # noqa: E402

from llm_marl.backends import load_policy  # noqa: E402
from llm_marl.benchmark import BenchConfig, run_benchmark  # noqa: E402
from llm_marl.hardware import free_cores  # noqa: E402


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
    print(
        f"env={args.env} model={args.model} episodes={args.episodes} agents={args.num_agents} "
        f"turns={args.num_turns} max_new_tokens={args.max_new_tokens} seed={args.seed} cores={os.cpu_count()} "
        f"free_cores={free_cores()} load={os.getloadavg()[0]:.1f} "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')} "
        f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'unset')} "
        f"threads={args.threads} episodes_per_batch={args.episodes_per_batch} llamacpp_max_batch={max_batch}"
    )
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
