"""Train a 2-agent debate team with MAPPO (MAPoRL) on a CPU and compare it before and after.

    PYTHONPATH=. python examples/mappo_debate.py --steps 8 --out outputs/mappo_debate

Two agents share SmolLM2-135M-Instruct (the embedded default model) with one LoRA adapter each;
the centralized critic is a third adapter on the same base with a value head. They debate for
3 turns: each sees the question, then the other agent's previous answer. Rewards are
influence-aware (γ = 0.3) with the persuadability and persuasion incentives switched on.

Env: ``arithmetic_debate-v0`` by default. ``gsm_symbolic_debate-v0`` is the harder target, but
SmolLM2-135M answers 0 of 8 of its problems greedily (measured), so a run there cannot show
anything; pass ``--env gsm_symbolic_debate-v0`` to try anyway.

Writes to ``--out``: ``results.json`` (per-turn accuracy with bootstrap 95% CIs and transition
counts, before and after), ``transitions.png`` (correctness transitions across turns, before vs
after), ``metrics.jsonl`` / TensorBoard logs and checkpoints of the run.

Measured here (2 cores shared with other jobs; greedy evaluation on test tasks 0-19, 2 agents x
3 turns, accuracy per turn with bootstrap 95% CIs over the 20 episodes):

| run | wall time | turn 0 | turn 1 | turn 2 | transitions C→C / C→I / I→C / I→I |
|---|---|---|---|---|---|
| before training | | 0.350 [0.150, 0.550] | 0.350 [0.150, 0.550] | 0.350 [0.150, 0.550] | 28 / 0 / 0 / 52 |
| after, defaults (lr 5e-5, T 0.4, 3 episodes/step, 8 steps) | 25.8 min | 0.175 [0.050, 0.325] | 0.150 [0.000, 0.300] | 0.125 [0.000, 0.275] | 10 / 3 / 1 / 66 |
| after, ``--learning-rate 3e-4 --temperature 0.7 --episodes-per-step 2`` | 28.9 min | 0.225 [0.100, 0.375] | 0.025 [0.000, 0.075] | 0.025 [0.000, 0.075] | 2 / 8 / 0 / 70 |

Honest reading: this budget (16-24 debates of training) does NOT improve the team; both runs end
below the untrained team. The reward is sparse: on randomly drawn training problems the model
is right in only 0-10% of sampled answers during the first steps (most steps have reward 0 for
every answer), so the updates are mostly KL and critic noise. The untrained team's numbers are
also flattered by greedy decoding: both agents start as the same model, give identical answers
and keep them (no transitions at all), while trained agents differ and then sway each other —
after the 3e-4 run, both drift at turn 1 into chatty non-answers ("I'm glad you're happy with
the final answer..."). What it takes to show a gain is more episodes per step (a GPU, or
``llm-marl`` on a served model) or an easier task (``make("arithmetic_debate-v0", max_digits=1)``).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

import llm_marl_envs
from llm_marl_envs.metrics import TRANSITION_LABELS, transition_counts
from llm_marl.models import load
from trainers.common.evaluation import EvalResult
from llm_marl.team import Team
from trainers.mappo import MAPPOConfig, MAPPOTrainer


def summarize(evaluation: EvalResult) -> dict:
    """Per-turn accuracy (mean over agents, bootstrap CI over episodes) and summed transition counts."""
    turns = [{"turn": t, "accuracy": mean, "ci95": list(ci)}
             for t, (mean, ci) in enumerate(zip(evaluation.accuracy_per_turn, evaluation.accuracy_per_turn_ci))]
    counts = sum(transition_counts(e["correct"]) for e in evaluation.episodes)
    return {"accuracy_per_turn": turns, "transitions": dict(zip(TRANSITION_LABELS, counts.ravel().tolist()))}


def plot_transitions(before: dict, after: dict, path: Path) -> None:
    """Two 2×2 heatmaps (rows: turn t, columns: turn t+1) of transition shares, before and after training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, (title, summary) in zip(axes, (("before training", before), ("after training", after))):
        counts = np.array([summary["transitions"][label] for label in TRANSITION_LABELS]).reshape(2, 2)
        total = max(int(counts.sum()), 1)
        ax.imshow(counts / total, cmap="Blues", vmin=0, vmax=1)
        for (row, col), count in np.ndenumerate(counts):
            ax.text(col, row, f"{TRANSITION_LABELS[2 * row + col]}\n{count} ({count / total:.0%})", ha="center",
                    va="center", color="white" if count / total > 0.5 else "black")
        ax.set_xticks([0, 1], ["correct", "incorrect"])
        ax.set_yticks([0, 1], ["correct", "incorrect"])
        ax.set_xlabel("turn t+1")
        ax.set_ylabel("turn t")
        ax.set_title(title)
    fig.suptitle("correctness transitions between consecutive turns (all agents)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    """Evaluate, train with MAPPO, evaluate again; write results.json and transitions.png."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="arithmetic_debate-v0", help="debate env id")
    parser.add_argument("--steps", type=int, default=8, help="MAPPO training steps")
    parser.add_argument("--episodes-per-step", type=int, default=3, help="debates collected per step")
    parser.add_argument("--eval-tasks", type=int, default=20, help="test tasks evaluated before and after")
    parser.add_argument("--max-new-tokens", type=int, default=40, help="tokens per answer")
    parser.add_argument("--learning-rate", type=float, default=5e-5, help="actor and critic AdamW learning rate")
    parser.add_argument("--temperature", type=float, default=0.4, help="sampling temperature of training rollouts")
    parser.add_argument("--kl-coef", type=float, default=0.05, help="KL penalty to the reference (base model)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 is ~4x faster than 2 on a CPU shared with other jobs, measured)")
    parser.add_argument("--out", default="outputs/mappo_debate", help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    started = time.time()

    model, tokenizer = load("smollm2-135m")
    team = Team.shared_lora(model, tokenizer, agents=2)
    env = llm_marl_envs.make(args.env, num_agents=2, num_turns=3, split="train")
    eval_env = llm_marl_envs.make(args.env, num_agents=2, num_turns=3, split="test")
    config = MAPPOConfig(
        max_steps=args.steps, episodes_per_step=args.episodes_per_step, max_new_tokens=args.max_new_tokens,
        ppo_epochs=1, minibatch_size=4, learning_rate=args.learning_rate, critic_learning_rate=args.learning_rate,
        kl_coef=args.kl_coef, temperature=args.temperature,
        reward_gamma=0.3, alpha1=0.2, beta1=0.2, eval_tasks=args.eval_tasks, output_dir=str(out), seed=args.seed,
        save_every=1,
    )
    trainer = MAPPOTrainer(env, team, config, eval_env=eval_env)

    before = summarize(trainer.evaluate())
    print("before:", json.dumps(before), flush=True)
    history = trainer.train()
    after = summarize(trainer.evaluate())
    print("after:", json.dumps(after), flush=True)

    results = {"env": args.env, "config": config.to_dict(), "before": before, "after": after,
               "train_history": history, "wall_time_s": time.time() - started}
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    plot_transitions(before, after, out / "transitions.png")
    for name, summary in (("before", before), ("after", after)):
        cells = "  ".join(f"turn {e['turn']}: {e['accuracy']:.3f} [{e['ci95'][0]:.3f}, {e['ci95'][1]:.3f}]"
                          for e in summary["accuracy_per_turn"])
        print(f"{name:>6}  {cells}  transitions {summary['transitions']}")
    print(f"wall time {results['wall_time_s'] / 60:.1f} min; wrote {out / 'results.json'} and {out / 'transitions.png'}")


if __name__ == "__main__":
    main()
