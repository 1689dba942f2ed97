"""MAGRPO training steps per second with 1 vs 2 processes (``accelerate launch``), same settings, on this machine.

    python benchmarks/ddp_scaling.py                                  # SmolLM2-135M
    python benchmarks/ddp_scaling.py --model tiny --steps 4           # a 2-layer random model, quick
    python benchmarks/ddp_scaling.py --fsdp                           # 2 processes sharding the team (FSDP2)
    python benchmarks/ddp_scaling.py --fsdp --full-finetune           # ... each agent a whole model, all trained

Both runs train the same team (2 agents sharing one base, one LoRA adapter each) on the same env with
the same GLOBAL batch (``prompts_per_step`` tasks per step, split between the processes), so a step
does the same work either way; the 2-process run splits it and all-reduces each agent's gradients
(:mod:`trainers.common.distributed`). The cores are shared out: 1 process x C threads vs 2 processes x
C/2 threads. Model loading and ``--warmup`` steps are not timed; everything else a step costs
(rollouts, losses, gradient all-reduce, logging) is. Defaults: SmolLM2-135M, 2 agents x 1 turn of
arithmetic debate, 4 tasks per step, G=4, 32 new tokens, 3 timed steps after 1 warm-up step.

Printed per run: steps/s, seconds for the timed steps, rollout seconds per step and tokens/s, and
with ``--fsdp`` the peak RSS of each process (the main one also writes the final checkpoint of whole
tensors).

Two processes on two cores cannot add compute that one process with two threads does not already
have: the run-to-run difference is small and depends on other jobs on the machine. The speed-up this
code path is for comes from more devices (one process per GPU). The last line is
``ratio=<2-process steps/s / 1-process steps/s>``; the current figures, with their command, date,
commit and machine, are on the documentation's Performance page (``docs/performance.md``).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from llm_marl.hardware import short_openmp_spin  # noqa: E402

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch or llama.cpp start their runtime

from trainers.common.distributed import local_launch_command  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run_launch(num_processes: int, threads: int, args: argparse.Namespace, out: Path) -> dict:
    """``accelerate launch`` this script in worker mode on ``num_processes`` processes; returns the main's report."""
    command = local_launch_command(
        num_processes, __file__, "--worker", str(out),
        "--model", args.model, "--env", args.env, "--steps", str(args.steps), "--warmup", str(args.warmup),
        "--prompts-per-step", str(args.prompts_per_step), "--num-generations", str(args.num_generations),
        "--max-new-tokens", str(args.max_new_tokens), "--num-turns", str(args.num_turns), "--seed", str(args.seed),
        *(["--fsdp"] if args.fsdp else []), *(["--full-finetune"] if args.full_finetune else []))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{num_processes}-process run failed:\n{done.stderr[-4000:]}")
    return json.loads((out / "report.json").read_text())


def worker(args: argparse.Namespace) -> None:
    """One process of a launch: build the trainer, train ``warmup`` steps, then time ``steps`` more."""
    import torch

    import llm_marl_envs
    from llm_marl.models import load, tiny_model
    from llm_marl.team import Team
    from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(args.seed)
    def build():
        return tiny_model(seed=0) if args.model == "tiny" else load(args.model)

    team = Team.separate([build(), build()]) if args.full_finetune else Team.adapter_per_agent(*build(), 2)
    env = llm_marl_envs.make(args.env, num_agents=2, num_turns=args.num_turns, split="train")
    out = Path(args.worker)
    config = MAGRPOConfig(num_generations=args.num_generations, max_new_tokens=args.max_new_tokens,
                          prompts_per_step=args.prompts_per_step, micro_batch_size=16, max_steps=max(1, args.warmup),
                          learning_rate=1e-5, eval_tasks=4, output_dir=str(out / "run"), report_to=("jsonl",),
                          progress=False, seed=args.seed, fsdp=args.fsdp)
    trainer = MAGRPOTrainer(env, team, config)
    if args.warmup:
        trainer.train()                               # warm-up: first-call overheads, caches
    trainer.config.max_steps = args.warmup + args.steps
    trainer.distributed.barrier()
    started = time.perf_counter()
    history = trainer.train()
    trainer.distributed.barrier()
    elapsed = time.perf_counter() - started
    peaks_mib = trainer.distributed.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)   # Linux: KiB
    if trainer.distributed.is_main:
        report = {"num_processes": trainer.distributed.num_processes, "threads": torch.get_num_threads(),
                  "steps": args.steps,
                  "seconds": elapsed, "steps_per_s": args.steps / elapsed,
                  "rollout_s": sum(h["rollout_s"] for h in history) / len(history),
                  "tokens_per_s": sum(h["tokens_per_s"] for h in history) / len(history), "peak_rss_mib": peaks_mib,
                  "sharded": trainer.distributed.sharded}
        (out / "report.json").write_text(json.dumps(report))


def main() -> None:
    """Time 1 and 2 processes and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="smollm2-135m", help="embedded name, local HF dir, or 'tiny' (random 2-layer)"
    )
    parser.add_argument("--env", default="arithmetic_debate-v0")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument(
        "--prompts-per-step", type=int, default=4, help="GLOBAL tasks per step (split between processes)"
    )
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--num-turns", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fsdp", action="store_true",
                        help="shard the 2-process run's weights, gradients and optimizer states (FSDP2)")
    parser.add_argument("--full-finetune", action="store_true",
                        help="one full model per agent, all weights trained (default: a shared base, one LoRA each)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps must be >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
    if args.worker is not None:
        worker(args)
        return
    cores = os.cpu_count() or 1
    if args.model != "tiny":
        from llm_marl.models import resolve

        resolve(args.model)  # convert/cache the embedded model once, before the launches
    print(
        f"model={args.model} {'full fine-tune' if args.full_finetune else 'LoRA'} env={args.env} agents=2 "
        f"turns={args.num_turns} prompts_per_step={args.prompts_per_step} "
        f"G={args.num_generations} max_new_tokens={args.max_new_tokens} steps={args.steps}+{args.warmup} warm-up "
        f"cores={cores} load={os.getloadavg()[0]:.1f} OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')} "
        f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'unset')}",
        flush=True,
    )
    results = {}
    for num_processes in (1, 2):
        threads = max(1, cores // num_processes)
        with tempfile.TemporaryDirectory() as out:
            report = run_launch(num_processes, threads, args, Path(out))
        results[num_processes] = report
        print(f"{num_processes} process(es) x {report['threads']} thread(s): {report['steps_per_s']:.4f} steps/s "
              f"({report['seconds']:.1f} s for {report['steps']} steps; rollout {report['rollout_s']:.1f} s/step, "
              f"{report['tokens_per_s']:.0f} tok/s; peak RSS {'/'.join(f'{m:.0f}' for m in report['peak_rss_mib'])} MiB"
              f"{', sharded (FSDP2)' if report['sharded'] else ''})", flush=True)
    print(f"ratio={results[2]['steps_per_s'] / results[1]['steps_per_s']:.3f}")


if __name__ == "__main__":
    main()
