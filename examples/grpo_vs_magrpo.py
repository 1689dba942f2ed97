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
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from llm_marl.hardware import short_openmp_spin  # noqa: E402

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch or llama.cpp start their runtime

import torch  # noqa: E402
from trl import GRPOConfig  # noqa: E402

import llm_marl_envs  # noqa: E402
from llm_marl.models import load, tiny_model  # noqa: E402
from llm_marl.policy import SamplingParams  # noqa: E402
from llm_marl.team import Team, default_lora_config  # noqa: E402
from llm_marl_envs.metrics import paired_difference  # noqa: E402
from trainers.common.evaluation import EvalResult  # noqa: E402
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from trainers.trl_bridge import evaluate_shared_policy, make_grpo_trainer  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="arithmetic_debate-v0", help="registered env id")
    parser.add_argument("--model", default="smollm2-135m", help="base model (embedded name or local HF directory)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model (smoke test; learns nothing)")
    parser.add_argument("--num-agents", type=int, default=2)
    parser.add_argument("--num-turns", type=int, default=1)
    parser.add_argument("--generations", type=int, default=4, help="MAGRPO's G per agent per node")
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--eval-tasks", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/grpo_vs_magrpo")
    args = parser.parse_args()
    out = Path(args.out)
    shape = {"num_agents": args.num_agents, "num_turns": args.num_turns}
    train_env = llm_marl_envs.make(args.env, split="train", **shape)
    eval_env = llm_marl_envs.make(args.env, split="test", **shape)
    n, t, g = args.num_agents, args.num_turns, args.generations
    eval_tasks, eval_seeds = list(range(args.eval_tasks)), [args.seed + i for i in range(args.eval_tasks)]
    greedy = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)

    # MAGRPO: one frozen base, one LoRA adapter per agent
    model, tokenizer = model_copy(args)
    team = Team.shared_lora(model, tokenizer, train_env.possible_agents, name=args.model)
    config = MAGRPOConfig(num_generations=g, prompts_per_step=args.prompts_per_step, max_steps=args.steps,
                          learning_rate=args.learning_rate, max_new_tokens=args.max_new_tokens, seed=args.seed,
                          eval_tasks=args.eval_tasks, output_dir=str(out / "magrpo"), report_to=["jsonl"])
    magrpo = MAGRPOTrainer(train_env, team, config, eval_env=eval_env)
    untrained = magrpo.evaluate()                           # adapters start at zero: the base model in every seat
    untrained.write_report(out / "untrained" / "report.html", title=f"untrained: {args.env}")
    began = time.perf_counter()
    magrpo.train()
    magrpo_seconds = time.perf_counter() - began
    magrpo_result = magrpo.evaluate()
    magrpo_result.write_report(out / "magrpo" / "report.html", title=f"MAGRPO: {args.env}")
    magrpo_samples = args.prompts_per_step * n * sum(g ** k for k in range(1, t + 1))

    # TRL: one shared LoRA policy in every seat
    episodes_per_task = math.ceil(sum(g ** k for k in range(1, t + 1)) / t)
    rows = episodes_per_task * n * t
    grpo_args = GRPOConfig(output_dir=str(out / "trl_shared"), num_generations=rows,
                           per_device_train_batch_size=args.prompts_per_step * rows, max_steps=args.steps,
                           learning_rate=args.learning_rate, max_completion_length=args.max_new_tokens,
                           temperature=config.temperature, top_p=config.top_p, beta=0.0, scale_rewards="none",
                           report_to="none", save_strategy="no", logging_steps=1, seed=args.seed, bf16=False,
                           use_cpu=not torch.cuda.is_available())
    model, tokenizer = model_copy(args)
    trl_trainer = make_grpo_trainer(train_env, model, tokenizer, grpo_args, peft_config=default_lora_config())
    began = time.perf_counter()
    trl_trainer.train()
    trl_seconds = time.perf_counter() - began
    trl_result = evaluate_shared_policy(trl_trainer, eval_env, eval_tasks, eval_seeds, greedy,
                                        report_path=out / "trl_shared" / "report.html")

    results = {
        "env": args.env, "model": "tiny" if args.tiny else args.model, "agents": n, "turns": t, "steps": args.steps,
        "completions_per_step": {"magrpo": magrpo_samples, "trl_shared": args.prompts_per_step * rows},
        "held_out_tasks": args.eval_tasks,
        "untrained": summary(untrained), "magrpo": summary(magrpo_result, magrpo_seconds),
        "trl_shared": summary(trl_result, trl_seconds),
        "magrpo_minus_trl_team_reward": paired_difference(magrpo_result.rewards, trl_result.rewards, seed=args.seed),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"{args.env}: {n} agents x {t} turns, {args.steps} steps, completions/step MAGRPO "
          f"{magrpo_samples} vs TRL {args.prompts_per_step * rows}; held-out ({args.eval_tasks} tasks, greedy):")
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


if __name__ == "__main__":
    main()
