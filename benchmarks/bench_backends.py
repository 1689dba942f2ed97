"""Episodes per second of the llama.cpp backend vs the HF backend, same env, model, episodes and seed.

Both runs go through the benchmark harness (:func:`llm_marl_envs.benchmark.run_benchmark`, i.e.
the shared rollout engine), into fresh temporary run directories. Model loading is excluded
from the timing (both policies are loaded first); everything else an episode costs — prompt
formatting, generation, verification, record writing — is included.

    PYTHONPATH=. python benchmarks/bench_backends.py --episodes 6

Goal: ratio >= 5. The last line is ``ratio=<llamacpp episodes/s / hf episodes/s>``.

Measured (2 cores shared with other jobs, load ~7, ``OMP_WAIT_POLICY=PASSIVE``, 4 episodes of
2 agents x 2 turns, 128 new tokens, HF batching 4 episodes = 8 prompts per call): llama.cpp
0.029 episodes/s (12 tok/s), HF 0.025 episodes/s (12 tok/s), ratio=1.17 — the goal is NOT met
against batched HF: llama.cpp is single-stream, so HF's batching wins back what llama.cpp gains
per token. Without passive waiting the spinning OpenMP workers made HF collapse (ratio=3.62).
With ``--episodes 2 --episodes-per-batch 1 --max-new-tokens 64`` (HF: 2 prompts per call, load ~6):
llama.cpp 0.045 episodes/s (12 tok/s), HF 0.022 (6 tok/s), ratio=2.08.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # both backends: no spinning OpenMP workers on a shared CPU

from llm_marl_envs.benchmark import BenchConfig, run_benchmark  # noqa: E402
from trainers.common.inference import free_cores, load_policy  # noqa: E402


def episodes_per_second(config: BenchConfig, policy) -> tuple[float, dict]:
    """Run ``config`` with a ready policy in a fresh directory; returns (episodes/s, summary)."""
    with tempfile.TemporaryDirectory() as out:
        began = time.perf_counter()
        summary = run_benchmark(config, out, policies={config.models[0]: policy}, progress=False)
        elapsed = time.perf_counter() - began
    return config.episodes / elapsed, summary


def main() -> None:
    """Time both backends and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="gsm_symbolic_debate-v0")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--num-agents", type=int, default=2)
    parser.add_argument("--num-turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--episodes-per-batch", type=int, default=6,
                        help="episodes advanced together (HF batches their prompts; llama.cpp loops)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"env={args.env} model={args.model} episodes={args.episodes} agents={args.num_agents} "
          f"turns={args.num_turns} max_new_tokens={args.max_new_tokens} seed={args.seed} cores={os.cpu_count()} "
          f"free_cores={free_cores()} load={os.getloadavg()[0]:.1f} OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    results = {}
    for backend in ("llamacpp", "hf"):
        config = BenchConfig(env_id=args.env, models=[args.model], backend=backend, episodes=args.episodes,
                             num_agents=args.num_agents, num_turns=args.num_turns, seed=args.seed,
                             max_new_tokens=args.max_new_tokens, episodes_per_batch=args.episodes_per_batch)
        policy = load_policy(backend, args.model, seed=args.seed)
        eps, summary = episodes_per_second(config, policy)
        results[backend] = eps
        tokens_per_s = summary["tokens_total"] / summary["wall_time_total_s"]
        print(f"{backend:9s} {eps:.3f} episodes/s  {tokens_per_s:.0f} tokens/s  "
              f"tokens/episode={summary['tokens_per_episode']['mean']:.0f}  "
              f"accuracy(last turn)={summary['accuracy_per_turn'][-1]['mean']:.2f}")
    print(f"load at end={os.getloadavg()[0]:.1f}")
    print(f"ratio={results['llamacpp'] / results['hf']:.2f}")


if __name__ == "__main__":
    main()
