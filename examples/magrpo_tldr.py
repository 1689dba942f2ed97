"""Train a 2-agent TL;DR writing team with MAGRPO on a CPU and compare it before and after.

    PYTHONPATH=. python examples/magrpo_tldr.py --out outputs/magrpo_tldr

Two agents share SmolLM2-135M-Instruct (the embedded default model, fp32) with one LoRA adapter
each (``Team.shared_lora``). On ``tldr_writing-v0`` agent 0 writes a concise summary of a Reddit
post and agent 1 a detailed one; both get one joint reward from ``verifiers.writing`` (length
range, length ratio, distinct-word ratio, shared vocabulary, transition words; max 3.0).

Data: the env's ``test`` split (500 posts of the OpenAI TL;DR test sample; there is no offline
copy of the TL;DR train split, and the Reddit TIFU posts standing in for it run up to 2,900
prompt tokens, too slow here). The trainer holds out the last ``--eval-tasks`` posts and never
trains on them; the team is evaluated greedily on exactly those posts before and after training,
and the improvement is the paired difference per post with a bootstrap 95% CI.

Writes to ``--out``: ``results.json`` (settings, before/after rewards per held-out post, means
with CIs, the paired difference with its CI, the per-step training curve, sample outputs),
``reward_curve.png`` (training joint reward per step, eval before/after), ``metrics.jsonl`` /
TensorBoard logs and LoRA checkpoints.

Training stops after ``--steps`` steps or ``--train-minutes`` minutes, whichever comes first, so
the whole run stays within about 30 minutes on 2 cores.

Measured with the defaults (2 cores shared with other jobs, commit c50d574, i.e. before the
reserved KV cache that only speeds up sampling): 31 steps (62 posts) in 23.4 min, 29.7 min wall
time in all (load, two evaluations of 32 posts of ~460 prompt tokens, plots). Held-out joint reward,
greedy, 32 posts:

=======================  ================================
untrained team           0.545, 95% CI [0.500, 0.631]
trained team             2.777, 95% CI [2.763, 2.788]
difference (paired)      +2.232, 95% CI [+2.140, +2.283]; 32 of 32 posts improved
=======================  ================================

The training joint reward rose from ~0.6-1.0 (steps 1-11) to ~2.3-2.8 (steps 16-31);
``reward_curve.png`` shows it. What the team learned is **reward hacking**, and the example is
kept as a demonstration of that: the untrained model copies the post into both parts (length
ratio ~1: scoring stops after the word-count level, 0.5); after training agent 0 writes
``"SUBREDDIT:"`` ten times (10 words, 1 distinct word, short) while agent 1 writes a fluent
first-person retelling with transition words — which satisfies every band of the heuristic
reward (length ratio, distinct-word ratio, shared vocabulary, transitions) without a useful
concise summary. The writing reward has no check of content or fluency; ``kl_coef > 0`` (stay
near the base model) or ``semantic_judge=True`` on the env (embedding coverage and consistency
terms) are the knobs against it, not measured here.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

import llm_marl_envs
from llm_marl_envs.metrics import bootstrap_ci
from llm_marl.models import load
from trainers.common.evaluation import BOOTSTRAP_RESAMPLES, EvalResult
from llm_marl.team import Team, default_lora_config
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer


def summarize(evaluation: EvalResult) -> dict:
    """Mean held-out joint reward with its bootstrap 95% CI, and the reward of every post."""
    return {"mean": evaluation.team_reward, "ci95": list(evaluation.team_reward_ci), "rewards": evaluation.rewards}


def paired_difference(before: dict, after: dict) -> dict:
    """After minus before per held-out post (same posts, same order), mean with a bootstrap 95% CI."""
    diffs = np.array(after["rewards"]) - np.array(before["rewards"])
    mean, low, high = (float(v) for v in bootstrap_ci(diffs, num_resamples=BOOTSTRAP_RESAMPLES))
    return {"mean": mean, "ci95": [low, high], "improved": int((diffs > 0).sum()), "worse": int((diffs < 0).sum()),
            "tied": int((diffs == 0).sum())}


def samples(evaluation: EvalResult, agents: list[str], count: int = 3) -> list[dict]:
    """The first ``count`` held-out episodes: both agents' texts and the joint reward."""
    return [{"task_id": record["task_id"], "joint_reward": reward, **dict(zip(agents, record["responses"][0]))}
            for record, reward in zip(evaluation.episodes[:count], evaluation.rewards)]


