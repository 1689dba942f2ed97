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


def run_arm_until_stopped(arm: str, config, out: Path, evaluator, *, log):
    """Writes its pid, then runs far longer than any test (module level: a spawned worker imports it by name)."""
    import time

    (out / f"{arm}.pid").write_text(str(os.getpid()))
    time.sleep(600)
    return {"arm": arm}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                     # a zombie waiting for its new parent to reap it counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_the_workers_stop_when_the_study_process_is_killed(tmp_path):
    """A killed study must not leave its arms training on as orphans (they keep their cores and memory)."""
    import signal
    import subprocess
    import sys
    import time

    script = ("import sys; from pathlib import Path; from types import SimpleNamespace; "
              "from studies.arms import run_arms; from tests.studies import test_arms as t; "
              "run_arms(SimpleNamespace(arms=('a', 'b')), Path(sys.argv[1]), finished_arm=t.finished_arm, "
              "run_arm=t.run_arm_until_stopped, make_evaluator=t.make_evaluator, in_workers=t.every_arm, jobs=2, "
              "threads_per_job=1, log=print)")
    root = Path(__file__).resolve().parents[2]
    study = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=root,
                             env={**os.environ, "PYTHONPATH": str(root)})
    try:
        files = [tmp_path / "a.pid", tmp_path / "b.pid"]
        deadline = time.monotonic() + 120                # two spawned interpreters importing torch, on a busy machine
        while not all(f.is_file() and f.read_text() for f in files):
            assert time.monotonic() < deadline and study.poll() is None, "the workers never started"
            time.sleep(0.2)
        workers = [int(f.read_text()) for f in files]
        assert all(_alive(pid) for pid in workers)
        study.send_signal(signal.SIGKILL)            # no clean-up runs in the study process
        study.wait()
        deadline = time.monotonic() + 60             # the watch looks once a second
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in workers), "a worker outlived the killed study"
    finally:
        study.kill()
        for f in (tmp_path / "a.pid", tmp_path / "b.pid"):
            if f.is_file() and f.read_text():
                try:
                    os.kill(int(f.read_text()), signal.SIGKILL)
                except ProcessLookupError:
                    pass
