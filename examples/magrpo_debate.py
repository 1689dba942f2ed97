"""Train a 2-agent debate team with MAGRPO and measure it before and after on held-out tasks.

    PYTHONPATH=. python examples/magrpo_debate.py --out outputs/magrpo_debate

Two agents share SmolLM2-135M-Instruct (the embedded default model, fp32 through HF) with one LoRA
adapter each and debate ``arithmetic_debate-v0`` (two 2-digit numbers added) for 2 turns: each
answers, then reads the other's answer and answers again. Training draws tasks from the train
split only; the test split is held out. MAGRPO (CoMLRL) samples G answers per agent per tree node,
pairs them (``aligned``), steps the env once per joint action and continues the tree from each
child, so turn 1 learns from turn 0's answers; the reward is the verifier's correctness of each
answer (the env's reward), averaged over the team.

The run's ``MAGRPOConfig`` is the recipe ``examples/configs/magrpo_debate.yaml``; every config field
is also a flag (``--learning-rate 1e-4``; ``--steps`` and ``--out`` name ``max_steps`` and
``output_dir``), and ``--config FILE.yaml`` reads another recipe. ``--help`` lists them all.

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

The same command run again on an ``--out`` that holds its run continues it: a finished run is
reported, not trained again; an interrupted one resumes from its newest checkpoint (the interrupt
prints the command) and ends as an uninterrupted run would. Another config on that ``--out`` is
refused, naming the fields that differ; ``--overwrite`` deletes the run and starts over.
``--resume OUT/checkpoints/step-N`` evaluates the untrained team, loads that checkpoint and trains on
up to ``--steps`` (a checkpoint at ``--steps`` is only evaluated): the way to re-evaluate a trained
team on more tasks. ``--samples 0`` plays greedily only, ``--no-greedy`` only the sampled plays.

Results over seeds, with the command that reproduces them: ``docs/results/magrpo_debate.md``.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from trainers.common.arguments import parse_config
from trainers.common.experiment import (
    debate_experiment_parser,
    debate_team_and_envs,
    run_arguments,
    run_once_or_over_seeds,
    train_and_compare,
)
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

TITLE = "MAGRPO debate example: held-out gain per seed"
RECIPE = Path(__file__).resolve().parent / "configs" / "magrpo_debate.yaml"


def parse_args(argv: list[str] | None = None) -> tuple[MAGRPOConfig, argparse.Namespace]:
    """The run's config (the recipe, then the flags) and the example's own flags."""
    return parse_config(debate_experiment_parser(__doc__.split("\n\n")[0], MAGRPOConfig, RECIPE), MAGRPOConfig, argv)


def main(argv: list[str] | None = None) -> None:
    config, args = parse_args(argv)
    run_once_or_over_seeds(run, config, args, title=TITLE, script=__file__, argv=argv)


def run(config: MAGRPOConfig, args: argparse.Namespace) -> dict[str, Any]:
    """One training run (one seed): evaluate, train, evaluate again; the results dict."""
    team, env, eval_env = debate_team_and_envs(config, args)
    trainer = MAGRPOTrainer(env, team, config, eval_env=eval_env)
    return train_and_compare(trainer, config.output_dir, eval_tasks=config.eval_tasks, samples=args.samples,
                             temperature=config.temperature, env_id=args.env,
                             resume=args.resume, greedy=args.greedy, reward_key="joint_reward_mean",
                             extra={"arguments": run_arguments(config, args)})


if __name__ == "__main__":
    main()
