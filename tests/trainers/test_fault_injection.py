"""Kill at random moments, lose nothing: MAGRPO, MAPPO and benchmark runs SIGKILLed and resumed.

Each run (``tests/fault_worker.py``, a tiny model) is first played uninterrupted. Then the same run
is started in a fresh directory and killed, in each chain of kills: at random moments (a timer, from the
moment its set-up is done) and in the middle of its writes (the worker half-writes the chosen
checkpoint file or log line, then SIGKILLs itself). After every kill the same command starts
again and resumes from what the directory holds, until a start finishes. The result must be the
uninterrupted one: the same final weights, bit for bit, and the same per-step losses for the
trainers; the same ``episodes.jsonl`` records for the benchmark (wall times aside); and no torn
line or half-written checkpoint left behind.

The default run kills each of the three twice (once mid-write, then at a random moment), the
three side by side; ``-m slow`` runs a longer schedule. ``LLM_MARL_FAULT_SEED`` picks the
random moments (printed on failure).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.fault_worker import MAX_STEPS

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("LLM_MARL_FAULT_SEED", "16"))
RUN_TIMEOUT_S = 600


@dataclass(frozen=True)
class Kill:
    """One interrupted start: die mid-write at ``fault`` (``point:n``), or by a timer ``after`` the run's
    uninterrupted active time times this fraction."""

    fault: str | None = None
    after: float | None = None


def launch(kind: str, output_dir: Path, fault: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "LLM_MARL_FAULT": fault or ""}
    log = open(output_dir.parent / f"{output_dir.name}.log", "a")
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "fault_worker.py"), kind, str(output_dir)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)


def wait_ready(process: subprocess.Popen) -> float:
    """Block until the worker says its set-up is done; the monotonic time it did."""
    for line in process.stdout:
        if line.strip() == "ready":
            return time.monotonic()
    return time.monotonic()     # exited before: the return code tells


def run_to_end(kind: str, output_dir: Path) -> float:
    """Start the run (resuming what is there) and let it finish; its active time (after set-up)."""
    process = launch(kind, output_dir)
    ready = wait_ready(process)
    code = process.wait(timeout=RUN_TIMEOUT_S)
    assert code == 0, f"{kind} run in {output_dir} failed ({code}); see {output_dir}.log:\n{log_tail(output_dir)}"
    return time.monotonic() - ready


def log_tail(output_dir: Path) -> str:
    return (output_dir.parent / f"{output_dir.name}.log").read_text(errors="replace")[-3000:]


def play_kill(kind: str, output_dir: Path, kill: Kill, active_s: float, rng: random.Random) -> str:
    """One start that is meant to die; returns what happened (``killed ...`` or ``finished``)."""
    process = launch(kind, output_dir, kill.fault)
    ready = wait_ready(process)
    if kill.after is not None:
        delay = kill.after * active_s * rng.uniform(0.8, 1.2)
        try:
            process.wait(timeout=max(0.0, ready + delay - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
    code = process.wait(timeout=RUN_TIMEOUT_S)
    if code == -signal.SIGKILL:
        return f"killed {'mid-write at ' + kill.fault if kill.fault else f'after {kill.after:.2f} of the run'}"
    assert code == 0, f"{kind} start with {kill} failed ({code}):\n{log_tail(output_dir)}"
    return "finished"


# ------------------------------------------------------------------ what must match
def without_timings(record: dict) -> dict:
    """A record less its wall-clock fields (``*_s``, ``*_per_s``, ``time/*``), which no rerun reproduces."""
    return {k: v for k, v in record.items() if not k.endswith("_s") and not k.startswith("time/")}


def trainer_result(output_dir: Path) -> dict:
    """Final weights of every agent (and the critic) plus the per-step metrics of a trainer run."""
    final = output_dir / "checkpoints" / f"step-{MAX_STEPS:06d}"
    weights = {path.parent.name: load_file(str(path))
               for path in sorted((final / "agents").glob("*/adapter_model.safetensors"))}
    extra = torch.load(final / "trainer_state.pt", weights_only=False)["extra"]
    if "critic" in extra:
        weights["critic"] = extra["critic"]
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return {"weights": weights, "metrics": [without_timings(json.loads(line)) for line in lines]}


def bench_result(output_dir: Path) -> dict:
    lines = (output_dir / "episodes.jsonl").read_text().splitlines()
    return {"episodes": [without_timings(json.loads(line)) for line in lines]}


def assert_same(kind: str, got: dict, want: dict) -> None:
    if kind == "bench":
        assert [r["episode"] for r in got["episodes"]] == [r["episode"] for r in want["episodes"]]
        assert got["episodes"] == want["episodes"]
        return
    assert [r["step"] for r in got["metrics"]] == list(range(1, MAX_STEPS + 1))          # each step logged once
    assert got["metrics"] == want["metrics"]
    assert got["weights"].keys() == want["weights"].keys()
    for name, tensors in want["weights"].items():
        assert tensors.keys() == got["weights"][name].keys()
        different = [k for k in tensors if not torch.equal(tensors[k], got["weights"][name][k])]
        assert different == [], f"{name}: {len(different)} tensors differ, e.g. {different[:3]}"


def leftovers(output_dir: Path) -> list[str]:
    """Temp files and dirs a finished run must not leave behind."""
    return sorted(str(p.relative_to(output_dir)) for p in output_dir.rglob(".*") if p.name not in (".", ".."))


RESULTS = {"magrpo": trainer_result, "mappo": trainer_result, "bench": bench_result}


def kill_and_resume(kind: str, tmp_path: Path, chains: list[list[Kill]], seed: int) -> list[list[str]]:
    """Play ``kind`` uninterrupted, then once per chain of kills (each in a fresh directory) and finish it;
    check every result matches the uninterrupted one; the outcomes of each chain's kills."""
    rng = random.Random(f"{seed}-{kind}")
    reference = tmp_path / f"{kind}-reference"
    active_s = run_to_end(kind, reference)
    want = RESULTS[kind](reference)
    outcomes = []
    for number, kills in enumerate(chains):
        interrupted = tmp_path / f"{kind}-killed-{number}"
        outcomes.append([play_kill(kind, interrupted, kill, active_s, rng) for kill in kills])
        run_to_end(kind, interrupted)
        context = f"{kind}, seed {seed}, kills {list(zip(kills, outcomes[-1]))}"
        try:
            assert_same(kind, RESULTS[kind](interrupted), want)
        except AssertionError as error:
            raise AssertionError(f"{context}: the resumed run differs: {error}") from None
        assert leftovers(interrupted) == [], context
    return outcomes


def random_moments(rng: random.Random, count: int) -> list[Kill]:
    """Timer kills early enough in a start that they land before it finishes (most of the time)."""
    return [Kill(after=rng.uniform(0.05, 0.8)) for _ in range(count)]


def run_all(tmp_path: Path, schedules: dict[str, list[list[Kill]]]) -> dict[str, list[list[str]]]:
    """The three kinds side by side (one torch thread each), their chains one after the other."""
    with ThreadPoolExecutor(len(schedules)) as pool:
        futures = {kind: pool.submit(kill_and_resume, kind, tmp_path, chains, SEED)
                   for kind, chains in schedules.items()}
        return {kind: future.result() for kind, future in futures.items()}


def assert_landed(schedules: dict[str, list[list[Kill]]], outcomes: dict[str, list[list[str]]]) -> dict[str, int]:
    """Every mid-write kill fired (each opens its chain, so its write comes); the kills that landed per kind."""
    for kind, chains in schedules.items():
        for kills, results in zip(chains, outcomes[kind]):
            mid_write = [o for kill, o in zip(kills, results) if kill.fault]
            assert all(o.startswith("killed mid-write") for o in mid_write), (kind, results)
    return {kind: sum(o.startswith("killed") for results in chains for o in results)
            for kind, chains in outcomes.items()}


@pytest.mark.ci_slow
def test_killed_runs_resume_to_the_uninterrupted_result(tmp_path):
    rng = random.Random(SEED)
    schedules = {       # one chain each: mid-write first (its write always comes), then a random moment
        "magrpo": [[Kill(fault="checkpoint:7"), *random_moments(rng, 1)]],      # 5 files each: inside checkpoint 2
        "mappo": [[Kill(fault="metrics:2"), *random_moments(rng, 1)]],
        "bench": [[Kill(fault="episodes:4"), *random_moments(rng, 1)]],         # mid-batch: episode 3 of batch [2, 3]
    }
    assert_landed(schedules, run_all(tmp_path, schedules))


@pytest.mark.slow
def test_killed_many_times_at_every_kind_of_write_and_at_random_moments(tmp_path):
    rng = random.Random(SEED + 1)
    trainer_writes = ("checkpoint:1", "checkpoint:4", "publish:1", "metrics:1", "checkpoint:7", "publish:2")
    bench_writes = ("episodes:1", "episodes:2", "episodes:4")
    schedules = {kind: [[Kill(fault=fault), *random_moments(rng, 1)] for fault in writes] + [random_moments(rng, 3)]
                 for kind, writes in (("magrpo", trainer_writes), ("mappo", trainer_writes), ("bench", bench_writes))}
    outcomes = run_all(tmp_path, schedules)
    landed = assert_landed(schedules, outcomes)
    timers = {kind: landed[kind] - sum(1 for chain in chains for kill in chain if kill.fault)
              for kind, chains in schedules.items()}
    print(f"kills injected: {({k: sum(map(len, c)) for k, c in schedules.items()})}, landed: {landed} "
          f"({timers} by timer), every resume matched; outcomes {outcomes}")
    assert all(count >= 1 for count in timers.values()), timers


# ------------------------------------------------------------------ the two repairs, in-process and fast
def test_metrics_logger_replaces_the_steps_a_resumed_run_replays_and_drops_a_torn_line(tmp_path):
    from trainers.common.logging import MetricsLogger, read_metrics

    first = MetricsLogger(tmp_path, report_to=("jsonl",))
    for step in (1, 2, 3):
        first.log({"loss": float(step)}, step)
    first.close()
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 4, "lo')                       # killed mid-line
    resumed = MetricsLogger(tmp_path, report_to=("jsonl",))    # resumed from the checkpoint of step 2
    resumed.log({"loss": 30.0}, 3)
    resumed.log({"loss": 40.0}, 4)
    resumed.close()
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0},
                                      {"step": 3, "loss": 30.0}, {"step": 4, "loss": 40.0}]


