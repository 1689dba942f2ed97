"""The ``llm-marl`` command line: list envs, benchmark LLM teams, train, rebuild reports.

    llm-marl envs
    llm-marl bench arithmetic_debate-v0 --baseline single,majority,debate --episodes 40
    llm-marl bench anli_debate-v1 --models smollm2-135m,/path/to/other --backend hf --baseline debate
    llm-marl bench arithmetic_debate-v0 --checkpoint outputs/magrpo       # trained team vs its untrained base
    llm-marl train magrpo tldr_writing-v0 --config cfg.yaml --set learning_rate=1e-5
    llm-marl report runs/bench/gsm_symbolic_debate-v0-debate-seed0
    llm-marl export outputs/magrpo my-team    # the trained team as PEFT adapters + model card, for `hf upload`
    llm-marl info                      # versions, CPU features, backend choices: paste into bug reports

User errors (unknown env, unreachable server, missing data, bad values) print one line that
says what to change and exit with status 2.

Each command imports what it needs when it runs: ``--help`` and ``envs`` load no torch,
transformers, datasets or env module (the env table comes from the registry's summaries), and
``train`` checks its config and env id before torch loads.

This module is the top layer: it imports the trainers (``trainers.magrpo``, ``trainers.mappo``) and
the runtime below them, and nothing imports it. A subcommand is a ``cmd_NAME(args)`` function and a
``sub.add_parser("NAME", ...)`` block in :func:`build_parser`.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .hardware import short_openmp_spin

# OpenMP workers (torch, llama.cpp) spin 300,000 iterations at every barrier by default, which starves a
# shared CPU, and sleep at once when passive, which slows 2 threads down: a short spin. The runtime reads it
# once at start, so it is set before torch or llama.cpp load.
short_openmp_spin()

DEFAULT_MODEL = "smollm2-135m"

class UserError(ValueError):
    """A mistake in the command line or its inputs; reported without a traceback, exit status 2."""


# ---------------------------------------------------------------------------------- envs
def cmd_envs(args: argparse.Namespace) -> int:
    """Print the table of registered environments."""
    from llm_marl_envs.registry import list_envs, newest_version, spec

    rows = [("id", "agents", "turns", "data source", "verifier")]
    for env_id in list_envs():
        newer = newest_version(env_id)
        shown = env_id if newer == env_id else f"{env_id} (deprecated: use {newer})"
        try:
            row = spec(env_id).describe()     # the registered summary: no env module is imported
            rows.append((shown, str(row.num_agents), str(row.num_turns), row.data_source or "-",
                         row.verifier_name or "-"))
        except (ImportError, AttributeError, KeyError) as err:
            rows.append((shown, "?", "?", f"(unavailable: {err})", "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    return 0


# ---------------------------------------------------------------------------------- bench
def default_backend(models: Sequence[str]) -> str:
    """``llamacpp`` when every model is an embedded GGUF name or a ``.gguf`` file, else ``hf``."""
    from .model_sources import EMBEDDED_MODELS

    return "llamacpp" if all(m in EMBEDDED_MODELS or m.endswith(".gguf") for m in models) else "hf"


def cmd_bench(args: argparse.Namespace) -> int:
    """Run (or resume) a benchmark, or several baselines on the same tasks, and write the report."""
    if not args.checkpoint and args.backend != "openai":      # a model found nowhere fails before torch loads
        from .model_sources import check_model_source

        for name in (args.models or args.model or DEFAULT_MODEL).split(","):
            check_model_source(name.strip())
    from .benchmark import BenchConfig, run_benchmark
    from .compare import compare_baselines, format_comparison, parse_baselines
    from .team_checkpoint import (
        check_base_models,
        check_models,
        find_checkpoint,
        manifest_models,
        read_manifest,
        relocate_base,
    )

    models = [m.strip() for m in args.models.split(",")] if args.models else [args.model or DEFAULT_MODEL]
    # --model with --models is refused by argparse (a mutually exclusive group)
    if any(not m for m in models):
        raise UserError(f"--models has an empty name in {args.models!r}; separate names with single commas")
    baselines = parse_baselines(args.baseline)
    num_agents, num_turns, checkpoint = args.num_agents, args.num_turns, None
    trained_env: dict[str, Any] = {}        # the env a --checkpoint's team trained in, when it is ENV
    if args.base_model and not args.checkpoint:
        raise UserError("--base-model says where a --checkpoint's base model moved; give --checkpoint DIR too, or "
                        "name the model with --model")
    if args.checkpoint:
        checkpoint = find_checkpoint(args.checkpoint)
        manifest = read_manifest(checkpoint)
        if args.base_model:
            manifest = relocate_base(checkpoint, manifest, args.base_model)
        check_base_models(checkpoint, manifest)
        if args.model or args.models:
            check_models(checkpoint, manifest, models)
        trained = manifest_models(manifest)
        models = trained[:1] if len(set(trained)) == 1 else trained
        num_agents = num_agents or len(manifest["agents"])
        if (manifest.get("env") or {}).get("id") == args.env:
            trained_env = manifest["env"]
        if num_turns is None and trained_env:
            num_turns = trained_env["num_turns"]
        if "checkpoint" not in baselines:
            baselines.append("checkpoint")
    backend = args.backend or ("hf" if checkpoint else default_backend(models))
    env_kwargs = {k: v for k, v in env_arguments(args).items() if k not in ("num_agents", "num_turns")}
    if trained_env.get("show_scores"):
        env_kwargs["show_scores"] = True      # every baseline debates as the team trained: reading the scores
    config = BenchConfig(
        env_id=args.env, models=models, backend=backend, base_url=args.base_url, baseline=baselines[0],
        num_agents=num_agents, num_turns=num_turns, episodes=args.episodes, seed=args.seed,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
        episodes_per_batch=args.episodes_per_batch, threads=args.threads, weights=args.weights,
        env_kwargs=env_kwargs,
        checkpoint=str(checkpoint.resolve()) if checkpoint else None, base_model=args.base_model)
    out = Path(args.out or Path("runs") / "bench" / f"{args.env}-{'+'.join(baselines)}-seed{args.seed}")
    if len(baselines) > 1:
        print(format_comparison(compare_baselines(config, baselines, out, progress=not args.quiet), out))
        return 0
    summary = run_benchmark(config, out, progress=not args.quiet)
    print(format_summary(summary, out))
    return 0


def format_summary(summary: dict[str, Any], out: Path) -> str:
    """A few lines for the terminal: headline metrics and where the report is."""
    from .benchmark import REPORT_FILE
    from .report import REPORT_HTML as HTML_REPORT
    from .report import format_ci as _fmt

    turns = ", ".join(_fmt(e) for e in summary["accuracy_per_turn"])
    lines = [f"{summary['env_id']} | {summary['baseline']} | {', '.join(summary['models'])} | "
             f"{summary['num_episodes']} episodes | seed {summary['seed']}",
             f"  {summary['metric']} per turn: {turns}",
             f"  final majority: {_fmt(summary['final_majority_accuracy'])}   "
             f"consensus: {_fmt(summary['consensus_rate'])}",
             f"  tokens: {summary['tokens_total']}   wall time: {summary['wall_time_total_s']:.1f} s",
             f"  report: {out / HTML_REPORT}  ({out / REPORT_FILE})"]
    return "\n".join(lines)


def cmd_report(args: argparse.Namespace) -> int:
    """Rebuild summary.json, report.md, report.html and the plots of a run (or comparison) directory."""
    from .benchmark import write_report
    from .compare import format_comparison, is_comparison, write_comparison

    if is_comparison(args.dir):
        print(format_comparison(write_comparison(args.dir), Path(args.dir)))
        return 0
    summary = write_report(args.dir)
    print(format_summary(summary, Path(args.dir)))
    return 0


# ---------------------------------------------------------------------------------- train
TRAINER_CONFIGS = {"magrpo": "MAGRPOConfig", "mappo": "MAPPOConfig"}


def train_configs() -> dict[str, type]:
    """The config class of each trainer, by algorithm name (the configs import no torch)."""
    from trainers.magrpo.config import MAGRPOConfig
    from trainers.mappo.config import MAPPOConfig

    return {"magrpo": MAGRPOConfig, "mappo": MAPPOConfig}


def trainer_class(algorithm: str) -> type:
    """The trainer of ``algorithm`` (imports torch and transformers)."""
    if algorithm == "magrpo":
        from trainers.magrpo import MAGRPOTrainer

        return MAGRPOTrainer
    from trainers.mappo import MAPPOTrainer

    return MAPPOTrainer


def cmd_train(args: argparse.Namespace) -> int:
    """Train a team with MAGRPO or MAPPO on an env: field defaults < --config YAML < flags < --set."""
    from llm_marl_envs.registry import spec
    from trainers.common.arguments import config_from_args, parse_overrides

    config = config_from_args(train_configs()[args.algorithm], args, recipe=args.config,
                              overrides=parse_overrides(args.set or []))
    spec(args.env)                           # an unknown env id is refused before anything heavy loads
    env, eval_env = train_and_eval_envs(args)
    config = prepare_output_dir(args, config)
    args.run_output_dir = config.output_dir          # for the message of an interrupted run
    agents = env.possible_agents
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from .models import load
    from .team import Team

    if args.full_finetune:
        team = Team.separate([load(args.model) for _ in agents], agents, names=[args.model] * len(agents))
    else:
        model, tokenizer = load(args.model)
        team = Team.adapter_per_agent(model, tokenizer, agents, name=args.model)
    trainer = trainer_class(args.algorithm)(env, team, config, eval_env=eval_env)
    trainer.train()
    result = None if args.no_eval else trainer.evaluate()
    if trainer.distributed.is_main:          # under `accelerate launch` every process runs this command
        from llm_marl.report import counted

        print(f"trained {args.algorithm} on {args.env} ({counted(len(agents), 'agent')}, "
              f"{counted(env.num_turns, 'turn')}); "
              f"outputs in {config.output_dir}")
        if result is not None:
            print(format_held_out(result, args.eval_split, config.output_dir, trainer.step))
    return 0


def prepare_output_dir(args: argparse.Namespace, config: Any) -> Any:
    """Resume the run in ``config.output_dir`` when it is this command's, refuse when it is another's, clear it on
    ``--overwrite`` (:func:`trainers.common.run_dir.prepare_run_dir`); the config to train with."""
    import dataclasses
    import os

    from trainers.common.run_dir import prepare_run_dir, resume_command

    record = {"command": resume_command(args.argv), "algorithm": args.algorithm, "env": args.env,
              "model": args.model, "full_finetune": args.full_finetune, "eval_split": args.eval_split,
              "env_args": env_arguments(args), "config": config.to_dict()}
    main_process = os.environ.get("RANK", "0") == "0"      # under `accelerate launch`, one process writes
    plan = prepare_run_dir(config.output_dir, record, overwrite=args.overwrite, write=main_process,
                           resume_given=config.resume_from_checkpoint is not None)
    if plan.message and main_process:
        print(f"llm-marl train: {plan.message}", file=sys.stderr)
    if plan.resume is not None:
        config = dataclasses.replace(config, resume_from_checkpoint=str(plan.resume))
    return config


def format_held_out(result: Any, split: str, output_dir: str, step: int) -> str:
    """The held-out score of a trained team, with its 95% CIs and the evaluation report's path."""
    from trainers.common.evaluation import eval_report_path

    low, high = result.team_reward_ci
    lines = [f"held-out ({split} split, {result.num_episodes} episodes, step {step}): team reward "
             f"{result.team_reward:.3f} [{low:.3f}, {high:.3f}] (95% CI)"]
    if result.accuracy_per_turn is not None:
        turns = ", ".join(f"{m:.3f} [{lo:.3f}, {hi:.3f}]"
                          for m, (lo, hi) in zip(result.accuracy_per_turn, result.accuracy_per_turn_ci))
        lines.append(f"  accuracy per turn: {turns}")
    lines.append(f"  report: {eval_report_path(output_dir, step)}")
    return "\n".join(lines)


