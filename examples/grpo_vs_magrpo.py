"""Parameter sharing (TRL's GRPOTrainer, one policy in every seat) against MAGRPO (one LoRA adapter per agent).

    PYTHONPATH=. python examples/grpo_vs_magrpo.py --env arithmetic_debate-v0 --steps 30 --out outputs/grpo_vs_magrpo
    PYTHONPATH=. python examples/grpo_vs_magrpo.py --tiny --steps 1 --eval-tasks 4 --out outputs/smoke   # smoke test

Both start from the same base model with LoRA rank 8, train for the same number of steps on the
env's train split at the same learning rate and sampling settings, with the same number of
sampled completions per step (MAGRPO, aligned joint actions: ``N·(G + G² + … + G^T)`` per task;
TRL: ``E`` whole episodes per task, ``N·T`` rows each, ``E = ceil((G + … + G^T) / T)``, so equal
for one turn), and are evaluated greedily on the same held-out tasks (the test split). Neither
uses a KL term or std-normalised advantages. Writes ``results.json`` and one ``report.html`` per
evaluation (``untrained/``, ``magrpo/``, ``trl_shared/``).

The MAGRPO run's ``MAGRPOConfig`` is the recipe ``examples/configs/grpo_vs_magrpo.yaml`` (TRL's
``GRPOConfig`` takes its steps, learning rate, tokens, sampling, seed and prompts per step); every
config field is also a flag (``--steps`` names ``max_steps``), and ``--config FILE.yaml`` reads
another recipe. ``--help`` lists them all. The same command on an ``--out`` that holds its finished run
reports it; a run there of another config, or an interrupted one (the script trains in one go and does not
resume), is refused with the commands to choose from; ``--overwrite`` deletes it and starts over.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

from llm_marl.hardware import short_openmp_spin  # noqa: E402

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch or llama.cpp start their runtime

import torch  # noqa: E402
from trl import GRPOConfig  # noqa: E402

import llm_marl_envs  # noqa: E402
from llm_marl.files import write_text_atomically  # noqa: E402
from llm_marl.models import load, tiny_model  # noqa: E402
from llm_marl.policy import SamplingParams  # noqa: E402
from llm_marl.team import Team, default_lora_config  # noqa: E402
from llm_marl_envs.metrics import paired_difference  # noqa: E402
from trainers.common.arguments import config_parser, parse_config  # noqa: E402
from trainers.common.evaluation import EvalResult  # noqa: E402
from trainers.common.experiment import RESULTS_FILE, run_arguments, run_from_start  # noqa: E402
from trainers.common.run_dir import RUN_FILE  # noqa: E402
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from trainers.trl_bridge import evaluate_shared_policy, make_grpo_trainer  # noqa: E402

RECIPE = Path(__file__).resolve().parent / "configs" / "grpo_vs_magrpo.yaml"
OUTPUTS = (RUN_FILE, RESULTS_FILE, "magrpo", "trl_shared", "untrained")   # what --overwrite deletes


def model_copy(args: argparse.Namespace):
    """A fresh ``(model, tokenizer)``: the embedded/local model, or a tiny random one for smoke tests."""
    return tiny_model(seed=0) if args.tiny else load(args.model)


def summary(result: EvalResult, seconds: float | None = None) -> dict:
    """Held-out team reward and final-turn accuracy with their 95% CIs."""
    out = {"team_reward": result.team_reward, "team_reward_ci": list(result.team_reward_ci)}
    if result.accuracy_per_turn is not None:
        out.update(final_accuracy=result.accuracy_per_turn[-1], final_accuracy_ci=list(result.accuracy_per_turn_ci[-1]))
    if seconds is not None:
        out["train_seconds"] = round(seconds, 1)
    return out


def parse_args(argv: list[str] | None = None) -> tuple[MAGRPOConfig, argparse.Namespace]:
    """The MAGRPO run's config (the recipe, then the flags; it writes to OUT/magrpo) and the script's own flags."""
    parser = config_parser(MAGRPOConfig, __doc__.split("\n\n")[0], recipe=RECIPE,
                           flags={"max_steps": ["--max-steps", "--steps"]}, exclude=["output_dir"])
    parser.add_argument("--env", default="arithmetic_debate-v0", help="registered env id (default: %(default)s)")
    parser.add_argument("--model", default="smollm2-135m", help="base model (embedded name or local HF directory)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model (smoke test; learns nothing)")
    parser.add_argument("--num-agents", type=int, default=2, help="agents (default: %(default)s)")
    parser.add_argument("--num-turns", type=int, default=1, help="turns (default: %(default)s)")
    parser.add_argument("--out", default="outputs/grpo_vs_magrpo", help="output directory (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete the run already in --out and start over; without it, the same command on a "
                             "finished run reports it and --out holding any other run is refused")
    config, args = parse_config(parser, MAGRPOConfig, argv)
    return dataclasses.replace(config, output_dir=str(Path(args.out) / "magrpo")), args


def main(argv: list[str] | None = None) -> dict:
    """Train and judge both; a finished run on ``--out`` is reported, another run there refused (``--overwrite``
    starts over)."""
    config, args = parse_args(argv)
    return run_from_start(lambda: compare_runs(config, args), args.out, config, args, outputs=OUTPUTS,
                          script=__file__, argv=argv)


def compare_runs(config: MAGRPOConfig, args: argparse.Namespace) -> dict:
    """MAGRPO, then TRL's shared policy, on the same held-out tasks; the results dict (also in OUT/results.json)."""
    arguments = run_arguments(config, args)
    out = Path(args.out)
    shape = {"num_agents": args.num_agents, "num_turns": args.num_turns}
    train_env = llm_marl_envs.make(args.env, split="train", **shape)
    eval_env = llm_marl_envs.make(args.env, split="test", **shape)
    n, t, g = args.num_agents, args.num_turns, config.num_generations
    eval_tasks, eval_seeds = list(range(config.eval_tasks)), [config.seed + i for i in range(config.eval_tasks)]
    greedy = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=0.0)

    # MAGRPO: one frozen base, one LoRA adapter per agent
    model, tokenizer = model_copy(args)
    team = Team.adapter_per_agent(model, tokenizer, train_env.possible_agents, name=args.model)
    magrpo = MAGRPOTrainer(train_env, team, config, eval_env=eval_env)
    untrained = magrpo.evaluate()                           # adapters start at zero: the base model in every seat
    untrained.write_report(out / "untrained" / "report.html", title=f"untrained: {args.env}")
    began = time.perf_counter()
    magrpo.train()
    magrpo_seconds = time.perf_counter() - began
    magrpo_result = magrpo.evaluate()
    magrpo_result.write_report(out / "magrpo" / "report.html", title=f"MAGRPO: {args.env}")
    magrpo_samples = config.prompts_per_step * n * sum(g ** k for k in range(1, t + 1))

    # TRL: one shared LoRA policy in every seat
    episodes_per_task = math.ceil(sum(g ** k for k in range(1, t + 1)) / t)
    rows = episodes_per_task * n * t
    grpo_args = GRPOConfig(output_dir=str(out / "trl_shared"), num_generations=rows,
                           per_device_train_batch_size=config.prompts_per_step * rows, max_steps=config.max_steps,
                           learning_rate=config.learning_rate, max_completion_length=config.max_new_tokens,
                           temperature=config.temperature, top_p=config.top_p, beta=0.0, scale_rewards="none",
                           report_to="none", save_strategy="no", logging_steps=1, seed=config.seed, bf16=False,
                           use_cpu=not torch.cuda.is_available())
    model, tokenizer = model_copy(args)
    trl_trainer = make_grpo_trainer(train_env, model, tokenizer, grpo_args, peft_config=default_lora_config())
    began = time.perf_counter()
    trl_trainer.train()
    trl_seconds = time.perf_counter() - began
    trl_result = evaluate_shared_policy(trl_trainer, eval_env, eval_tasks, eval_seeds, greedy,
                                        report_path=out / "trl_shared" / "report.html")

    results = {
        "env": args.env, "model": "tiny" if args.tiny else args.model, "agents": n, "turns": t,
        "steps": config.max_steps,
        "completions_per_step": {"magrpo": magrpo_samples, "trl_shared": config.prompts_per_step * rows},
        "held_out_tasks": config.eval_tasks,
        "untrained": summary(untrained), "magrpo": summary(magrpo_result, magrpo_seconds),
        "trl_shared": summary(trl_result, trl_seconds),
        "magrpo_minus_trl_team_reward": paired_difference(magrpo_result.rewards, trl_result.rewards, seed=config.seed),
        "arguments": arguments,
    }
    write_text_atomically(out / RESULTS_FILE, json.dumps(results, indent=2) + "\n")
    print(f"{args.env}: {n} agents x {t} turns, {config.max_steps} steps, completions/step MAGRPO "
          f"{magrpo_samples} vs TRL {config.prompts_per_step * rows}; held-out ({config.eval_tasks} tasks, greedy):")
    for name in ("untrained", "magrpo", "trl_shared"):
        r = results[name]
        accuracy = (f"  final accuracy {r['final_accuracy']:.3f} [{r['final_accuracy_ci'][0]:.3f}, "
                    f"{r['final_accuracy_ci'][1]:.3f}]" if "final_accuracy" in r else "")
        print(f"  {name:<10} team reward {r['team_reward']:.3f} [{r['team_reward_ci'][0]:.3f}, "
              f"{r['team_reward_ci'][1]:.3f}]{accuracy}" + (f"  train {r['train_seconds']} s" if "train_seconds" in r
                                                            else ""))
    d = results["magrpo_minus_trl_team_reward"]
    print(f"  MAGRPO - TRL (paired): {d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}], "
          f"better/tie/worse on {d['wins']}/{d['ties']}/{d['losses']} tasks; results in {out / 'results.json'}")
    return results


if __name__ == "__main__":
    main()
