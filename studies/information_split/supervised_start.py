"""A supervised start for the warm-start study: the full-view agent fine-tuned on solver-written answers.

The warm start (``run --warm-start``) needs a full-view agent that can do the task. Where neither the base model
nor RL from it learns the full-view task (``reference_game-v0``'s lookup: find the target in the lettered list,
read its letter), this command writes one: the study's LoRA adapter, trained by cross-entropy on the answers a
solver writes for full-view prompts of the **train** split, copied to every seat and saved as a team checkpoint
that ``run --warm-start`` takes. Only the full-view answer is demonstrated (``reference_game-v0``: ``"red small
circle (C)\\n\\boxed{C}"``; ``hidden_profile-v0``: ``"Ruled out: Dev, Sami, Bianca, Zoe. That leaves C. Farid.\\n
\\boxed{C}"``); no team message is: what a team says at turn 0 is still left to its training.

The prompt is the conversation the env gives a full-view agent of ``solo_turns`` turns (the one the study's
``full_view_solo`` arm answers), rendered by the policy's chat template, and the target ends with the policy's
stop token, as a sampled answer does.

    python -m studies.information_split.supervised_start --env reference_game-v0 \\
        --env-arg letter_position=after --examples 1200 --out runs/rg_supervised

The checkpoint is ``<out>/checkpoints/step-<steps>``; ``<out>/supervised.json`` holds the settings, the loss per
step (plotted in ``<out>/supervised.png``), the held-out greedy accuracy on ``eval_tasks`` test tasks of the full
view, and what MAGRPO would learn from at the start: the share of its sample groups with zero advantage in a few
rollouts without updates (a start so sharp that every group's answers earn the same gives it nothing; the command
warns).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from llm_marl.files import write_text_atomically
from studies.information_split.study import StudyConfig
from verifiers.choice import LETTERS

# the share of MAGRPO's last-turn groups with zero advantage from which a start is reported as too sharp to learn from
SHARP_START = 0.75


@dataclass
class SupervisedConfig:
    """The supervised start's settings; ``study`` gives the env, its arguments, the base model and the seats."""

    study: StudyConfig = field(default_factory=StudyConfig)
    examples: int = 1200            # train-split tasks, each demonstrated once per epoch
    epochs: int = 1
    batch_size: int = 8
    learning_rate: float = 1e-3
    eval_tasks: int = 100           # held-out test tasks played greedily with the full view at the end (0: none)
    probe_steps: int = 5            # MAGRPO rollouts from the start, no updates, to measure its diversity (0: none)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("examples", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_tasks < 0 or self.probe_steps < 0 or not self.learning_rate > 0:
            raise ValueError(f"need eval_tasks >= 0, probe_steps >= 0 and learning_rate > 0, got {self.eval_tasks}, "
                             f"{self.probe_steps}, {self.learning_rate}")
        train = self.full_view_env("train")
        demonstration(train, train.tasks[0])            # a ValueError here for an env without a solver

    @property
    def steps(self) -> int:
        return self.epochs * -(-self.examples // self.batch_size)

    def full_view_env(self, split: str) -> Any:
        """One agent with every view, ``solo_turns`` turns; the train split holds at least ``examples`` tasks."""
        study = self.study
        tasks = max(study.num_tasks, self.examples) if split == "train" else study.num_tasks
        return study.make_env(split, view="full", turns=study.solo_turns, num_tasks=tasks)


def demonstration(env: Any, task: dict[str, Any]) -> str:
    """The answer a solver writes for ``task`` in ``env``'s last turn: what the last-turn instruction asks for.

    ``ValueError`` for an env without a solver here.
    """
    name = env.metadata["name"]
    answer = task["answer"]
    if name == "reference_game-v0":
        if env.letter_position == "after":       # "Repeat the target's line ..., then give its letter"
            return f"{task['target']} ({answer})\n\\boxed{{{answer}}}"
        return f"\\boxed{{{answer}}}"
    if name == "split_arithmetic-v0":
        return f"\\boxed{{{answer}}}"
    if name == "hidden_profile-v0":       # the elimination: every candidate a negative fact names, in prompt order
        names = task["candidates"]
        failing = dict.fromkeys(names[who] for facts in task["facts"] for who, _, holds in facts if not holds)
        right = names[LETTERS.index(answer)]
        return f"Ruled out: {', '.join(failing)}. That leaves {answer}. {right}.\n\\boxed{{{answer}}}"
    raise ValueError(f"no solver-written answers for {name}; supervised starts support reference_game-v0, "
                     f"hidden_profile-v0 and split_arithmetic-v0")


def demonstration_rows(policy: Any, env: Any, task_indices: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """``(prompt_ids, target_ids)`` per task: the full-view agent's first prompt as the policy encodes it, and the
    solver's answer followed by the policy's stop token."""
    end_of_answer = policy.tokenizer.eos_token_id
    if end_of_answer not in policy.stop_ids:
        end_of_answer = policy.stop_ids[0]
    rows = []
    for index in task_indices:
        _, infos = env.reset(seed=0, options={"task_index": int(index)})
        (agent,) = env.agents
        if env.turn != env.num_turns - 1:
            raise ValueError(f"a supervised start answers at once: play the full view with 1 turn, not "
                             f"{env.num_turns}")
        prompt = policy.encode(infos[agent]["messages"])
        target = policy.tokenizer.encode(demonstration(env, env.task), add_special_tokens=False)
        rows.append((prompt, [*target, end_of_answer]))
    return rows


def train_supervised(config: SupervisedConfig, out: Path, log: Any = print) -> dict[str, Any]:
    """Fine-tune ``agent_0``'s adapter on the demonstrations, copy it to every seat, save the team checkpoint and
    ``supervised.json``; the record written."""
    import numpy as np
    import torch
    from tqdm.auto import tqdm

    from llm_marl.team import Team
    from llm_marl.team_checkpoint import save_team
    from studies.collaboration.study import base_model

    study = config.study
    torch.manual_seed(config.seed)
    seats = [f"agent_{i}" for i in range(study.num_agents)]
    model, tokenizer = base_model(study)
    team = Team.adapter_per_agent(model, tokenizer, seats, name=study.model)
    policy = team.policy(seats[0])
    env = config.full_view_env("train")
    if len(env.tasks) < config.examples:
        raise ValueError(f"{study.env}'s train split has {len(env.tasks)} tasks, fewer than examples="
                         f"{config.examples}")
    rng = np.random.default_rng(config.seed)
    chosen = rng.choice(len(env.tasks), size=config.examples, replace=False)
    rows = demonstration_rows(policy, env, chosen)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(seats[0]), lr=config.learning_rate, weight_decay=0.0)
    losses: list[float] = []
    started = time.perf_counter()
    policy.model.train()
    with tqdm(total=config.steps, desc="supervised start", unit="step") as bar:
        for _ in range(config.epochs):
            order = rng.permutation(len(rows))
            for first in range(0, len(order), config.batch_size):
                batch = [rows[i] for i in order[first:first + config.batch_size]]
                logprobs, mask = policy.token_logprobs([p for p, _ in batch], [t for _, t in batch], adapter=seats[0])
                loss = -(logprobs * mask).sum() / mask.sum()       # mean cross-entropy per target token
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
    seconds = time.perf_counter() - started
    policy.model.eval()
    for seat in seats[1:]:
        policy.copy_adapter(seats[0], seat)
    checkpoint = save_team(out, config.steps, team, env=study.make_env("test"))
    record = {"command": "python -m studies.information_split.supervised_start", "settings": settings_of(config),
              "checkpoint": str(checkpoint), "seconds": round(seconds, 1), "losses": losses,
              "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {platform.processor()}".strip(),
              "python": platform.python_version()}
    if config.eval_tasks:
        record["held_out"] = held_out_accuracy(config, team)
        log(f"held-out accuracy with the full view, greedy on {config.eval_tasks} test tasks: "
            f"{record['held_out']['accuracy']:.3f}")
    if config.probe_steps:
        probe = record["sampled_diversity"] = sampled_diversity(config, team)
        last = probe["zero_advantage_groups"][-1]
        log(f"sampled diversity over {config.probe_steps} MAGRPO rollouts from the start: zero-advantage groups by "
            f"turn {', '.join(f'{z:.2f}' for z in probe['zero_advantage_groups'])}, identical groups "
            f"{', '.join(f'{z:.2f}' for z in probe['identical_groups'])}")
        if last >= SHARP_START:
            log(f"warning: {last:.0%} of MAGRPO's last-turn sample groups from this start have equal rewards, so no "
                f"advantage ({probe['identical_groups'][-1]:.0%} have identical texts): MAGRPO would learn from few "
                f"samples. A start trained for fewer steps or at a lower learning rate samples more varied answers")
    write_text_atomically(out / "supervised.json", json.dumps(record, indent=2) + "\n")
    plot_losses(losses, config, out / "supervised.png")
    return record


def plot_losses(losses: Sequence[float], config: SupervisedConfig, path: Path) -> None:
    """The cross-entropy per target token at each step, on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.plot(range(1, len(losses) + 1), losses, marker=".")
    axis.set_yscale("log")
    axis.set_xlabel("step")
    axis.set_ylabel("cross-entropy per target token (nats)")
    axis.set_title(f"supervised start: {config.study.env}, {config.examples} demonstrations, "
                   f"batch {config.batch_size}, learning rate {config.learning_rate:g}", fontsize=9)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def held_out_accuracy(config: SupervisedConfig, team: Any) -> dict[str, Any]:
    """Greedy accuracy of ``agent_0``'s adapter playing the full view alone on the first ``eval_tasks`` test tasks."""
    import numpy as np

    from llm_marl.policy import SamplingParams
    from llm_marl.rollout import RolloutEngine
    from llm_marl.team import Team
    from trainers.common.evaluation import evaluate_episodes, scores_from

    study = config.study
    env = config.full_view_env("test")
    policy = team.policy("agent_0")
    solo = Team.from_policies({"agent_0": (policy, "agent_0")})
    tasks = list(range(config.eval_tasks))
    params = SamplingParams(max_new_tokens=study.max_new_tokens, temperature=0.0, top_p=study.top_p, seed=study.seed)
    result = evaluate_episodes(RolloutEngine(env, solo), None, None, tasks, [study.seed + 1_000 * i for i in tasks],
                               params, desc="full view")
    scores = scores_from(result, tasks, 1, 0.0).to_arrays()
    return {"tasks": len(tasks), "accuracy": float(np.mean(scores["final"])), "scores": scores,
            "answers": [e["responses"][-1][0] for e in result.episodes[:5]]}


def sampled_diversity(config: SupervisedConfig, team: Any) -> dict[str, Any]:
    """What MAGRPO would learn from at the start: ``probe_steps`` of its rollouts on the study's train env (no update),
    and per turn the share of its sample groups whose advantages are all zero (equal returns), the share whose
    sampled texts are all identical, and the sampled tokens' mean negative log-prob (an entropy estimate)."""
    import tempfile

    import numpy as np

    from studies.collaboration.study import _trainer_config_kwargs
    from studies.information_split.study import matched_batches, team_trainer
    from trainers.magrpo.trainer import walk_tree

    study = config.study
    per_turn: dict[int, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        common = {**_trainer_config_kwargs(study, Path(tmp)), "progress": False}
        trainer = team_trainer("magrpo", study, matched_batches(replace(study, arms=("magrpo",)))["magrpo"], team,
                               common)
        for _ in range(config.probe_steps):
            roots = trainer.collect()
            for root in roots:
                trainer.compute_returns(root)
            for node in walk_tree(roots):
                turn = per_turn.setdefault(node.turn, {"zero": [], "identical": [], "nll": []})
                for agent, advantages in trainer.compute_advantages(node).items():
                    samples = node.expansion.samples[agent]
                    turn["zero"].append(float(bool((advantages == 0).all())))
                    turn["identical"].append(float(len({g.text for g in samples}) == 1))
                    turn["nll"].extend(-lp for g in samples for lp in (g.logprobs or []))
    return {"steps": config.probe_steps, "temperature": study.temperature,
            "zero_advantage_groups": [float(np.mean(per_turn[t]["zero"])) for t in sorted(per_turn)],
            "identical_groups": [float(np.mean(per_turn[t]["identical"])) for t in sorted(per_turn)],
            "entropy_estimate": [float(np.mean(per_turn[t]["nll"])) if per_turn[t]["nll"] else None
                                 for t in sorted(per_turn)]}


def settings_of(config: SupervisedConfig) -> dict[str, Any]:
    values = asdict(config)
    values["study"] = {k: values["study"][k] for k in ("env", "env_kwargs", "model", "solo_turns", "max_new_tokens")}
    values["steps"] = config.steps
    return values


def main(argv: Sequence[str] | None = None) -> None:
    from studies.information_split.run import env_argument

    parser = argparse.ArgumentParser(prog="python -m studies.information_split.supervised_start",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="reference_game-v0")
    parser.add_argument("--env-arg", action="append", default=[], metavar="NAME=VALUE", type=env_argument,
                        help="a make() argument of the env, as in the study's command (repeatable; YAML value)")
    defaults = SupervisedConfig.__dataclass_fields__
    for name in ("examples", "epochs", "batch_size", "eval_tasks", "probe_steps", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=defaults[name].default)
    parser.add_argument("--learning-rate", type=float, default=defaults["learning_rate"].default)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", required=True, help="folder of the checkpoint and supervised.json")
    args = parser.parse_args(argv)
    try:
        study = StudyConfig(env=args.env, env_kwargs=dict(args.env_arg))
        config = SupervisedConfig(study=study, examples=args.examples, epochs=args.epochs,
                                  batch_size=args.batch_size, learning_rate=args.learning_rate,
                                  eval_tasks=args.eval_tasks, probe_steps=args.probe_steps, seed=args.seed)
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    record = train_supervised(config, Path(args.out))
    print(f"checkpoint: {record['checkpoint']} ({record['seconds'] / 60:.1f} min of training)")


if __name__ == "__main__":
    main()
