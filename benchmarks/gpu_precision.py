"""MAGRPO step time in bf16 vs float32 (``mixed_precision``), same settings, on one device.

    PYTHONPATH=. python benchmarks/gpu_precision.py                       # on cuda:0, both model sizes
    PYTHONPATH=. python benchmarks/gpu_precision.py --device cpu --models tiny --steps 1

Models, both randomly initialised (no weights to download; the tokenizer is SmolLM2's):

* ``tiny``: the 2-layer, width-64 Llama of the tests (:func:`llm_marl.models.tiny_model`);
* ``smollm2-shape``: a Llama with SmolLM2-135M's configuration (30 layers, width 576), built from the
  configuration of the cached embedded model, so it does the real model's arithmetic per token. A
  random model rarely samples EOS, so every completion runs to ``--max-new-tokens`` in both precisions
  and the two runs do the same work.

Each run: 2 agents sharing the base (one LoRA adapter each), the tests' say-a-number env, 1 turn,
``--prompts`` tasks per step, G = ``--num-generations``, ``--warmup`` untimed steps then ``--steps`` timed
ones. Printed per model and precision: seconds per step, rollout seconds per step (sampling, scoring),
the rest (losses, backward, optimizer steps), completion tokens per step and the device's peak memory.
The last line is ``ratio=<float32 seconds per step / bf16 seconds per step>`` of the last model run
(above 1: bf16 is faster).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def build_model(name: str):
    """``(model, tokenizer)`` of ``name`` (see the module docstring), float32 on the CPU."""
    from transformers import AutoConfig, LlamaForCausalLM

    from llm_marl.models import DEFAULT_MODEL, load_tokenizer, resolve, tiny_model

    if name == "tiny":
        return tiny_model(seed=0)
    if name != "smollm2-shape":
        raise ValueError(f"unknown model {name!r}; use tiny or smollm2-shape")
    tokenizer = load_tokenizer(DEFAULT_MODEL)
    config = AutoConfig.from_pretrained(resolve(DEFAULT_MODEL))
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.eval()
    return model, tokenizer


def run(name: str, precision: str, args: argparse.Namespace) -> dict:
    """Train ``--warmup`` + ``--steps`` MAGRPO steps; the timed steps' medians."""
    from accelerate.state import AcceleratorState

    from llm_marl.team import Team
    from tests.toy_env import SayNumberEnv
    from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

    AcceleratorState._reset_state(reset_partial_state=True)       # a fresh accelerator for each precision
    model, tokenizer = build_model(name)
    team = Team.adapter_per_agent(model, tokenizer, 2)
    device = torch.device(args.device)
    steps = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as out:
        config = MAGRPOConfig(num_generations=args.num_generations, max_new_tokens=args.max_new_tokens,
                              prompts_per_step=args.prompts, max_steps=steps, eval_tasks=2, save_every=0,
                              output_dir=out, report_to=(), progress=False, mixed_precision=precision, seed=1,
                              agent_devices={"agent_0": str(device), "agent_1": str(device)})
        trainer = MAGRPOTrainer(SayNumberEnv(num_turns=1), team, config)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        began = time.perf_counter()
        history = trainer.train()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        total = time.perf_counter() - began
    timed = history[args.warmup:]
    step = statistics.median(r["step_s"] for r in timed)
    rollout = statistics.median(r["rollout_s"] for r in timed)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")
    return {"model": name, "precision": precision, "step_s": step, "rollout_s": rollout, "rest_s": step - rollout,
            "tokens": statistics.median(r["answer_tokens_sampled"] for r in timed), "peak_mib": peak,
            "total_s": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="tiny,smollm2-shape", help="comma-separated: tiny, smollm2-shape")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0:
        raise ValueError(f"need --steps >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
    name = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else "CPU"
    print(f"device {args.device} ({name}), torch {torch.__version__}; {args.prompts} prompts x G={args.num_generations}"
          f" x 2 agents x {args.max_new_tokens} tokens; {args.warmup} warm-up + {args.steps} timed steps")
    print(f"{'model':<14} {'precision':<9} {'step s':>8} {'rollout s':>10} {'rest s':>8} {'tokens':>7} {'peak MiB':>9}")
    run("tiny", "no", argparse.Namespace(**{**vars(args), "warmup": 0, "steps": 1}))   # the process's one-time costs
    ratio = None
    for model in args.models.split(","):
        rows = {}
        for precision in ("no", "bf16"):
            row = rows[precision] = run(model, precision, args)
            print(f"{model:<14} {'fp32' if precision == 'no' else precision:<9} {row['step_s']:>8.3f} "
                  f"{row['rollout_s']:>10.3f} {row['rest_s']:>8.3f} {row['tokens']:>7.0f} {row['peak_mib']:>9.0f}",
                  flush=True)
        ratio = rows["no"]["step_s"] / rows["bf16"]["step_s"]
        rest = rows["no"]["rest_s"] / max(rows["bf16"]["rest_s"], 1e-9)
        print(f"{model}: fp32/bf16 seconds per step {ratio:.2f} (rollout "
              f"{rows['no']['rollout_s'] / rows['bf16']['rollout_s']:.2f}, losses and updates {rest:.2f})")
    print(f"ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
