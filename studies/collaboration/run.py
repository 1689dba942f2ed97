"""Compute-matched collaboration study: untrained, solo, shared, MAGRPO, MAPPO and counterfactual-credit teams.

Run from the repository root::

    python -m studies.collaboration.run --out outputs/collaboration_study
    # one arm at a time on one thread:
    python -m studies.collaboration.run --jobs 1 --threads 1 --out outputs/collaboration_study
    # smoke test with any local HF model directory:
    python -m studies.collaboration.run --model DIR --steps 1 --eval-tasks 4 --hard-tasks 4 --out smoke
    # the headline comparison on three seeds (greedy only), with the spread in OUT/seeds.json:
    python -m studies.collaboration.run --arms solo,magrpo_final_turn --evaluate greedy \
        --seeds 0,1,2 --out outputs/collaboration_seeds

Every trained arm samples the same number of completions per training step from the same base model,
seed, learning rate, steps and sampling settings (how each arm is matched is printed first, and the
completions and answer tokens each arm actually sampled are in ``results.json``). Each arm is then
played on the same held-out tasks: greedy and sampled debates, a majority vote at the debate's token
budget, and a harder set no arm trained on. See :mod:`studies.collaboration.study` for the arms and
every reported number.

Writes to ``--out``: ``results.json``, ``summary.png`` (arms side by side, turn 0 against the final
turn with 95% CIs), and per arm ``arms/<arm>/<setting>/report.html`` and the seated team checkpoint
``arms/<arm>/team`` (``llm-marl bench arithmetic_debate-v0 --checkpoint OUT/arms/magrpo/team`` replays
it). An interrupted study run again with the same ``--out`` and settings reuses the finished arms.
"""
from __future__ import annotations

import argparse
import os

from llm_marl.hardware import short_openmp_spin

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch starts its runtime

from studies.arms import ArmsFailed  # noqa: E402
from studies.collaboration.study import (  # noqa: E402
    ARMS,
    LEVER_ARMS,
    SETTINGS,
    StudyConfig,
    run_seeds,
    run_study,
)


def main() -> None:
    defaults = StudyConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/collaboration_study", help="output directory (resumable)")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"comma-separated arms, from {','.join(ARMS)} and the levers {','.join(LEVER_ARMS)}")
    parser.add_argument("--steps", type=int, default=defaults.steps, help="training steps of every arm")
    parser.add_argument("--num-generations", type=int, default=defaults.num_generations,
                        help="G of MAGRPO; every arm samples C = P·N·(G+…+G^T) completions per step")
    parser.add_argument("--prompts-per-step", type=int, default=defaults.prompts_per_step, help="P of MAGRPO")
    parser.add_argument("--counterfactual-samples", type=int, default=defaults.counterfactual_samples,
                        help="K: alternatives replayed per message by the counterfactual arm")
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--kl-coef", type=float, default=defaults.kl_coef,
                        help="weight of every arm's KL to the base model (0: none)")
    parser.add_argument("--temperature", type=float, default=defaults.temperature,
                        help="sampling temperature of training, of the sampled evaluation and of the vote")
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens, help="tokens per answer")
    parser.add_argument("--eval-tasks", type=int, default=defaults.eval_tasks, help="held-out test tasks")
    parser.add_argument("--samples", type=int, default=defaults.samples, help="sampled plays per held-out task")
    parser.add_argument("--hard-tasks", type=int, default=defaults.hard_tasks,
                        help="held-out tasks of the harder set (three 2-digit numbers added)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--seeds", default=None,
                        help="comma-separated seeds: the study once per seed in OUT/seed-<s>, and the spread over "
                             "seeds in OUT/seeds.json and OUT/seeds.png (overrides --seed)")
    parser.add_argument("--evaluate", default=",".join(SETTINGS),
                        help=f"held-out settings played per arm, from {','.join(SETTINGS)} (greedy is required)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="arms trained at once, each in its own process (default: one per CPU core, at most the "
                             "number of arms)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of each job (default: the cores divided among the jobs)")
    parser.add_argument("--model", default=defaults.model, help="base model: the embedded name or a local HF directory")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    config = StudyConfig(arms=tuple(a.strip() for a in args.arms.split(",") if a.strip()), steps=args.steps,
                         num_generations=args.num_generations, prompts_per_step=args.prompts_per_step,
                         counterfactual_samples=args.counterfactual_samples, learning_rate=args.learning_rate,
                         kl_coef=args.kl_coef, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                         eval_tasks=args.eval_tasks, samples=args.samples, hard_tasks=args.hard_tasks,
                         seed=args.seed, model=args.model,
                         evaluate=tuple(s.strip() for s in args.evaluate.split(",") if s.strip()))
    jobs = args.jobs or max(1, min(cores, len(config.arms)))
    threads = args.threads or max(1, cores // jobs)
    import torch

    torch.set_num_threads(threads)
    try:
        if args.seeds:
            seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
            run_seeds(config, args.out, seeds, jobs=jobs, threads_per_job=threads)
        else:
            run_study(config, args.out, jobs=jobs, threads_per_job=threads)
    except ArmsFailed as error:            # a worker died (killed for memory, say): which arms, and how to resume
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
