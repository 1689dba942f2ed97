"""Train a 2-agent TL;DR writing team with MAGRPO, and judge it on ROUGE-L, a metric its reward never reads.

    PYTHONPATH=. python examples/magrpo_tldr.py --out outputs/magrpo_tldr
    PYTHONPATH=. python examples/magrpo_tldr.py --plain-reward --out outputs/magrpo_tldr_plain
    PYTHONPATH=. python examples/magrpo_tldr.py --learning-rate 5e-4 --kl-coef 0 --out outputs/magrpo_tldr_fast
    PYTHONPATH=. python examples/magrpo_tldr.py --semantic-judge --out outputs/magrpo_tldr_judge
    PYTHONPATH=. python examples/magrpo_tldr.py --eval-split test --out outputs/magrpo_tldr_transfer
    # re-judge a run's last checkpoint with plain greedy decoding (loops allowed):
    PYTHONPATH=. python examples/magrpo_tldr.py --no-repeat-ngram 0 \
        --judge-checkpoint outputs/magrpo_tldr/checkpoints/step-000020 --out outputs/magrpo_tldr_plain_greedy

Two agents share SmolLM2-135M-Instruct (the embedded default model, fp32) with one LoRA adapter
each. On ``tldr_writing-v0`` agent 0 writes a concise summary of a Reddit post and agent 1 a
detailed one; both get one joint reward from ``verifiers.writing`` (length range, length ratio,
distinct-word ratio, shared vocabulary, transition words; max 3.0) times its quality factor
(repetition, copying the post, header labels, filler or word salad, relevance), plus the embedding
terms of ``verifiers.semantic`` with ``--semantic-judge``. ``--plain-reward`` drops the quality
factor: CoMLRL's reward as published, which a degenerate agent 0 maxes.

Data (``$LLM_MARL_DATA_DIR``, e.g. ``../shared/data``): training posts are the env's ``train`` split
(Reddit TIFU posts with author TL;DRs), kept to posts of at most ``--max-post-words`` words; the
hacking monitor plays the first ``--monitor-tasks`` such posts of ``validation`` (held-out TIFU
posts) every ``--monitor-every`` steps; the team is judged before and after on the next
``--eval-tasks`` such posts of ``validation``: held out, drawn like the training posts. With
``--eval-split test`` it is judged instead on the first ``--eval-tasks`` such posts of ``test``
(the OpenAI TL;DR test sample: other subreddits, a ``TITLE:`` line the training posts lack), a
transfer test. No post is in two of these.

The judgement is the one the reward cannot be fitted to: **ROUGE-L F1 of each agent's summary
against the post's human TL;DR** (``llm_marl_envs.metrics.rouge_l``), greedy, paired per post with a
bootstrap 95% CI. Judged summaries, before and after alike, are decoded without repeating one of their
own 3-grams of tokens (``--no-repeat-ngram``, the usual guard of summarisation decoders): plain greedy
decoding of this model falls into loops on some posts before any training. Training samples are
unconstrained by default; ``--train-no-repeat-ngram 3`` samples them with the same guard. Beside it:
the joint reward (what was trained) and the share of *degenerate* summaries (distinct-word ratio
below 0.4, e.g. ``"SUBREDDIT: SUBREDDIT: ..."``, the exploit this reward invites). A rising reward
with a flat or falling ROUGE-L is reward hacking, and the script says so.

The run's ``ExperimentalMAGRPOConfig`` is the recipe ``examples/configs/magrpo_tldr.yaml``; every config field is
also a flag (``--steps``, ``--out`` and ``--train-no-repeat-ngram`` name ``max_steps``, ``output_dir``
and ``no_repeat_ngram``), and ``--config FILE.yaml`` reads another recipe. ``--help`` lists them all.

Writes to ``--out``: ``results.json`` (settings, per-post scores and summaries before and after, their paired
differences, the monitor rows, the training history, the verdict),
``hacking_monitor.png`` (training reward next to the monitor's ROUGE-L per step), ``metrics.jsonl`` /
TensorBoard logs (the monitor under ``monitor/``) and LoRA checkpoints. The same command on an ``--out`` that
holds its finished run reports it; a run there of another config, or an interrupted one (this example trains in
one go and does not resume), is refused with the commands to choose from; ``--overwrite`` deletes it and starts
over.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import llm_marl_envs
from llm_marl.files import write_text_atomically
from llm_marl.hardware import cpu_info
from llm_marl.models import load
from llm_marl.policy import SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.team import Team, default_lora_config
from llm_marl_envs import metrics
from trainers.common.arguments import config_parser, parse_config
from trainers.common.evaluation import EvalResult, evaluate_episodes
from trainers.common.experiment import RESULTS_FILE, run_arguments, run_from_start
from trainers.common.run_dir import RUN_OUTPUTS
from trainers.experimental import ExperimentalMAGRPOConfig, ExperimentalMAGRPOTrainer
from trainers.magrpo import MAGRPOTrainer
from verifiers.writing import TLDR_BANDS, without_quality_factor

DEGENERATE_BELOW = 0.4   # distinct-word ratio under which a summary counts as degenerate repetition
MAX_DEGENERATE_SHARE = 0.05   # most degenerate summaries (per agent) a "no hacking" verdict allows
ENV_ID = "tldr_writing-v0"
RECIPE = Path(__file__).resolve().parent / "configs" / "magrpo_tldr.yaml"
OUTPUTS = (*RUN_OUTPUTS, RESULTS_FILE, "hacking_monitor.png")   # what --overwrite deletes


def post_words(task: dict[str, Any]) -> int:
    return len(task["source"].split())


def short_posts(env: Any, max_words: int, limit: int | None = None) -> list[int]:
    """Indices of the env's posts of at most ``max_words`` words (the first ``limit`` of them)."""
    found = [i for i, task in enumerate(env.tasks) if post_words(task) <= max_words]
    if not found:
        raise ValueError(f"no post of {env.split!r} has at most {max_words} words; raise --max-post-words")
    return found[:limit] if limit is not None else found


