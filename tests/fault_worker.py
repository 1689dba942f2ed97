"""Subprocess entry of the fault-injection tests: a MAGRPO run, a MAPPO run or a benchmark run on a tiny model.

    python tests/fault_worker.py {magrpo|mappo|bench} OUTPUT_DIR

Each run resumes whatever ``OUTPUT_DIR`` holds (the latest checkpoint, the finished episodes), so
the test starts the same command again after every kill. ``LLM_MARL_FAULT=<point>:<n>`` makes the
process SIGKILL itself in the middle of the ``n``-th write at ``point`` (1-based), leaving that
file half written:

* ``checkpoint`` — a file of a checkpoint (weights, optimizer, trainer state), in its temp dir;
* ``publish`` — just before the rename that publishes a finished checkpoint;
* ``metrics`` — a line of ``metrics.jsonl``;
* ``episodes`` — a line of the benchmark's ``episodes.jsonl``.

The worker prints ``ready`` once its imports and model set-up are done, so the test can time
random kills from the moment the run really starts.
"""
from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

MAX_STEPS = 3
EPISODES, EPISODES_PER_BATCH = 6, 2


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class FaultPoint:
    """Counts the writes at one point and kills the process in the middle of the chosen one."""

    def __init__(self, spec: str | None) -> None:
        point, _, count = (spec or ":0").partition(":")
        self.point, self.remaining = point, int(count)

    def hit(self, point: str) -> bool:
        """True when this write at ``point`` is the one to die in."""
        if point != self.point or self.remaining <= 0:
            return False
        self.remaining -= 1
        return self.remaining == 0


FAULT = FaultPoint(os.environ.get("LLM_MARL_FAULT"))


class TornLineFile:
    """A text file whose chosen ``write`` stops halfway (flushed to disk) and kills the process."""

    def __init__(self, handle: Any, point: str) -> None:
        self._handle, self._point = handle, point

    def write(self, text: str) -> int:
        if FAULT.hit(self._point):
            self._handle.write(text[: max(1, len(text) // 2)])
            self._handle.flush()
            die()
        return self._handle.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __enter__(self) -> TornLineFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.close()


def tear_lines_of(module: Any, file_name: str, point: str) -> None:
    """Make ``module``'s ``open(<...>/file_name, ...)`` return a :class:`TornLineFile`."""
    def open_file(path: Any, *args: Any, **kwargs: Any) -> Any:
        handle = open(path, *args, **kwargs)
        return TornLineFile(handle, point) if Path(path).name == file_name else handle
    module.open = open_file


def tear_checkpoint_writes() -> None:
    """Half-write the chosen checkpoint file, or die just before a checkpoint is published."""
    from llm_marl import team_checkpoint
    from trainers.common import checkpoint

    def half_written(write: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(obj: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
            result = write(obj, path, *args, **kwargs)
            if FAULT.hit("checkpoint"):
                size = os.path.getsize(path)
                os.truncate(path, size // 2)
                die()
            return result
        return wrapped

    team_checkpoint.save_file = half_written(team_checkpoint.save_file)     # each agent's weights
    checkpoint.torch.save = half_written(torch.save)
    rename = os.rename

    def publish(source: Any, target: Any) -> None:
        if Path(target).name.startswith(checkpoint.PREFIX) and FAULT.hit("publish"):
            die()
        rename(source, target)

    checkpoint.os.rename = publish


def run_magrpo(output_dir: str) -> None:
    from llm_marl.models import tiny_model
    from llm_marl.team import Team
    from tests.toy_env import SayNumberEnv
    from trainers.common.checkpoint import latest_checkpoint
    from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, 2)
    config = MAGRPOConfig(num_generations=3, max_new_tokens=6, max_steps=MAX_STEPS, save_every=1, eval_tasks=2,
                          learning_rate=5e-3, kl_coef=0.05, output_dir=output_dir, report_to=("jsonl",),
                          resume_from_checkpoint="latest" if latest_checkpoint(output_dir) else None,
                          progress=False, seed=1)
    trainer = MAGRPOTrainer(SayNumberEnv(num_turns=2), team, config)
    print("ready", flush=True)
    trainer.train()


def run_mappo(output_dir: str) -> None:
    import llm_marl_envs
    from llm_marl.models import tiny_model
    from llm_marl.team import Team
    from trainers.common.checkpoint import latest_checkpoint
    from trainers.mappo import MAPPOConfig, MAPPOTrainer
    from verifiers.reward_model import RewardModel

    torch.manual_seed(0)           # PEFT initialises the LoRA adapters from the global RNG
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, agents=2)
    verifier = RewardModel.from_causal_lm(*tiny_model(seed=1), seed=1, max_length=96)
    env = llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=2, num_tasks=20, split="train")
    config = MAPPOConfig(max_new_tokens=6, episodes_per_step=2, minibatch_size=4, ppo_epochs=2, learning_rate=1e-3,
                         critic_learning_rate=1e-3, max_steps=MAX_STEPS, save_every=1, output_dir=output_dir,
                         progress=False, report_to=("jsonl",), eval_tasks=2, alpha1=0.5, beta1=0.5,
                         resume_from_checkpoint="latest" if latest_checkpoint(output_dir) else None)
    trainer = MAPPOTrainer(env, team, config, verifier=verifier)
    print("ready", flush=True)
    trainer.train()


def run_bench(output_dir: str) -> None:
    from llm_marl.backends.hf import HFPolicy
    from llm_marl.benchmark import BenchConfig, run_benchmark
    from llm_marl.models import tiny_model

    policy = HFPolicy(*tiny_model(seed=0), name="tiny")
    config = BenchConfig(env_id="gsm_symbolic_debate-v0", models=["tiny"], backend="hf", num_agents=2, num_turns=2,
                         episodes=EPISODES, seed=7, max_new_tokens=6, episodes_per_batch=EPISODES_PER_BATCH,
                         env_kwargs={"num_tasks": 20})
    print("ready", flush=True)
    run_benchmark(config, output_dir, policies={"tiny": policy}, progress=False)


RUNS = {"magrpo": run_magrpo, "mappo": run_mappo, "bench": run_bench}


def main() -> None:
    kind, output_dir = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    import llm_marl.benchmark
    import trainers.common.logging

    tear_checkpoint_writes()
    tear_lines_of(trainers.common.logging, "metrics.jsonl", "metrics")
    tear_lines_of(llm_marl.benchmark, "episodes.jsonl", "episodes")
    RUNS[kind](output_dir)


if __name__ == "__main__":
    main()