def plot_curve(history: list[dict], before: dict, after: dict, path: Path) -> None:
    """Training joint reward per step (and a moving average), with the held-out eval before and after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    rewards = [h["joint_reward_mean"] for h in history]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rewards, ".", color="tab:blue", alpha=0.4, label="training joint reward (sampled, per step)")
    window = max(1, len(rewards) // 10)
    if len(rewards) >= window > 1:
        smooth = np.convolve(rewards, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, color="tab:blue", label=f"moving average ({window} steps)")
    last = steps[-1] if steps else 1
    for x, (label, result, color) in zip((0, last), (("held-out, before (greedy)", before, "tab:gray"),
                                                     ("held-out, after (greedy)", after, "tab:red"))):
        low, high = result["ci95"]
        ax.errorbar([x], [result["mean"]], yerr=[[result["mean"] - low], [high - result["mean"]]], fmt="s",
                    color=color, capsize=4, label=f"{label}: {result['mean']:.2f} [{low:.2f}, {high:.2f}]")
    ax.set_xlabel("training step")
    ax.set_ylabel("joint reward (max 3.0)")
    ax.set_ylim(bottom=0)
    ax.set_title("MAGRPO on tldr_writing-v0: 2 LoRA agents on SmolLM2-135M")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    """Evaluate, train with MAGRPO, evaluate again; write results.json and reward_curve.png."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="MAGRPO training steps (at most)")
    parser.add_argument("--train-minutes", type=float, default=24.0, help="stop training after this long")
    parser.add_argument("--prompts-per-step", type=int, default=2, help="posts (tree roots) per step")
    parser.add_argument("--num-generations", type=int, default=4, help="G: samples per agent per post")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per summary")
    parser.add_argument("--temperature", type=float, default=0.8, help="training sampling temperature")
    parser.add_argument("--top-p", type=float, default=1.0, help="training nucleus mass")
    parser.add_argument("--learning-rate", type=float, default=5e-4, help="AdamW learning rate of each adapter")
    parser.add_argument("--lora-rank", type=int, default=8, help="LoRA rank (alpha = 2 x rank)")
    parser.add_argument("--joint-mode", default="cross", choices=("aligned", "cross"), help="joint actions")
    parser.add_argument("--eval-tasks", type=int, default=32, help="held-out posts evaluated before and after")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", default="outputs/magrpo_tldr", help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    started = time.time()

    model, tokenizer = load("smollm2-135m")
    team = Team.shared_lora(model, tokenizer, agents=2,
                            lora_config=default_lora_config(r=args.lora_rank, alpha=2 * args.lora_rank))
    env = llm_marl_envs.make("tldr_writing-v0", split="test")
    config = MAGRPOConfig(
        num_generations=args.num_generations, joint_mode=args.joint_mode, max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, top_p=args.top_p, learning_rate=args.learning_rate,
        prompts_per_step=args.prompts_per_step, max_steps=args.steps, eval_tasks=args.eval_tasks,
        output_dir=str(out), seed=args.seed, save_every=10,
    )
    trainer = MAGRPOTrainer(env, team, config)

    before_eval = trainer.evaluate()
    before = summarize(before_eval)
    print(f"before: {before['mean']:.3f} [{before['ci95'][0]:.3f}, {before['ci95'][1]:.3f}]", flush=True)

    # Train in chunks sized to the time left, so the budget stops training between steps
    # (train() writes a checkpoint at the end of each chunk).
    history: list[dict] = []
    train_started = time.time()
    while trainer.step < args.steps:
        left = 60 * args.train_minutes - (time.time() - train_started)
        per_step = (time.time() - train_started) / len(history) if history else 0.0
        chunk = min(10, args.steps - trainer.step, int(left // per_step) if per_step else 1)
        if chunk < 1:
            break
        trainer.config.max_steps = trainer.step + chunk
        history += trainer.train()
    train_minutes = (time.time() - train_started) / 60

    after_eval = trainer.evaluate()
    after = summarize(after_eval)
    difference = paired_difference(before, after)
    results = {
        "env": "tldr_writing-v0", "split": "test", "held_out_task_indices": trainer.eval_tasks,
        "config": {**config.to_dict(), "max_steps": args.steps}, "args": vars(args),
        "steps_trained": trainer.step, "train_minutes": train_minutes,
        "before": before, "after": after, "difference": difference,
        "train_history": history, "samples_before": samples(before_eval, trainer.agents),
        "samples_after": samples(after_eval, trainer.agents),
        "wall_time_s": time.time() - started,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    plot_curve(history, before, after, out / "reward_curve.png")
    print(f"before  {before['mean']:.3f} [{before['ci95'][0]:.3f}, {before['ci95'][1]:.3f}]")
    print(f"after   {after['mean']:.3f} [{after['ci95'][0]:.3f}, {after['ci95'][1]:.3f}]")
    print(f"after - before (paired over {len(before['rewards'])} held-out posts): {difference['mean']:+.3f} "
          f"[{difference['ci95'][0]:+.3f}, {difference['ci95'][1]:+.3f}]; improved {difference['improved']}, "
          f"worse {difference['worse']}, tied {difference['tied']}")
    print(f"{trainer.step} steps in {train_minutes:.1f} min; wall time {results['wall_time_s'] / 60:.1f} min; "
          f"wrote {out / 'results.json'} and {out / 'reward_curve.png'}")


if __name__ == "__main__":
    main()
