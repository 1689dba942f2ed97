"""The arm runner shared by the studies (``studies.arms``)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

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


def run_arm_or_die(arm: str, config, out: Path, evaluator, *, log):
    """Arm ``a`` dies as an out-of-memory kill would end it, ``r`` raises, ``big`` logs 1 MB; the rest run
    (module level: a spawned worker imports it by name)."""
    import signal

    if arm == "a":
        os.kill(os.getpid(), signal.SIGKILL)
    if arm == "r":
        raise ValueError("a bad setting of arm r")
    if arm == "big":
        for i in range(20_000):                  # far more than a pipe's buffer: the study must read as it comes
            log(f"line {i:05d} " + "x" * 40)
    return run_arm(arm, config, out, evaluator, log=log)


def test_a_worker_that_dies_takes_only_its_own_arm_and_is_named(tmp_path):
    """One arm's worker killed (SIGKILL) and another's raising: every other arm still runs and keeps its record,
    the error names both failed arms and why, and the same call again runs only those two."""
    from studies.arms import ArmsFailed

    config = SimpleNamespace(arms=("a", "b", "r", "big", "c"))
    lines: list[str] = []
    with pytest.raises(ArmsFailed) as raised:
        run_arms(config, tmp_path, finished_arm=finished_arm, run_arm=run_arm_or_die, make_evaluator=make_evaluator,
                 in_workers=lambda pending: [arm for arm in pending if arm != "c"], jobs=2, threads_per_job=1,
                 log=lines.append)
    assert set(raised.value.failed) == {"a", "r"}
    message = str(raised.value)
    assert "a: its worker was killed by SIGKILL" in message
    assert "r: it raised ValueError: a bad setting of arm r" in message
    assert "resumes the failed arms" in message
    for arm in ("b", "big", "c"):                         # c runs in this process after the workers
        assert finished_arm(config, tmp_path, arm) is not None, arm
    assert not _record_path(tmp_path, "a").exists() and not _record_path(tmp_path, "r").exists()
    assert any(line.startswith("line 19999 ") for text in lines for line in text.splitlines())
    assert finished_arm(config, tmp_path, "c")["pid"] == os.getpid()
    again: list[str] = []
    records = run_arms(config, tmp_path, finished_arm=finished_arm, run_arm=run_arm, make_evaluator=make_evaluator,
                       in_workers=every_arm, jobs=2, threads_per_job=1, log=again.append)
    assert set(records) == set(config.arms)
    assert any(line.startswith("running 2 arms, 2 at a time") and line.endswith(": a, r") for line in again)
    ran = [line.split(":")[0] for line in again if ": ran in " in line]
    assert sorted(ran) == ["a", "r"], again


@pytest.mark.parametrize("study", ["information_split", "collaboration"])
def test_the_study_command_names_the_failed_arms_without_a_traceback(study, tmp_path, monkeypatch):
    """The command ends with ``error: ...`` naming the arm and how to resume, and a non-zero exit."""
    import importlib
    import sys

    from studies.arms import ArmsFailed

    command = importlib.import_module(f"studies.{study}.run")

    def dies(*args, **kwargs):
        raise ArmsFailed({"mappo": "its worker was killed by SIGKILL"}, tmp_path)

    monkeypatch.setattr(command, "run_study", dies)
    monkeypatch.setattr(sys, "argv", ["run", "--out", str(tmp_path), "--jobs", "1"])
    with pytest.raises(SystemExit) as exited:
        command.main()
    assert str(exited.value).startswith("error: 1 arm(s) did not finish: mappo: its worker was killed by SIGKILL")
