"""A MAPPO step against a MAGRPO step at the same sampled completions, on the information-split study's shape.

    PYTHONPATH=. python benchmarks/mappo_step_ratio.py --repeats 3
    PYTHONPATH=. python benchmarks/mappo_step_ratio.py --repeats 2 --rollouts trees,episodes
    PYTHONPATH=. python benchmarks/mappo_step_ratio.py --env reference_game-v0 --critic-layers 8,30
    PYTHONPATH=. python benchmarks/mappo_step_ratio.py --critic-layers 8 --critic-passes fused,two \
        --env-arg format_reward=0.1
    PYTHONPATH=. python benchmarks/mappo_step_ratio.py --critic-layers 8 --critic-depth all,8 \
        --env-arg format_reward=0.1

Builds the study's MAGRPO and MAPPO trainers (:func:`studies.information_split.study.team_trainer`, the study's
defaults: SmolLM2-135M-Instruct fp32, one LoRA adapter per role, 2 roles x 2 turns, ``C = 40`` completions a
step, 40 new tokens) — MAPPO once per ``--critic-layers`` value (``all``: the critic adapts every layer) and
``--rollouts`` shape (``trees``: the study's, MAGRPO's task trees with ``num_generations = G``; ``episodes``: 10
plain episodes, minibatches of 16) and ``--critic-passes`` (``fused``: the study's one critic forward a step,
``fused_critic_pass``; ``two``: a gradient-free pass for the advantages and another for the value loss) and
``--critic-depth`` (``all``, or the base's first N layers: ``critic_depth``, a shallower value model) — and times
their training steps in turns: round ``r`` runs step ``r`` of every trainer, so load on the machine falls on all of
them alike. ``--env-arg NAME=VALUE`` passes a ``make()`` argument to the env: ``format_reward=0.1`` gives a readable
wrong answer 0.1, so the base model's sample groups differ in reward and MAGRPO updates rather than skipping them.
One torch thread; per step, the wall and CPU seconds, MAPPO's phases (``time/*``) and the share of MAGRPO's sample
groups whose advantages are all 0 (MAGRPO skips those rows in its update, so a step in which every answer of a group
earns the same costs it the rollout alone).

Prints the median seconds per step of each trainer and, as the last lines, ``ratio=<MAPPO step / MAGRPO step>``
per MAPPO setting (CPU seconds; the study's goal: at most 2), after each round's ratio. MAGRPO's line of a round
gives the samples its update ran (``updated_samples``): those whose group rewards differed.

``--critic-only`` times instead the critic's share of a step for each ``--critic-layers`` setting: the gradient-free
pass over 16 rows (a critic context of 380-470 tokens and a completion of 12-40, the study's lengths; with
``critic_layers`` its trunk first) and the value-loss forward and backward over the same rows in chunks of 4;
prints CPU seconds and ``ratio=<all layers / first setting>``.

The figures, with command, date, commit and machine, are on the documentation's Performance page.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from llm_marl.hardware import short_openmp_spin

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch starts its runtime

import torch  # noqa: E402

from studies.information_split.run import env_argument  # noqa: E402


def build(arm: str, config, critic_layers: int | None, out: Path, rollouts: str = "trees", fused: bool = True,
          critic_depth: int | None = None):
    """One team trainer of the study, on its own copy of the base model (MAPPO on ``rollouts``, its critic
    running once a step where it can when ``fused``, over the base's first ``critic_depth`` layers)."""
    from dataclasses import replace

    from llm_marl.team import Team
    from studies.collaboration.study import _trainer_config_kwargs
    from studies.information_split.study import base_model, matched_batches, team_trainer

    torch.manual_seed(config.seed)
    seats = [f"agent_{i}" for i in range(config.num_agents)]
    model, tokenizer = base_model(config)
    team = Team.adapter_per_agent(model, tokenizer, seats, name=config.model)
    common = {**_trainer_config_kwargs(config, out), "progress": False}
    batch = matched_batches(config)[arm]
    overrides = ({"critic_layers": critic_layers, "fused_critic_pass": fused, "critic_depth": critic_depth}
                 if arm == "mappo" else {})
    if arm == "mappo" and rollouts == "episodes":     # the same completions as plain episodes of N x T answers
        episodes = batch.completions_per_step // (config.num_agents * config.num_turns)
        batch = replace(batch, settings={"episodes_per_step": episodes, "num_generations": 1})
        overrides["minibatch_size"] = 16
    return team_trainer(arm, config, batch, team, common, **overrides)


def critic_only(settings: list[int | None], model_name: str) -> None:
    """CPU seconds of the critic's passes of a step, per critic setting (see the module docstring)."""
    import random

    from llm_marl.models import load
    from llm_marl.team import Team
    from trainers.mappo.critic import CentralizedCritic

    rng = random.Random(0)
    contexts = [[rng.randint(100, 20000) for _ in range(rng.randint(380, 470))] for _ in range(16)]
    completions = [[rng.randint(100, 20000) for _ in range(rng.choice([12, 25, 40]))] for _ in range(16)]
    totals = {}
    for layers in settings:
        model, tokenizer = load(model_name)
        team = Team.adapter_per_agent(model, tokenizer, ["agent_0", "agent_1"])
        critic = CentralizedCritic(team.policy("agent_0"), layers=layers)
        started = time.process_time()
        with torch.no_grad():
            trunk = critic.trunk(contexts, completions) if layers else None
            critic.values(contexts, completions, trunk=trunk)
        rollout = time.process_time() - started
        for k in range(0, len(contexts), 4):
            values, _ = critic.values(contexts[k:k + 4], completions[k:k + 4],
                                      trunk=trunk[k:k + 4] if trunk else None)
            values.sum().backward()
        totals[layers] = time.process_time() - started
        print(f"critic_layers={'all' if layers is None else layers}: gradient-free pass {rollout:.1f} s CPU, "
              f"value-loss passes {totals[layers] - rollout:.1f} s CPU, total {totals[layers]:.1f} s CPU", flush=True)
    if None in totals and len(totals) > 1:
        print(f"ratio={totals[None] / totals[settings[0]]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="split_arithmetic-v0")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps of each trainer")
    parser.add_argument("--critic-layers", default="8,all",
                        help="comma-separated MAPPO critic settings: a number of top layers, or all")
    parser.add_argument("--rollouts", default="trees",
                        help="comma-separated MAPPO rollout shapes: trees (the study's), episodes (plain)")
    parser.add_argument("--critic-depth", default="all",
                        help="comma-separated MAPPO critic depths: the base's first N layers, or all")
    parser.add_argument("--critic-passes", default="fused",
                        help="comma-separated MAPPO critic passes a step: fused (one, the study's), two")
    parser.add_argument("--env-arg", action="append", default=[], metavar="NAME=VALUE", type=env_argument,
                        help="a make() argument of the env, repeatable (e.g. format_reward=0.1); VALUE is read as YAML")
    parser.add_argument("--critic-only", action="store_true", help="time only the critic's passes of a step")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from studies.information_split.study import StudyConfig

    passes = [p.strip() for p in args.critic_passes.split(",")]
    if not set(passes) <= {"fused", "two"}:
        parser.error(f"--critic-passes takes fused and/or two, got {args.critic_passes!r}")
    try:
        config = StudyConfig(env=args.env, steps=args.repeats, arms=("untrained", "magrpo", "mappo"),
                             env_kwargs=dict(args.env_arg))
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    settings = [None if s.strip() == "all" else int(s) for s in args.critic_layers.split(",")]
    if args.critic_only:
        critic_only(settings, config.model)
        return
    shapes = [r.strip() for r in args.rollouts.split(",")]
    if not set(shapes) <= {"trees", "episodes"}:
        parser.error(f"--rollouts takes trees and/or episodes, got {args.rollouts!r}")
    depths = [None if d.strip() == "all" else int(d) for d in args.critic_depth.split(",")]
    variants = [(s, r, p, d) for r in shapes for p in passes for d in depths for s in settings
                if s is None or d is None or s <= d]
    if not variants:
        parser.error("no --critic-layers setting fits within a --critic-depth one")
    names = ["magrpo"] + [f"mappo ({r}, critic_depth={'all' if d is None else d}, "
                          f"critic_layers={'all' if s is None else s}, critic passes: {p})" for s, r, p, d in variants]
    with tempfile.TemporaryDirectory() as tmp:
        trainers = [build("magrpo", config, None, Path(tmp) / "magrpo")]
        trainers += [build("mappo", config, s, Path(tmp) / f"mappo-{i}", r, fused=p == "fused", critic_depth=d)
                     for i, (s, r, p, d) in enumerate(variants)]
        wall = {name: [] for name in names}
        cpu = {name: [] for name in names}
        for round_ in range(args.repeats):
            for name, trainer in zip(names, trainers):
                started, started_cpu = time.perf_counter(), time.process_time()
                record = trainer.train_step()
                wall[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - started_cpu)
                phases = ", ".join(f"{k[5:]} {v:.1f}" for k, v in record.items() if k.startswith("time/"))
                zero = [v for k, v in record.items() if k.endswith("/zero_advantage_groups")]
                updated = [v for k, v in record.items() if k.endswith("/updated_samples")]
                if zero:
                    phases = (f"zero-advantage groups {sum(zero) / len(zero):.2f} (mean over turns and agents), "
                              f"updated samples {sum(updated):.0f} of {config.completions_per_step}")
                print(f"round {round_ + 1} {name}: {wall[name][-1]:.1f} s wall, {cpu[name][-1]:.1f} s CPU"
                      + (f" ({phases})" if phases else ""), flush=True)
    for name in names:
        print(f"{name}: median {statistics.median(wall[name]):.1f} s wall, {statistics.median(cpu[name]):.1f} s CPU "
              f"per step")
    for name in names[1:]:
        rounds = ", ".join(f"{a / b:.2f}" for a, b in zip(cpu[name], cpu["magrpo"]))
        print(f"{name}: ratio by round {rounds}")
    base = statistics.median(cpu["magrpo"])
    for name in names[1:]:
        print(f"{name}: ratio={statistics.median(cpu[name]) / base:.2f}")


if __name__ == "__main__":
    main()
