"""Train a 2-agent debate team with MAPPO (MAPoRL) and measure it before and after on held-out tasks.

    PYTHONPATH=. python examples/mappo_debate.py --out outputs/mappo_debate

Two agents share SmolLM2-135M-Instruct (the embedded default model, fp32 through HF) with one LoRA
adapter each; the centralized critic is a third adapter on the same base with a value head. They
debate ``arithmetic_debate-v0`` (two 2-digit numbers added) for 2 turns: each answers, then reads
the other's answer and answers again. Each of an agent's turns is paid the agent's own score at the
debate's last turn (``--reward-rule last_turn``), plus MAPoRL's persuadability and persuasion
incentives (α1 = β1 = 0.2, with their correct→incorrect penalties). ``--reward-rule influence_aware``
pays MAPoRL's influence-aware returns (γ = 0.3; :class:`~trainers.mappo.MAPPOConfig`'s default)
instead. Training draws tasks from the train split only; the test split is held out.

The defaults (10 debates = 40 answers a step, 20 steps, learning rate 2e-4, no KL penalty, PPO
minibatches of 16 answers) are the batch and learning settings of the collaboration study's
``mappo`` arm, which keeps the influence-aware returns. A critic fitted on few answers a step gives
noisy advantages: at 6 debates a step many steps see no right answer at all, and whether the team
improves then depends on the draw.

The run's ``MAPPOConfig`` is the recipe ``examples/configs/mappo_debate.yaml``; every config field
is also a flag (``--reward-rule influence_aware``; ``--steps`` and ``--out`` name ``max_steps`` and
``output_dir``), and ``--config FILE.yaml`` reads another recipe. ``--help`` lists them all.

Before and after training the team plays the first ``--eval-tasks`` test tasks greedily and
``--samples`` times each at the training temperature (through
:func:`trainers.common.experiment.train_and_compare`, shared with ``examples/magrpo_debate.py``).
Accuracy is the **mean over agents** of the last turn's correctness per task (the majority vote is
reported beside it as ``team_answer_accuracy``); differences are paired by task with a 95%
bootstrap over tasks.

Writes to ``--out``: ``results.json`` (``final_turn_accuracy`` before/after/paired difference for the
sampled setting, ``greedy`` and ``sampled`` blocks with per-turn accuracy, transitions with their fix
and break rates and the fix rate's change, the collaboration gain (final turn − turn 0 of the same
episodes) and per seat its accuracy and whether its last answers were its own, its partner's or new; the
checkpoint path, the training history), ``learning_curve.png``,
``metrics.jsonl`` / TensorBoard logs (train accuracy, KL, entropy, response length, grad norm per
step), one ``report.html`` per evaluation, and the checkpoint (``llm-marl bench arithmetic_debate-v0
--checkpoint OUT`` replays it).

The same command run again on an ``--out`` that holds its run continues it: a finished run is
reported, not trained again; an interrupted one resumes from its newest checkpoint (the interrupt
prints the command) and ends as an uninterrupted run would. Another config on that ``--out`` is
refused, naming the fields that differ; ``--overwrite`` deletes the run and starts over.
``--resume OUT/checkpoints/step-N`` evaluates the untrained team, loads that checkpoint and trains on
up to ``--steps`` (a checkpoint at ``--steps`` is only evaluated): the way to re-evaluate a trained
team on more tasks. ``--samples 0`` plays greedily only, ``--no-greedy`` only the sampled plays.

Results over seeds, with the command that reproduces them: ``docs/results/mappo_debate.md``.
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
from trainers.mappo import MAPPOConfig, MAPPOTrainer

TITLE = "MAPPO debate example: held-out gain per seed"
RECIPE = Path(__file__).resolve().parent / "configs" / "mappo_debate.yaml"


def parse_args(argv: list[str] | None = None) -> tuple[MAPPOConfig, argparse.Namespace]:
    """The run's config (the recipe, then the flags) and the example's own flags."""
    return parse_config(debate_experiment_parser(__doc__.split("\n\n")[0], MAPPOConfig, RECIPE), MAPPOConfig, argv)


def main(argv: list[str] | None = None) -> None:
    config, args = parse_args(argv)
    run_once_or_over_seeds(run, config, args, title=TITLE, script=__file__, argv=argv)


def run(config: MAPPOConfig, args: argparse.Namespace) -> dict[str, Any]:
    """One training run (one seed): evaluate, train, evaluate again; the results dict."""
    team, env, eval_env = debate_team_and_envs(config, args)
    trainer = MAPPOTrainer(env, team, config, eval_env=eval_env)
    return train_and_compare(trainer, config.output_dir, eval_tasks=config.eval_tasks, samples=args.samples,
                             temperature=config.temperature, env_id=args.env,
                             resume=args.resume, greedy=args.greedy, reward_key="train_accuracy",
                             extra={"arguments": run_arguments(config, args)})


if __name__ == "__main__":
    main()
