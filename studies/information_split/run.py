"""Information-split study: untrained, own-view and full-view solo, MAGRPO, MAPPO and counterfactual-credit teams.

Run from the repository root, one env per command::

    python -m studies.information_split.run --env split_arithmetic-v0 --out outputs/split_arithmetic
    # an env argument for every arm (here: a small reward for a readable wrong answer):
    python -m studies.information_split.run --env reference_game-v0 --env-arg format_reward=0.1 --out outputs/rg
    # every arm (the untrained team too) starting from another study's full-view agent, seated in each role:
    python -m studies.information_split.run --env split_arithmetic-v0 \
        --warm-start outputs/split_arithmetic/arms/full_view_solo/team --out outputs/split_arithmetic_warm
    # a few arms, fewer steps and tasks, one job:
    python -m studies.information_split.run --env reference_game-v0 --arms untrained,own_view_solo,magrpo \
        --steps 5 --eval-tasks 50 --jobs 1 --out smoke
    # the headline comparison on three seeds, with the spread in OUT/seeds.json:
    python -m studies.information_split.run --env split_arithmetic-v0 --arms own_view_solo,magrpo \
        --seeds 0,1,2 --out outputs/split_arithmetic_seeds

Every trained arm samples the same number of completions per training step (how each arm is matched is printed
first; what each arm sampled is in ``results.json``). Each arm is then played greedily on the same held-out
tasks: the teams as trained and with their partners' messages masked, ``own_view_solo`` seated in the team,
``full_view_solo`` alone with every view. See :mod:`studies.information_split.study` for the arms and every
reported number.

Writes to ``--out``: ``results.json`` (command, date, commit, machine, summaries, paired differences, the research
bar, turn-0 transcripts before and after training), ``summary.png`` (arms side by side with 95% CIs, each team's
masked play beside it), per arm ``arms/<arm>/<setting>/report.html`` and the seated team checkpoint
``arms/<arm>/team`` (``llm-marl bench ENV --checkpoint OUT/arms/magrpo/team`` replays it). An interrupted study
run again with the same ``--out`` and settings reuses the finished arms.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from llm_marl.hardware import short_openmp_spin

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch starts its runtime

from studies.arms import ArmsFailed  # noqa: E402
from studies.information_split.study import ARMS, StudyConfig, run_seeds, run_study  # noqa: E402


def env_argument(text: str) -> tuple[str, object]:
    """``NAME=VALUE`` of ``--env-arg``: the name and the YAML value."""
    import yaml

    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (e.g. format_reward=0.1), got {text!r}")
    try:
        return name.strip(), yaml.safe_load(value)
    except yaml.YAMLError as error:
        raise argparse.ArgumentTypeError(f"{name.strip()}: {value!r} is not a YAML value ({error})") from None


def critic_depth(text: str) -> int | None:
    """``--mappo-critic-depth``: a number of layers, or ``all``."""
    if text.strip().lower() in ("all", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of layers or 'all', got {text!r}") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="split_arithmetic-v0",
                        help="information-split env: split_arithmetic-v0, reference_game-v0 or hidden_profile-v0")
    parser.add_argument("--out", required=True, help="output directory (resumable)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms, from {','.join(ARMS)}")
    fields = StudyConfig.__dataclass_fields__
    for name, help_text in (("steps", "training steps of every arm"),
                            ("num_generations", "G of MAGRPO; every arm samples C = P·N·(G+…+G^T) per step"),
                            ("prompts_per_step", "P of MAGRPO"),
                            ("counterfactual_samples", "K: alternatives replayed per message (counterfactual arm)"),
                            ("num_turns", "the team's turns"), ("solo_turns", "the solo arms' turns"),
                            ("max_new_tokens", "tokens per message"), ("eval_tasks", "held-out test tasks"),
                            ("transcripts", "tasks whose turn-0 messages results.json keeps"), ("seed", "seed"),
                            ("eval_batch", "held-out episodes played together (memory: about 12 GB at 128 for a "
                                           "team of SmolLM2-135M; not part of any arm's key)")):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=fields[name].default, help=help_text)
    for name in ("learning_rate", "kl_coef", "temperature"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=fields[name].default)
    parser.add_argument("--env-arg", action="append", default=[], metavar="NAME=VALUE", type=env_argument,
                        help="a make() argument of the env for every arm, repeatable (e.g. --env-arg format_reward=0.1 "
                             "--env-arg num_candidates=3); VALUE is read as YAML")
    parser.add_argument("--model", default=fields["model"].default,
                        help="base model: the embedded name or a local HF directory")
    parser.add_argument("--warm-start", default=None, metavar="CHECKPOINT",
                        help="a team checkpoint whose LoRA adapters every arm starts from, seat by seat (e.g. another "
                             "study's OUT/arms/full_view_solo/team); the untrained team is this start")
    parser.add_argument("--mappo-critic-depth", type=critic_depth, default=fields["mappo_critic_depth"].default,
                        help="the base's layers MAPPO's critic runs, from the bottom, or all (a shallower value model "
                             "costs less; default: %(default)s)")
    parser.add_argument("--seeds", default=None,
                        help="comma-separated seeds: the study once per seed in OUT/seed-<s>, and the spread in "
                             "OUT/seeds.json and OUT/seeds.png (overrides --seed)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="arms trained at once, each in its own process (default: one per CPU core, at most the "
                             "number of arms)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of each job (default: the cores divided among the jobs)")
    args = parser.parse_args(argv)
    settings = {name: getattr(args, name) for name in fields if name != "arms" and hasattr(args, name)}
    try:
        config = StudyConfig(**settings, env_kwargs=dict(args.env_arg),
                             arms=tuple(a.strip() for a in args.arms.split(",") if a.strip()))
    except (ValueError, TypeError) as error:     # a bad setting or env argument: say which, no traceback
        parser.error(str(error))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    jobs = args.jobs or max(1, min(cores, len(config.arms)))
    threads = args.threads or max(1, cores // jobs)
    import torch

    torch.set_num_threads(threads)
    command = shlex.join(["python", "-m", "studies.information_split.run", *(sys.argv[1:] if argv is None else argv)])
    try:
        if args.seeds:
            run_seeds(config, args.out, [int(s) for s in args.seeds.split(",") if s.strip()], jobs=jobs,
                      threads_per_job=threads, command=command)
        else:
            run_study(config, args.out, jobs=jobs, threads_per_job=threads, command=command)
    except ArmsFailed as error:            # a worker died (killed for memory, say): which arms, and how to resume
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
