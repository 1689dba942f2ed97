"""The sandbox says so, once and loudly, when it runs without a namespace layer; strict mode refuses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from verifiers import sandbox as code

FULL = {"netns": True, "ipcns": True, "pidns": True, "readonly_fs": True, "userns": False, "drop_uid": True}


@pytest.fixture(autouse=True)
def fresh_warning_state(monkeypatch):
    monkeypatch.setattr(code, "_warned_missing", set())
    monkeypatch.delenv(code.STRICT_ENV, raising=False)


def test_full_isolation_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code.check_isolation(FULL)


def test_missing_layers_warn_once_naming_them():
    caps = {**FULL, "netns": False, "pidns": False}
    with pytest.warns(RuntimeWarning, match=r"WITHOUT \['netns', 'pidns'\].*LLM_MARL_SANDBOX_STRICT=1"):
        code.check_isolation(caps)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code.check_isolation(caps)                                  # the same layers: no second warning
    with pytest.warns(RuntimeWarning, match=r"WITHOUT \['netns', 'pidns', 'readonly_fs'\]"):
        code.check_isolation({**caps, "readonly_fs": False})        # a newly missing layer warns again


@pytest.mark.parametrize("value", ["1", "true"])
def test_strict_mode_refuses_to_run_without_the_layers(monkeypatch, value):
    monkeypatch.setenv(code.STRICT_ENV, value)
    with pytest.raises(code.IsolationError, match=r"cannot set up \['readonly_fs'\].*unset LLM_MARL_SANDBOX_STRICT"):
        code.check_isolation({**FULL, "readonly_fs": False})
    code.check_isolation(FULL)                                      # all layers: strict mode runs


def test_strict_mode_runs_code_where_every_layer_is_available(monkeypatch):
    if code.missing_layers(code.Sandbox().isolation | {"drop_uid": code.Sandbox().isolation["uid_dropped"]}):
        pytest.skip("this machine lacks a sandbox layer; the strict refusal is covered above")
    monkeypatch.setenv(code.STRICT_ENV, "1")
    verdict = code.run_tests("def f():\n    return 1\n", "assert f() == 1", "f")
    assert verdict.score == 1.0


# Run as root of a new user namespace whose limit on IPC namespaces is 0: the kernel refuses the zygote one.
NO_IPC_NAMESPACES = """echo 0 > /proc/sys/user/max_ipc_namespaces && exec "$0" -c '
import json, warnings
from verifiers.sandbox import run_tests
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    verdict = run_tests("def f():\\n    return 1\\n", "assert f() == 1", "f")
print(json.dumps([verdict.score, verdict.details["isolation"], [str(w.message) for w in caught]]))'"""


def test_where_the_kernel_refuses_ipc_namespaces_checks_run_with_the_other_layers_and_a_warning():
    command = ["unshare", "--user", "--map-root-user", "sh", "-c", NO_IPC_NAMESPACES, sys.executable]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(Path(code.__file__).parents[1])})
    except FileNotFoundError:
        pytest.skip("no unshare(1) here")
    if done.returncode != 0 and ("unshare failed" in done.stderr or "max_ipc_namespaces" in done.stderr):
        pytest.skip(f"no user namespace with its own IPC namespace limit here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    score, isolation, warned = json.loads(done.stdout)
    assert score == 1.0
    assert not isolation["ipcns"] and isolation["netns"] and isolation["pidns"] and isolation["readonly_fs"]
    assert any("WITHOUT ['ipcns'" in message for message in warned), warned