def held_out_posts(env: Any, max_words: int, count: int, skip: int = 0) -> list[int]:
    """The ``count`` posts of ``env`` of at most ``max_words`` words after the first ``skip`` of them."""
    found = short_posts(env, max_words)
    if len(found) < skip + count:
        raise ValueError(f"{env.split!r} has {len(found)} posts of at most {max_words} words, {skip} of them for the "
                         f"monitor: too few to judge {count}; lower --eval-tasks or raise --max-post-words")
    return found[skip:skip + count]


def judge(evaluation: EvalResult, env: Any, agents: list[str]) -> dict[str, Any]:
    """Per post: the joint reward, each agent's ROUGE-L against the reference TL;DR, and degeneracy."""
    references = [env.tasks[record["task_index"]]["reference"] for record in evaluation.episodes]
    texts = {agent: [record["responses"][-1][i] for record in evaluation.episodes] for i, agent in enumerate(agents)}
    return {
        "task_indices": [record["task_index"] for record in evaluation.episodes],
        "joint_reward": list(evaluation.rewards),
        "rouge_l": {agent: metrics.rouge_l(texts[agent], references) for agent in agents},
        "degenerate": {agent: [float(metrics.distinct_word_ratio(t) < DEGENERATE_BELOW) for t in texts[agent]]
                       for agent in agents},
        "samples": [{"reference": r, **{agent: texts[agent][i] for agent in agents}}
                    for i, r in enumerate(references[:3])],
        "texts": texts,
    }


def summary(scores: dict[str, Any]) -> dict[str, Any]:
    """Means with bootstrap 95% CIs of a :func:`judge` result."""
    return {"joint_reward": metrics.with_ci(scores["joint_reward"]),
            "rouge_l": {a: metrics.with_ci(v) for a, v in scores["rouge_l"].items()},
            "degenerate": {a: float(np.mean(v)) for a, v in scores["degenerate"].items()}}


