"""The trainers' optional metric sinks: trackio beside TensorBoard and W&B, and what happens when it is missing."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from trainers.common.logging import MetricsLogger, read_metrics
from trainers.magrpo import MAGRPOConfig
from trainers.mappo import MAPPOConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("config_cls", [MAGRPOConfig, MAPPOConfig])
def test_both_trainers_accept_trackio_as_a_sink(config_cls):
    assert config_cls(report_to=("jsonl", "trackio")).report_to == ("jsonl", "trackio")


def test_trackio_not_installed_is_one_error_naming_the_pip_command_before_anything_is_written(tmp_path,
                                                                                               monkeypatch):
    monkeypatch.setitem(sys.modules, "trackio", None)         # `import trackio` raises ImportError
    with pytest.raises(ValueError) as error:
        MetricsLogger(tmp_path / "run", report_to=("jsonl", "trackio"))
    assert "report_to includes 'trackio' but trackio is not installed" in str(error.value)
    assert "pip install 'llm-marl-envs[trackio]'" in str(error.value)
    assert not (tmp_path / "run").exists()
    MetricsLogger(tmp_path / "other", report_to=("jsonl", "trackio"), enabled=False)   # a process that logs nothing


class RecordingTrackio(types.ModuleType):
    """A stand-in ``trackio`` module that records the calls the logger makes (trackio itself is not installed)."""

    def __init__(self) -> None:
        super().__init__("trackio")
        self.calls: list[tuple] = []

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        return self

    def log(self, metrics, step=None):
        self.calls.append(("log", dict(metrics), step))

    def finish(self):
        self.calls.append(("finish",))


def test_trackio_gets_the_run_config_and_every_steps_numbers(tmp_path, monkeypatch):
    fake = RecordingTrackio()
    monkeypatch.setitem(sys.modules, "trackio", fake)
    logger = MetricsLogger(tmp_path / "my-run", report_to=("jsonl", "trackio"), run_config={"learning_rate": 1e-5})
    logger.log({"loss": 0.5, "turn0/agent_0/grad_norm": 2, "note": "text", "skipped": float("nan")}, step=1)
    logger.log({"loss": 0.25}, step=2)
    logger.close()
    assert fake.calls == [
        ("init", {"project": "llm-marl", "name": "my-run", "config": {"learning_rate": 1e-5}, "resume": "allow",
                  "embed": False}),
        ("log", {"loss": 0.5, "turn0/agent_0/grad_norm": 2.0}, 1),
        ("log", {"loss": 0.25}, 2),
        ("finish",),
    ]
    assert [r["step"] for r in read_metrics(tmp_path / "my-run")] == [1, 2]      # the other sinks still write


TRACKIO_RUN = """
import json, sys
from trainers.common.logging import MetricsLogger
import trackio

for step in (1, 2):                    # a run resumed after step 1 continues the same trackio run
    logger = MetricsLogger(sys.argv[1], report_to=("trackio",), run_config={"seed": 3})
    logger.log({"loss": 1.0 / step}, step=step)
    logger.close()
runs = trackio.Api().runs("llm-marl")
print("RUNS=" + json.dumps([[run.name, run.config.get("seed")] for run in runs]))
"""


def test_trackio_itself_stores_the_run_when_installed(tmp_path):
    if importlib.util.find_spec("trackio") is None:
        pytest.skip("trackio is not installed (pip install 'llm-marl-envs[trackio]')")
    # a process of its own: trackio reads TRACKIO_DIR (where it stores runs) when it is imported
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "store"), "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", TRACKIO_RUN, str(tmp_path / "resumed-run")], env=env,
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RUNS=")]   # trackio prints too
    assert json.loads(line[5:]) == [["resumed-run", 3]]
    assert (tmp_path / "store").is_dir()