def test_a_benchmark_batch_cut_short_runs_again_whole_and_matches_the_uninterrupted_run(tmp_path):
    from llm_marl.backends.hf import HFPolicy
    from llm_marl.benchmark import BenchConfig, run_benchmark
    from llm_marl.models import tiny_model

    policy = HFPolicy(*tiny_model(seed=0), name="tiny")
    config = BenchConfig(env_id="gsm_symbolic_debate-v0", models=["tiny"], backend="hf", num_agents=2, num_turns=1,
                         episodes=4, seed=3, max_new_tokens=4, episodes_per_batch=2, env_kwargs={"num_tasks": 20})
    run_benchmark(config, tmp_path / "straight", policies={"tiny": policy}, progress=False)
    run_benchmark(config, tmp_path / "cut", policies={"tiny": policy}, progress=False)
    lines = (tmp_path / "cut" / "episodes.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "cut" / "episodes.jsonl").write_text("".join(lines[:3]) + lines[3][:25])  # episode 3 torn
    calls = policy.generate_calls
    run_benchmark(config, tmp_path / "cut", policies={"tiny": policy}, progress=False)
    assert policy.generate_calls - calls == 1                  # batch [2, 3] again (one turn), not [3] alone
    assert bench_result(tmp_path / "cut") == bench_result(tmp_path / "straight")