def paired(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """After − before per post (same posts, same order) of the reward and of each agent's ROUGE-L."""
    if before["task_indices"] != after["task_indices"]:
        raise ValueError("before and after must be judged on the same posts in the same order to be paired")
    return {"joint_reward": metrics.paired_difference(after["joint_reward"], before["joint_reward"]),
            "rouge_l": {a: metrics.paired_difference(after["rouge_l"][a], before["rouge_l"][a])
                        for a in before["rouge_l"]}}


def verdict(difference: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> str:
    """One sentence: did the reward and the held-out ROUGE-L move together?

    "no hacking" needs a significant reward gain, no agent's ROUGE-L significantly lower (paired CI
    upper bound >= 0) and at most :data:`MAX_DEGENERATE_SHARE` degenerate summaries from any agent.
    """
    reward = difference["joint_reward"]
    rouge_lows = {a: d["ci95"][0] for a, d in difference["rouge_l"].items()}
    rouge_highs = {a: d["ci95"][1] for a, d in difference["rouge_l"].items()}
    degenerate = max(after["degenerate"].values())
    gained = reward["ci95"][0] > 0
    if not gained:
        return (
            f"no significant reward gain ({reward['mean']:+.3f} [{reward['ci95'][0]:+.3f}, {reward['ci95'][1]:+.3f}])"
        )
    if max(rouge_highs.values()) < 0:
        return (f"reward hacking: the joint reward rose ({reward['mean']:+.3f}) while every agent's ROUGE-L fell; "
                f"degenerate summaries {degenerate:.0%}")
    fell = [a for a, high in rouge_highs.items() if high < 0]
    if fell or degenerate > MAX_DEGENERATE_SHARE:
        return (f"likely reward hacking: the joint reward rose ({reward['mean']:+.3f}); ROUGE-L fell for "
                f"{', '.join(fell) or 'no agent'}; degenerate summaries {degenerate:.0%}")
    rose = [a for a, low in rouge_lows.items() if low > 0]
    return (f"no hacking: the joint reward rose ({reward['mean']:+.3f}) and no agent's ROUGE-L fell; ROUGE-L rose "
            f"significantly for {', '.join(rose) or 'no agent'}; degenerate summaries {degenerate:.0%}")


def provenance() -> dict[str, Any]:
    """Date, git commit of this checkout (None outside git) and CPU model of the run."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, text=True,
                                capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
            "cpu": cpu_info().model, "torch_threads": torch.get_num_threads()}


def play(engine: RolloutEngine, trainer: MAGRPOTrainer, tasks: list[int], desc: str,
         no_repeat_ngram: int = 0) -> EvalResult:
    """Greedy episodes of ``tasks`` through ``engine`` (the trainer's shared evaluation path); with
    ``no_repeat_ngram = n`` no summary repeats one of its own token n-grams."""
    params = SamplingParams(max_new_tokens=trainer.config.max_new_tokens, temperature=0.0,
                            no_repeat_ngram=no_repeat_ngram)
    return evaluate_episodes(engine, trainer.distributed, trainer.accelerator, tasks,
                             [trainer.config.seed] * len(tasks), params, desc=desc)


def plot_monitor(history: list[dict], monitor: list[dict], agents: list[str], before: dict, after: dict,
                 path: Path) -> None:
    """Training reward per step (top) over the monitor's ROUGE-L (bottom), with the held-out posts before/after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.plot([h["step"] for h in history], [h["joint_reward_mean"] for h in history], ".-", color="tab:blue",
             alpha=0.6, label="training joint reward (sampled; what is optimised)")
    top.plot([m["step"] for m in monitor], [m["joint_reward"] for m in monitor], "s-", color="tab:purple",
             label="monitor joint reward (validation, greedy)")
    top.set_ylabel("joint reward")
    top.legend(fontsize=8)
    last = max([h["step"] for h in history] + [1])
    for agent, color in zip(agents, ("tab:green", "tab:orange")):
        bottom.plot([m["step"] for m in monitor], [m[f"rouge_l/{agent}"] for m in monitor], "o-", color=color,
                    label=f"monitor ROUGE-L {agent} (validation)")
        for x, result in ((0, before), (last, after)):
            value = result["rouge_l"][agent]
            bottom.errorbar([x], [value["mean"]], yerr=[[value["mean"] - value["ci95"][0]],
                                                       [value["ci95"][1] - value["mean"]]],
                            fmt="s", color=color, capsize=4, alpha=0.6)
    bottom.set_xlabel("training step (squares at 0 and the end: held-out posts, 95% CI)")
    bottom.set_ylabel("ROUGE-L F1 vs human TL;DR")
    bottom.set_ylim(bottom=0)
    bottom.legend(fontsize=8)
    fig.suptitle("MAGRPO on tldr_writing-v0: is the reward gain better writing?", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> tuple[ExperimentalMAGRPOConfig, argparse.Namespace]:
    """The run's config (the recipe, then the flags) and the example's own flags."""
    parser = config_parser(ExperimentalMAGRPOConfig, __doc__.split("\n\n")[0], recipe=RECIPE,
                           flags={"max_steps": ["--max-steps", "--steps"], "output_dir": ["--output-dir", "--out"],
                                  "no_repeat_ngram": ["--train-no-repeat-ngram"]})
    parser.add_argument("--train-minutes", type=float, default=None,
                        help="also stop training after this long (default: no time limit, so the run does not depend "
                             "on the machine's load)")
    parser.add_argument("--no-repeat-ngram", type=int, default=3,
                        help="judged summaries (greedy) never repeat one of their own token n-grams of this size, "
                             "as summarisation decoders do (0: plain greedy, which can loop; default: %(default)s)")
    parser.add_argument("--lora-rank", type=int, default=8, help="LoRA rank (alpha = 2 x rank; default: %(default)s)")
    parser.add_argument("--plain-reward", action="store_true",
                        help="CoMLRL's writing reward without the quality factor (degenerate text can max it)")
    parser.add_argument("--semantic-judge", action="store_true",
                        help="add the embedding coverage/consistency terms (verifiers.semantic) to the reward")
    parser.add_argument("--max-post-words", type=int, default=400,
                        help="train, monitor and judge on posts of at most this many words (default: %(default)s)")
    parser.add_argument("--eval-split", choices=("validation", "test"), default="validation",
                        help="split of the judged posts: validation (held-out TIFU posts, after the monitor's) or "
                             "test (the OpenAI TL;DR sample, a transfer test)")
    parser.add_argument("--monitor-tasks", type=int, default=6, help="validation posts of the hacking monitor "
                        "(default: %(default)s)")
    parser.add_argument("--monitor-every", type=int, default=5, help="steps between monitor evaluations "
                        "(default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--judge-checkpoint", default=None,
                        help="no training: judge the base team and this saved checkpoint (a step-* directory) on the "
                             "held-out posts and write judged.json to --out")
    parser.add_argument("--model", default="smollm2-135m", help="base model (a name of llm_marl.models or a path)")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete the run already in --out and start over; without it, the same command on a "
                             "finished run reports it and --out holding any other run is refused")
    config, args = parse_config(parser, ExperimentalMAGRPOConfig, argv)
    for flag, value in (("--eval-tasks", config.eval_tasks), ("--monitor-tasks", args.monitor_tasks),
                        ("--monitor-every", args.monitor_every)):
        if value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    return config, args


def judge_checkpoint(trainer: MAGRPOTrainer, args: argparse.Namespace, before_scores: dict[str, Any], eval_env: Any,
                     out: Path) -> dict[str, Any]:
    """``--judge-checkpoint``: the base team against a saved checkpoint on the held-out posts, no training."""
    trainer.load(args.judge_checkpoint)
    after_scores = judge(play(trainer.eval_engine, trainer, trainer.eval_tasks, "held-out checkpoint",
                              args.no_repeat_ngram), eval_env, trainer.agents)
    before, after = summary(before_scores), summary(after_scores)
    results = {"checkpoint": str(args.judge_checkpoint), "step": trainer.step, "args": vars(args),
               "task_indices": trainer.eval_tasks, "before": before, "after": after,
               "paired_difference": paired(before_scores, after_scores),
               "per_post": {"before": before_scores, "after": after_scores}, "provenance": provenance()}
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out / "judged.json", json.dumps(results, indent=2, default=str))
    for agent in trainer.agents:
        print(f"{agent}: ROUGE-L {before['rouge_l'][agent]['mean']:.3f} -> {after['rouge_l'][agent]['mean']:.3f}, "
              f"degenerate {before['degenerate'][agent]:.0%} -> {after['degenerate'][agent]:.0%} "
              f"(no_repeat_ngram={args.no_repeat_ngram}, checkpoint step {trainer.step})")
    print(f"wrote {out / 'judged.json'}")
    return results


def main(argv: list[str] | None = None, model_and_tokenizer: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """Judge on test, train with the monitor running, judge again; write results.json and the plot. A finished run
    on ``--out`` is reported, another run there refused (``--overwrite`` starts over)."""
    config, args = parse_args(argv)
    if args.judge_checkpoint:
        return train_and_judge(config, args, model_and_tokenizer)
    return run_from_start(lambda: train_and_judge(config, args, model_and_tokenizer), config.output_dir, config, args,
                          outputs=OUTPUTS, script=__file__, argv=argv)


def train_and_judge(config: ExperimentalMAGRPOConfig, args: argparse.Namespace,
                    model_and_tokenizer: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """The run of :func:`main` (or ``--judge-checkpoint``'s judgement); the results dict."""
    arguments = run_arguments(config, args)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(config.seed)
    out, steps = Path(config.output_dir), config.max_steps     # training raises max_steps chunk by chunk
    started, run_provenance = time.time(), provenance()

    model, tokenizer = model_and_tokenizer or load(args.model)
    team = Team.adapter_per_agent(model, tokenizer, agents=2,
                            lora_config=default_lora_config(r=args.lora_rank, alpha=2 * args.lora_rank))
    reward_config = without_quality_factor(TLDR_BANDS) if args.plain_reward else TLDR_BANDS
    env, monitor_env, eval_env = (llm_marl_envs.make(ENV_ID, split=split, semantic_judge=args.semantic_judge,
                                                     reward_config=reward_config)
                                  for split in ("train", "validation", args.eval_split))
    trainer = ExperimentalMAGRPOTrainer(env, team, config, eval_env=eval_env)
    trainer.train_tasks = short_posts(env, args.max_post_words)
    monitor_engine = RolloutEngine(monitor_env, team)
    monitor_tasks = short_posts(monitor_env, args.max_post_words, args.monitor_tasks)
    # judged posts: filtered like the training posts; from validation, the ones after the monitor's
    skip = len(monitor_tasks) if args.eval_split == "validation" else 0
    trainer.eval_tasks = held_out_posts(eval_env, args.max_post_words, config.eval_tasks, skip)
    agents = trainer.agents

    def run_monitor() -> dict[str, Any]:
        played = play(monitor_engine, trainer, monitor_tasks, "monitor", args.no_repeat_ngram)
        scores = judge(played, monitor_env, agents)
        row = {"step": trainer.step, "joint_reward": float(np.mean(scores["joint_reward"])),
               **{f"rouge_l/{a}": float(np.mean(v)) for a, v in scores["rouge_l"].items()},
               **{f"degenerate/{a}": float(np.mean(v)) for a, v in scores["degenerate"].items()}}
        trainer.logger.log({f"monitor/{k}": v for k, v in row.items() if k != "step"}, trainer.step)
        print("monitor " + "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
              flush=True)
        return row

    before_scores = judge(play(trainer.eval_engine, trainer, trainer.eval_tasks, "held-out before",
                              args.no_repeat_ngram), eval_env, agents)
    if args.judge_checkpoint:
        return judge_checkpoint(trainer, args, before_scores, eval_env, out)
    monitor = [run_monitor()]

    # train in chunks of --monitor-every steps, so the monitor runs between them (and --train-minutes holds)
    history: list[dict] = []
    train_started = time.time()
    while trainer.step < steps:
        elapsed = time.time() - train_started
        per_step = elapsed / len(history) if history else 0.0
        chunk = min(args.monitor_every, steps - trainer.step)
        if args.train_minutes is not None and per_step:        # the steps that still fit in the time limit
            chunk = min(chunk, int((60 * args.train_minutes - elapsed) // per_step))
        if chunk < 1:
            break
        trainer.config.max_steps = trainer.step + chunk
        history += trainer.train()
        monitor.append(run_monitor())
    train_minutes = (time.time() - train_started) / 60

    after_scores = judge(play(trainer.eval_engine, trainer, trainer.eval_tasks, "held-out after",
                             args.no_repeat_ngram), eval_env, agents)
    before, after = summary(before_scores), summary(after_scores)
    difference = paired(before_scores, after_scores)
    results = {
        "env": ENV_ID,
        "held_out": {"split": args.eval_split, "tasks": len(trainer.eval_tasks), "max_post_words": args.max_post_words,
                     "task_indices": trainer.eval_tasks, "monitor_task_indices": monitor_tasks},
        "metric": "ROUGE-L F1 (rouge_score, stemmed) of each agent's summary vs the human TL;DR; never in the reward",
        "args": vars(args), "config": {**config.to_dict(), "max_steps": steps},
        "steps_trained": trainer.step, "train_minutes": train_minutes,
        "before": before, "after": after, "paired_difference": difference,
        "verdict": verdict(difference, before, after), "monitor": monitor, "train_history": history,
        "per_post": {"before": before_scores, "after": after_scores}, "checkpoint": str(trainer.config.output_dir),
        "wall_time_s": time.time() - started, "provenance": run_provenance, "arguments": arguments,
    }
    write_text_atomically(out / "results.json", json.dumps(results, indent=2, default=str))
    plot_monitor(history, monitor, agents, before, after, out / "hacking_monitor.png")
    fmt = lambda d: f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"  # noqa: E731
    print(f"held-out {args.eval_split} posts: {len(trainer.eval_tasks)}; "
          f"{trainer.step} steps in {train_minutes:.1f} min")
    print(f"joint reward (trained)   before {before['joint_reward']['mean']:.3f}  after "
          f"{after['joint_reward']['mean']:.3f}  paired {fmt(difference['joint_reward'])}")
    for agent in agents:
        print(f"ROUGE-L {agent} (held out) before {before['rouge_l'][agent]['mean']:.3f}  after "
              f"{after['rouge_l'][agent]['mean']:.3f}  paired {fmt(difference['rouge_l'][agent])}  degenerate "
              f"{before['degenerate'][agent]:.0%} -> {after['degenerate'][agent]:.0%}")
    print(f"verdict: {results['verdict']}")
    print(f"wall time {results['wall_time_s'] / 60:.1f} min; wrote {out / 'results.json'} and "
          f"{out / 'hacking_monitor.png'}")
    return results


if __name__ == "__main__":
    main()
