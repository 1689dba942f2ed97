"""Episodes per second of llama.cpp with the embedded model's weights in Q4_1 (as shipped), Q8_0 and F16.

The embedded SmolLM2-135M ships as Q4_1, for which ggml has no batched matrix kernel on AVX2 CPUs: a
decode step of many sequences costs about as much arithmetic per sequence as one alone. F16 holds the
same weights (a Q4_1 value is ``scale * q + min``, exact in f16 up to the rounding of the scales) and
Q8_0 re-rounds them to 8 bits; both have batched kernels. :func:`llm_marl.models.gguf_weights`
converts them once with llama.cpp's own quantizer and caches the files.

Each weight type plays the same greedy episodes of the main job's env (``arithmetic_debate-v0``) through
the benchmark harness (:func:`llm_marl.benchmark.run_benchmark`, the shared rollout engine), in two rounds in
opposite orders (A B C, then C B A) so a drift of the machine's speed is shared; a type's figure
is its better round. Accuracy and the share of answers identical to Q4_1's are printed beside it.

    PYTHONPATH=. python benchmarks/weight_types.py

The last line is ``ratio=<fastest other type's episodes/s / Q4_1's>``.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from llm_marl.hardware import short_openmp_spin  # noqa: E402

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch or llama.cpp start their runtime

from llm_marl.backends import load_policy  # noqa: E402
from llm_marl.benchmark import EPISODES_FILE, BenchConfig, run_benchmark  # noqa: E402
from llm_marl.models import gguf_path, gguf_weights  # noqa: E402

WEIGHT_TYPES = ("q4_1", "q8_0", "f16")


def weights_file(model: str, weight_type: str) -> Path:
    """The embedded model's GGUF as shipped (``q4_1``) or converted to ``weight_type``."""
    return gguf_path(model) if weight_type == "q4_1" else gguf_weights(model, weight_type)


def play(config: BenchConfig, path: Path, threads: int, max_batch: int) -> tuple[float, float, list]:
    """``(episodes/s, last-turn accuracy, every episode's answers)`` of the greedy episodes of ``config``."""
    policy = load_policy("llamacpp", str(path), seed=config.seed, max_batch=max_batch, n_threads=threads)
    with tempfile.TemporaryDirectory() as out:
        began = time.perf_counter()
        summary = run_benchmark(config, out, policies={config.models[0]: policy}, progress=False)
        elapsed = time.perf_counter() - began
        records = [json.loads(line) for line in (Path(out) / EPISODES_FILE).read_text().splitlines() if line]
    policy.close()
    answers = [record["responses"] for record in sorted(records, key=lambda r: r["episode"])]
    return config.episodes / elapsed, summary["accuracy_per_turn"][-1]["mean"], answers


def flat_answers(episodes: list) -> list[str]:
    """Every answer of every agent and turn, in order (``responses`` is per turn, one text per agent)."""
    return [text for episode in episodes for turn in episode for text in turn]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="arithmetic_debate-v0")
    parser.add_argument("--model", default="smollm2-135m", help="an embedded model name")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--episodes-per-batch", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    paths = {w: weights_file(args.model, w) for w in WEIGHT_TYPES}       # convert before any timing
    config = BenchConfig(env_id=args.env, models=[args.model], backend="llamacpp", episodes=args.episodes,
                         seed=args.seed, max_new_tokens=args.max_new_tokens, temperature=0.0,
                         episodes_per_batch=args.episodes_per_batch, baseline="debate")
    max_batch = args.episodes_per_batch * 2
    print(f"env={args.env} model={args.model} episodes={args.episodes} greedy max_new_tokens={args.max_new_tokens} "
          f"threads={args.threads} episodes_per_batch={args.episodes_per_batch} cpus={os.cpu_count()} "
          f"load={os.getloadavg()[0]:.1f}", flush=True)
    speed: dict[str, float] = {}
    results: dict[str, tuple[float, list]] = {}
    for weight_type in list(WEIGHT_TYPES) + list(reversed(WEIGHT_TYPES)):
        eps, accuracy, answers = play(config, paths[weight_type], args.threads, max_batch)
        speed[weight_type] = max(speed.get(weight_type, 0.0), eps)
        results[weight_type] = (accuracy, answers)
        print(f"  {weight_type:5s} {eps:.3f} episodes/s  accuracy(last turn) {accuracy:.3f}  "
              f"load={os.getloadavg()[0]:.1f}", flush=True)
    reference = flat_answers(results["q4_1"][1])
    for weight_type in WEIGHT_TYPES:
        accuracy, answers = results[weight_type]
        same = sum(a == b for a, b in zip(flat_answers(answers), reference)) / max(len(reference), 1)
        size = paths[weight_type].stat().st_size / 2**20
        print(f"{weight_type:5s} {size:6.0f} MiB  {speed[weight_type]:.3f} episodes/s "
              f"({speed[weight_type] / speed['q4_1']:.2f}x q4_1)  accuracy {accuracy:.3f}  "
              f"answers identical to q4_1 {same:.0%}")
    best = max((w for w in WEIGHT_TYPES if w != "q4_1"), key=speed.get)
    print(f"fastest: {best}")
    print(f"ratio={speed[best] / speed['q4_1']:.2f}")


if __name__ == "__main__":
    main()
