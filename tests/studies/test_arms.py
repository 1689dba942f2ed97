"""The arm runner shared by the studies (``studies.arms``)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

from studies.arms import run_arms


def _record_path(out: Path, arm: str) -> Path:
    return out / "arms" / arm / "arm.json"


def finished_arm(config, out: Path, arm: str):
    path = _record_path(out, arm)
    return json.loads(path.read_text()) if path.is_file() else None


def run_arm(arm: str, config, out: Path, evaluator, *, log):
    """Records the process that ran the arm (module level: a spawned worker imports it by name)."""
    path = _record_path(out, arm)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"arm": arm, "pid": os.getpid()}
    path.write_text(json.dumps(record))
    log(f"{arm}: ran in {os.getpid()}")
    return record


def make_evaluator(config):
    return None


def every_arm(pending: list[str]) -> list[str]:
    return list(pending)


def test_each_parallel_arm_runs_in_a_process_of_its_own(tmp_path):
    """Three arms on two jobs: a worker that ran an arm is not reused, so its memory is freed for the next arm."""
    config = SimpleNamespace(arms=("a", "b", "c"))
    lines: list[str] = []
    records = run_arms(config, tmp_path, finished_arm=finished_arm, run_arm=run_arm, make_evaluator=make_evaluator,
                       in_workers=every_arm, jobs=2, threads_per_job=1, log=lines.append)
    assert any(line.startswith("running 3 arms, 2 at a time") for line in lines)
    pids = [records[arm]["pid"] for arm in config.arms]
    assert len(set(pids)) == 3, pids
    assert os.getpid() not in pids
    again: list[str] = []
    assert run_arms(config, tmp_path, finished_arm=finished_arm, run_arm=run_arm, make_evaluator=make_evaluator,
                    in_workers=every_arm, jobs=2, threads_per_job=1, log=again.append) == records
    assert sum("already done" in line for line in again) == 3
