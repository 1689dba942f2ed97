"""Test set-up: offline data beside the checkout (../shared/data), a passive OpenMP wait policy, crash
isolation for tests that run native code, and an env registry that each test leaves as it found it.

Tests marked ``native`` (they call llama.cpp's C++ directly) run in a child pytest process of
their own (:func:`pytest_runtest_protocol` below): a segfault in a native kernel then fails that
one test, reported under its name with the signal, instead of killing the whole suite. A fresh
process rather than a fork: forking a process that already runs OpenMP thread pools (torch) can
hang the child.

OpenMP threads that spin-wait collapse when the cores are oversubscribed (another job on a
2-core CI box): a small matmul then takes ~18 ms instead of ~20 us. A passive wait policy
costs little on an idle machine and keeps the suite's time stable on a busy one. It must be
set before torch is imported, hence here.
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ISOLATED_CHILD_ENV = "LLM_MARL_ISOLATED_TEST"

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

if "LLM_MARL_DATA_DIR" not in os.environ and SHARED_DATA.is_dir():
    os.environ["LLM_MARL_DATA_DIR"] = str(SHARED_DATA)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "native: calls native (C/C++) backend code; runs in a child process of its own")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Run a ``native`` test in a child pytest; report its outcome (or the signal that killed it) here."""
    if item.get_closest_marker("native") is None or os.environ.get(ISOLATED_CHILD_ENV):
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in _run_isolated(item):
        item.ihook.pytest_runtest_logreport(report=report)
    # the item never set up here, but the module or class it closes may have: tear those down as a run would
    item.session._setupstate.teardown_exact(nextitem)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _run_isolated(item: pytest.Item) -> list[pytest.TestReport]:
    """Setup, call and teardown reports of ``item`` run as ``python -m pytest NODEID`` in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", item.nodeid, "-m", "", "-q", "-p", "no:cacheprovider",
                   f"--junitxml={junit}"]
        began = time.perf_counter()
        done = subprocess.run(command, cwd=item.config.rootpath, env={**os.environ, ISOLATED_CHILD_ENV: "1"},
                              capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
        duration = time.perf_counter() - began
        output = (done.stdout + done.stderr).strip()
        outcome, when, longrepr = _child_outcome(done.returncode, junit, output, item)

    def report(phase: str, result: str, text=None) -> pytest.TestReport:
        return pytest.TestReport(nodeid=item.nodeid, location=item.location, keywords={k: 1 for k in item.keywords},
                                 outcome=result, longrepr=text, when=phase, sections=[],
                                 duration=duration if phase == when else 0.0)

    if when == "setup":
        return [report("setup", outcome, longrepr), report("teardown", "passed")]
    return [report("setup", "passed"), report("call", outcome, longrepr), report("teardown", "passed")]


def _child_outcome(returncode: int, junit: Path, output: str, item: pytest.Item):
    """``(outcome, phase, longrepr)`` from the child's exit status and JUnit XML."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return "failed", "call", f"the test process CRASHED (killed by {name}); its last output:\n{output[-3000:]}"
    try:
        case = ET.parse(junit).getroot().find(".//testcase")
    except (OSError, ET.ParseError):
        case = None
    if case is None:
        return "failed", "call", f"the isolated test process exited with status {returncode} without a result:\n" \
                                 f"{output[-3000:]}"
    for tag in ("failure", "error"):
        element = case.find(tag)
        if element is not None:
            return "failed", "call", (element.text or element.get("message") or tag)
    skipped = case.find("skipped")
    if skipped is not None:
        path, line = item.location[0], (item.location[1] or 0) + 1
        return "skipped", "setup", (path, line, skipped.get("message") or "skipped")
    return "passed", "call", None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The offline data folder; tests needing it fail (not skip) when it is missing."""
    path = Path(os.environ.get("LLM_MARL_DATA_DIR", SHARED_DATA))
    if not path.is_dir():
        raise RuntimeError(f"offline data not found at {path}; set LLM_MARL_DATA_DIR to ../shared/data")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama with the SmolLM2 tokenizer, saved as a local HF model directory."""
    from llm_marl.models import tiny_model

    model, tokenizer = tiny_model(seed=0)
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def one_torch_thread():
    """Run a test's torch ops on one thread (restored afterwards): tiny-model tests are per-op-overhead bound,
    and on a loaded shared CPU two spinning threads are several times slower than one."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def env_registry_restored():
    """Each test leaves the env registry as it found it: an env a test registers (a custom env module run in
    process) must not show up in a later test's ``list_envs()``."""
    from llm_marl_envs import registry

    before, modules = dict(registry._REGISTRY), set(sys.modules)
    yield
    for env_id in set(registry._REGISTRY) - set(before):
        module = registry._module_of(registry._REGISTRY[env_id].entry_point)
        if module not in modules:
            sys.modules.pop(module, None)     # imported again, it registers its envs again
    registry._REGISTRY.clear()
    registry._REGISTRY.update(before)
