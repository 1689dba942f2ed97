"""Train a 2-agent debate team with MAPPO (MAPoRL) and measure it before and after on held-out tasks.

    PYTHONPATH=. python examples/mappo_debate.py --out outputs/mappo_debate

Two agents share SmolLM2-135M-Instruct (the embedded default model, fp32 through HF) with one LoRA
adapter each; the centralized critic is a third adapter on the same base with a value head. They
debate ``arithmetic_debate-v0`` (two 2-digit numbers added) for 2 turns: each answers, then reads
the other's answer and answers again. Rewards are MAPoRL's influence-aware returns (γ = 0.3) with
the persuadability and persuasion incentives (α1 = β1 = 0.2, with their correct→incorrect
penalties). Training draws tasks from the train split only; the test split is held out.

Before and after training the team plays the first ``--eval-tasks`` test tasks greedily and
``--samples`` times each at the training temperature (through
:func:`trainers.common.experiment.train_and_compare`, shared with ``examples/magrpo_debate.py``).
Accuracy is the **mean over agents** of the last turn's correctness per task (the majority vote is
reported beside it as ``team_answer_accuracy``); differences are paired by task with a 95%
bootstrap over tasks.

Writes to ``--out``: ``results.json`` (``final_turn_accuracy`` before/after/paired difference for
the sampled setting, ``greedy`` and ``sampled`` blocks with per-turn accuracy and transitions incl.
the I→C rate change, the checkpoint path, the training history), ``learning_curve.png``,
``metrics.jsonl`` / TensorBoard logs (train accuracy, KL, entropy, response length, grad norm per
step), one ``report.html`` per evaluation, and the checkpoint (``llm-marl bench arithmetic_debate-v0
--checkpoint OUT`` replays it).

The measured run and what it shows are in the README ("Training results").
"""
from __future__ import annotations

import argparse

import torch

import llm_marl_envs
from llm_marl.models import load
from llm_marl.team import Team
from trainers.common.experiment import train_and_compare
from trainers.mappo import MAPPOConfig, MAPPOTrainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="arithmetic_debate-v0", help="debate env id")
    parser.add_argument("--num-turns", type=int, default=2, help="debate turns")
    parser.add_argument("--steps", type=int, default=16, help="MAPPO steps")
    parser.add_argument("--episodes-per-step", type=int, default=6, help="debates collected per step")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="actor LoRA AdamW learning rate")
    parser.add_argument("--critic-learning-rate", type=float, default=1e-4, help="critic AdamW learning rate")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of training "
                        "(and of the sampled evaluation)")
    parser.add_argument("--max-new-tokens", type=int, default=40, help="tokens per answer")
    parser.add_argument("--kl-coef", type=float, default=0.02, help="KL penalty to the base model")
    parser.add_argument("--eval-tasks", type=int, default=30, help="held-out test tasks evaluated before and after")
    parser.add_argument("--samples", type=int, default=4, help="sampled plays per held-out task")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", default="outputs/mappo_debate", help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    model, tokenizer = load("smollm2-135m")
    team = Team.shared_lora(model, tokenizer, agents=2, name="smollm2-135m")
    env = llm_marl_envs.make(args.env, num_agents=2, num_turns=args.num_turns, split="train")
    eval_env = llm_marl_envs.make(args.env, num_agents=2, num_turns=args.num_turns, split="test")
    config = MAPPOConfig(
        max_steps=args.steps, episodes_per_step=args.episodes_per_step, max_new_tokens=args.max_new_tokens,
        ppo_epochs=1, minibatch_size=8, learning_rate=args.learning_rate,
        critic_learning_rate=args.critic_learning_rate, kl_coef=args.kl_coef, temperature=args.temperature,
        reward_gamma=0.3, alpha1=0.2, beta1=0.2, eval_tasks=args.eval_tasks, output_dir=args.out,
        seed=args.seed, save_every=8)
    trainer = MAPPOTrainer(env, team, config, eval_env=eval_env)
    train_and_compare(trainer, args.out, eval_tasks=args.eval_tasks, samples=args.samples,
                      temperature=args.temperature, env_id=args.env, reward_key="train_accuracy")


if __name__ == "__main__":
    main()
