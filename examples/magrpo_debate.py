"""Train a 2-agent debate team with MAGRPO and measure it before and after on held-out tasks.

    PYTHONPATH=. python examples/magrpo_debate.py --out outputs/magrpo_debate

Two agents share SmolLM2-135M-Instruct (the embedded default model, fp32 through HF) with one LoRA
adapter each and debate ``arithmetic_debate-v0`` (two 2-digit numbers added) for 2 turns: each
answers, then reads the other's answer and answers again. Training draws tasks from the train
split only; the test split is held out. MAGRPO (CoMLRL) samples G answers per agent per tree node,
pairs them (``aligned``), steps the env once per joint action and continues the tree from each
child, so turn 1 learns from turn 0's answers; the reward is the verifier's correctness of each
answer (the env's reward), averaged over the team.

Before and after training the team plays the first ``--eval-tasks`` test tasks greedily and
``--samples`` times each at the training temperature (through
:func:`trainers.common.experiment.train_and_compare`). Accuracy is the **mean over agents** of the
last turn's correctness per task (the majority vote is reported beside it as
``team_answer_accuracy``); differences are paired by task with a 95% bootstrap over tasks.

Writes to ``--out``: ``results.json`` (``final_turn_accuracy`` before/after/paired difference for the
sampled setting, ``greedy`` and ``sampled`` blocks with per-turn accuracy, transitions with their fix
and break rates and the fix rate's change, the collaboration gain (final turn − turn 0 of the same
episodes) and per seat its accuracy and whether its last answers were its own, its partner's or new; the
checkpoint path, the training history), ``learning_curve.png``,
``metrics.jsonl`` / TensorBoard logs with per-step diagnostics (reward, zero-advantage fraction,
KL, grad norm, response length), one ``report.html`` per evaluation, and the checkpoint
(``llm-marl bench arithmetic_debate-v0 --checkpoint OUT`` replays it).

``--resume OUT/checkpoints/step-N`` evaluates the untrained team, loads that checkpoint and trains on
up to ``--steps`` (a checkpoint at ``--steps`` is only evaluated): the way to re-evaluate a trained
team on more tasks. ``--samples 0`` plays greedily only, ``--no-greedy`` only the sampled plays.

Results over seeds, with the command that reproduces them: ``docs/results/magrpo_debate.md``.
"""
from __future__ import annotations

import argparse
from typing import Any

from trainers.common.experiment import (
    debate_experiment_parser,
    debate_team_and_envs,
    run_arguments,
    run_once_or_over_seeds,
    train_and_compare,
)
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

TITLE = "MAGRPO debate example: held-out gain per seed"


def main() -> None:
    parser = debate_experiment_parser(__doc__.split("\n\n")[0], out="outputs/magrpo_debate", kl_coef=0.0)
    parser.add_argument("--steps", type=int, default=24, help="MAGRPO steps")
    parser.add_argument("--prompts-per-step", type=int, default=2, help="task trees per step")
    parser.add_argument("--num-generations", type=int, default=4, help="G: samples per agent per tree node")
    parser.add_argument("--learning-rate", type=float, default=2e-4, help="LoRA AdamW learning rate")
    args = parser.parse_args()
    run_once_or_over_seeds(run, args, title=TITLE)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One training run of ``args`` (one seed): evaluate, train, evaluate again; the results dict."""
    team, env, eval_env = debate_team_and_envs(args)
    config = MAGRPOConfig(
        max_steps=args.steps, prompts_per_step=args.prompts_per_step, num_generations=args.num_generations,
        learning_rate=args.learning_rate, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
        kl_coef=args.kl_coef, eval_tasks=args.eval_tasks, output_dir=args.out, seed=args.seed,
        save_every=10, micro_batch_size=32)
    trainer = MAGRPOTrainer(env, team, config, eval_env=eval_env)
    return train_and_compare(trainer, args.out, eval_tasks=args.eval_tasks, samples=args.samples,
                             temperature=args.temperature, env_id=args.env,
                             resume=args.resume, greedy=args.greedy, reward_key="joint_reward_mean",
                             extra={"arguments": run_arguments(args)})


if __name__ == "__main__":
    main()