def train_and_eval_envs(args: argparse.Namespace) -> tuple[Any, Any]:
    """The env to train on (``--split``, default ``train``) and to evaluate on (``--eval-split``, default ``test``)."""
    from llm_marl_envs.registry import make

    kwargs = env_arguments(args)
    train_split = kwargs.pop("split", "train")
    if train_split == args.eval_split:
        raise UserError(f"--split and --eval-split are both {train_split!r}: evaluation would replay training tasks; "
                        f"pick another --eval-split")
    return make(args.env, split=train_split, **kwargs), make(args.env, split=args.eval_split, **kwargs)


def env_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """Env keyword arguments given on the command line (agents, turns, data directory, split)."""
    given = {"num_agents": args.num_agents, "num_turns": args.num_turns, "data_dir": args.data_dir, "split": args.split}
    return {k: v for k, v in given.items() if v is not None}


# ---------------------------------------------------------------------------------- export
def cmd_export(args: argparse.Namespace) -> int:
    """Write a trained checkpoint as a folder to publish: PEFT adapters, team.json and a model card."""
    from .export import export_checkpoint
    from .team_checkpoint import read_manifest

    out = export_checkpoint(args.checkpoint, args.dir)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    env = (read_manifest(out).get("env") or {}).get("id") or "ENV"
    print(f"exported {args.checkpoint} to {out}: {', '.join(files)}\n"
          f"  publish it: hf upload USER/NAME {out}\n"
          f"  replay it:  llm-marl bench {env} --checkpoint {out}")
    return 0


# ---------------------------------------------------------------------------------- info
def cmd_info(args: argparse.Namespace) -> int:
    """Print versions, CPU features, threads, backend choices, directories and sandbox isolation."""
    from llm_marl.info import environment_report, format_report

    print(format_report(environment_report()))
    return 0


# ---------------------------------------------------------------------------------- parser
def add_env_arguments(parser: argparse.ArgumentParser, split_help: str = "dataset split (default: the env's)") -> None:
    """The env options shared by ``bench`` and ``train``."""
    parser.add_argument("--num-agents", type=int, default=None, help="agents N (default: the env's)")
    parser.add_argument("--num-turns", type=int, default=None, help="turns T (default: the env's)")
    parser.add_argument("--data-dir", default=None, help="local JSONL data directory (else $LLM_MARL_DATA_DIR)")
    parser.add_argument("--split", default=None, help=split_help)


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


class TrainParser(argparse.ArgumentParser):
    """The parser of ``llm-marl train ALGORITHM``: the config's fields become flags when it parses.

    So only ``train`` imports the config classes; ``llm-marl --help`` and the other commands do not.
    """

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if not any(group.title.endswith("Config fields") for group in self._action_groups):
            from trainers.common.arguments import add_config_arguments

            algorithm = self.prog.split()[-1]
            add_config_arguments(self, train_configs()[algorithm], flags={"output_dir": ["--output-dir", "--out"]})
        return super().parse_known_args(args, namespace)


def add_train_parser(sub: Any) -> None:
    """``llm-marl train ALGORITHM ENV``: the command's own options and one flag per field of the trainer's config."""
    train = sub.add_parser("train", help="train a team with MAGRPO or MAPPO",
                           description="Train a team on an env with MAGRPO or MAPPO. `llm-marl train ALGORITHM "
                                       "--help` lists every field of its config with its default and help.")
    algorithms = train.add_subparsers(dest="algorithm", required=True, parser_class=TrainParser)
    for algorithm, config_name in TRAINER_CONFIGS.items():
        parser = algorithms.add_parser(
            algorithm, help=f"train with {algorithm.upper()} ({config_name})", allow_abbrev=False,
            usage=f"llm-marl train {algorithm} ENV [--config FILE.yaml] [--set KEY=VALUE] [--FIELD VALUE] [options]",
            description=f"Train a team on ENV with {algorithm.upper()}. The {config_name} fields are set by "
                        f"their defaults, then a YAML file of fields (--config), then their flags, then --set "
                        f"key=value (values are coerced to each field's type). Trains on --split, evaluates "
                        f"on --eval-split.")
        parser.add_argument("env", help="environment id (see `llm-marl envs`), or my_module:MyEnv-v0 for an env "
                            "that my_module registers (the current folder is searched too)")
        parser.add_argument("--model", default=DEFAULT_MODEL,
                            help=f"base model: embedded name or local HF directory (default: {DEFAULT_MODEL})")
        parser.add_argument("--config", default=None, metavar="FILE.yaml",
                            help=f"a YAML file of {config_name} fields (e.g. examples/configs/)")
        parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                            help="set one config field, after --config and the flags (repeatable)")
        parser.add_argument("--threads", type=positive_int, default=None, metavar="N",
                            help="torch threads (default: torch's choice)")
        parser.add_argument("--full-finetune", action="store_true", help="one full model copy per agent (default: "
                            "one shared frozen base, a LoRA adapter per agent)")
        add_env_arguments(parser, split_help="dataset split to train on (default: train)")
        parser.add_argument("--eval-split", default="test", help="dataset split evaluate() plays, held out from "
                            "training (default: test)")
        parser.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation at the end (by "
                            "default the trained team plays eval_tasks tasks of --eval-split and the command prints "
                            "its score with a 95%% CI and the report's path)")
        parser.add_argument("--overwrite", action="store_true", help="delete the run already in --out (checkpoints, "
                            "metrics, logs) and start over. Without it, the same command on a directory holding its "
                            "run resumes from the newest checkpoint, and a command with another config is refused")
        parser.set_defaults(func=cmd_train)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``llm-marl`` and its subcommands."""
    parser = argparse.ArgumentParser(prog="llm-marl", description="Multi-agent LLM environments: list, benchmark, "
                                     "train, report.")
    sub = parser.add_subparsers(dest="command", required=True)

    envs = sub.add_parser("envs", help="list registered environments", description="List registered environments "
                          "with their default agents, turns, data source and verifier.")
    envs.set_defaults(func=cmd_envs)

    bench = sub.add_parser("bench", help="benchmark a model or team on an env",
                           description="Run baseline episodes (single agent, majority vote at a matched token budget, "
                                       "debate, mixed teams) and write episodes.jsonl, summary.json, report.md, "
                                       "report.html and plots to --out; several baselines share the tasks and "
                                       "get one comparison report. Re-running with the same --out resumes.")
    bench.add_argument("env", help="environment id (see `llm-marl envs`), or my_module:MyEnv-v0 for an env that "
                       "my_module registers (the current folder is searched too)")
    team = bench.add_mutually_exclusive_group()
    team.add_argument("--model", default=None, help=f"model for every agent: embedded name, .gguf file, local HF "
                      f"directory or served model id (default: {DEFAULT_MODEL})")
    team.add_argument("--models", default=None, help="comma-separated models, one per agent (a mixed team)")
    bench.add_argument("--backend", choices=["hf", "llamacpp", "openai"], default=None,
                       help="inference backend (default: llamacpp for embedded/.gguf models, else hf)")
    bench.add_argument("--base-url", default=None, help="OpenAI-compatible server URL for --backend openai, "
                       "e.g. http://127.0.0.1:8000/v1")
    bench.add_argument("--baseline", default="debate", metavar="B[,B...]",
                       help="single: 1 agent 1 turn; majority: N*T independent samples voted; "
                       "debate (or team): N agents x T turns; checkpoint: the trained team of --checkpoint, N x T; "
                       "on envs whose agents hold private views (split_arithmetic-v0, ...): own_view, each role "
                       "alone with its own view, and full_view, one agent with every view, 1 turn each. "
                       "Several, comma-separated (e.g. single,majority,debate), run on the same tasks and write one "
                       "comparison report (default: debate; --checkpoint adds checkpoint)")
    bench.add_argument("--checkpoint", default=None, metavar="DIR",
                       help="a trained team: a training output_dir, its checkpoints/ dir (the newest step is used) "
                       "or one checkpoints/step-* dir. Adds the baseline 'checkpoint' (each agent with its trained "
                       "weights) to --baseline; the other baselines run the checkpoint's base model, untrained. "
                       "Needs --backend hf (the default with it); --model, if given, must be the base it was "
                       "trained on; --num-agents defaults to the checkpoint's agents and --num-turns to its "
                       "training turns when ENV is the env it was trained on, and a team trained in a debate that "
                       "shows each answer's verifier score (show_scores) is played in one, as are the baselines")
    bench.add_argument("--base-model", default=None, metavar="DIR",
                       help="where the --checkpoint's base model is now, when the local directory it was trained "
                       "from moved (a team trained on one base model); every baseline runs it")
    bench.add_argument("--episodes", type=int, default=20, help="number of episodes (tasks) (default: 20)")
    add_env_arguments(bench)
    bench.add_argument(
        "--seed", type=int, default=0, help="seed of task order, sampling and bootstrap CIs (default: 0)"
    )
    bench.add_argument("--out", default=None, help="run directory (default: runs/bench/ENV-BASELINES-seedSEED)")
    bench.add_argument("--max-new-tokens", type=int, default=256, help="tokens per answer (default: 256)")
    bench.add_argument("--temperature", type=float, default=0.7, help="sampling temperature, 0 = greedy (default: 0.7)")
    bench.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling mass (default: 0.9)")
    bench.add_argument(
        "--episodes-per-batch", type=int, default=4, help="episodes advanced together per batch (default: 4)"
    )
    bench.add_argument("--threads", type=int, default=None,
                       help="llamacpp threads (default: cores not busy with other processes)")
    bench.add_argument("--weights", choices=["shipped", "f16", "q8_0", "f32"], default=None,
                       help="llama.cpp weight type: the GGUF as shipped, or converted once and cached (default: f16 "
                       "for an embedded model, 1.74x the shipped Q4_1's speed on AVX2; a .gguf file as given)")
    bench.add_argument("--quiet", action="store_true", help="no progress bar")
    bench.set_defaults(func=cmd_bench)

    add_train_parser(sub)

    report = sub.add_parser("report", help="rebuild the report of a bench run directory",
                            description="Recompute summary.json, report.md, report.html and plots from "
                                        "episodes.jsonl (of every baseline, for a comparison directory).")
    report.add_argument("dir", help="a bench run directory (its --out)")
    report.set_defaults(func=cmd_report)

    export = sub.add_parser("export", help="write a trained checkpoint as a folder to publish on the Hub",
                            description="Write CHECKPOINT's agents (each LoRA agent a PEFT adapter folder that "
                                        "PeftModel.from_pretrained loads), its team.json and a model card README.md "
                                        "(env, config, held-out result, how to load and replay) into DIR, ready "
                                        "for `hf upload USER/NAME DIR`; `llm-marl bench ENV --checkpoint DIR` "
                                        "replays it.")
    export.add_argument("checkpoint", help="a training output_dir, its checkpoints/ dir (the newest step is used) "
                        "or one checkpoints/step-* dir")
    export.add_argument("dir", help="the folder to write (must not exist, or be empty)")
    export.set_defaults(func=cmd_export)

    info = sub.add_parser("info", help="describe this machine and installation (for bug reports)",
                          description="Print Python and package versions, the CPU and its features (AVX2, AVX-512, "
                                      "AMX), threads, the llama.cpp buffer choice and probe verdict, the data and "
                                      "cache directories and the sandbox's isolation layers.")
    info.set_defaults(func=cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``llm-marl`` console script."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    if ":" in str(getattr(args, "env", "")) and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # "my_module:MyEnv-v0" finds my_module here, as `python -m` would
    try:
        return args.func(args)
    # missing data (DataNotFoundError) is a FileNotFoundError, an unreachable server a ConnectionError
    except (UserError, ValueError, FileNotFoundError, ConnectionError) as err:
        print(f"llm-marl {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"llm-marl {args.command}: {interrupted_message(args)}", file=sys.stderr)
        return 130


def interrupted_message(args: argparse.Namespace) -> str:
    """What an interrupted command says: for ``train``, the exact command that resumes it and from where."""
    if args.command != "train":
        return "interrupted; re-run the same command to resume"
    from trainers.common.run_dir import interrupted_message as run_interrupted
    from trainers.common.run_dir import resume_command

    out = getattr(args, "run_output_dir", None)
    if out is None:
        return "interrupted before the run started"
    return run_interrupted(out, resume_command(args.argv))


if __name__ == "__main__":
    sys.exit(main())
