"""Committed text describes the project, not the machine or the history it was written in.

- No tracked text file names an absolute path of a particular machine: a scratch or run folder under
  the filesystem root used for work, ``/tmp/<name>``, a path in root's or a user's home directory
  (``/home/<user>``, ``/Users/<user>``). System paths code needs (``/proc``, ``/dev/null``, ``/usr/bin``, ``/sys``) are
  not machine-specific and are not matched; the few places that need one of the matched paths are
  listed in ``ALLOWED`` with the reason.
- No docstring or comment of a ``*.py`` file cites a commit (the word followed by a short hash): history
  lives in git.
- No docstring or comment of the packages and the examples narrates a measurement (a date, "measured on ...",
  an estimate with its interval such as ``0.672 [0.608, 0.735]``, a signed difference such as ``+0.267``, a
  range of percentages, a timing, a speed-up): code says what it does; what a run gave on one machine goes on
  the documentation's Performance and Results pages, with its command, date, commit and machine.
"""
from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# the path prefixes are assembled so that this file does not match itself
MACHINE_PATH = re.compile(
    r"(?<![\w.~$/-])/(?:" + "|".join([
        "w" + r"ork/",                      # the workspace of the machine the project was written on
        "t" + r"mp/[\w.-]+",                # a scratch folder or file
        "r" + r"oot/",                      # a path inside root's home (the directory itself may be named)
        "h" + r"ome/[\w.-]+",               # a user's home
        "U" + r"sers/[\w.-]+",              # a macOS home
        "s" + r"cratch/",
    ]) + ")"
)
COMMIT_CITATION = re.compile(r"commit [0-9a-f]{7}")
MEASUREMENT = re.compile("|".join([
    r"\b20\d\d-[01]\d-[0-3]\d\b",                                   # a date
    r"(?<!when )\bmeasured\b(?! (?:by|over|again|first)\b)",           # "measured on ...", "Measured: ..."
    r"\d*\.\d+ \[[−+-]?\d*\.\d+, ?[−+-]?\d*\.\d+\]",                # an estimate and its CI
    r"(?<![\w.])[+−]\d*\.\d{2,}\b",                                   # a signed difference
    r"\b\d+(?:\.\d+)?-\d+(?:\.\d+)?%",                                # a range of percentages
    r"\b\d+(?:\.\d+)? ?(?:ms|us|µs)\b|\btook \d",                      # a timing
    r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x (?:faster|slower)\b",        # a speed-up
]), re.IGNORECASE)
NARRATION_FREE = ("llm_marl_envs", "llm_marl", "trainers", "verifiers", "examples")

# (file, the exact text that may appear there, why)
ALLOWED: list[tuple[str, str, str]] = []


def tracked_files() -> list[Path]:
    """Files git tracks in this checkout; the test skips outside a git checkout (e.g. an sdist)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [ROOT / name for name in out.decode().split("\0") if name]


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary (or missing) file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def machine_paths(relative: str, text: str) -> list[str]:
    """``line: path`` for each machine path in ``text`` that ``ALLOWED`` does not cover."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in MACHINE_PATH.finditer(line):
            if not any(name == relative and allowed in line for name, allowed, _ in ALLOWED):
                found.append(f"{relative}:{number}: {match.group(0)}  ({line.strip()[:100]})")
    return found


def docstrings_and_comments(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every docstring and comment of a Python source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                found.append((body[0].lineno, body[0].value.value))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
    return found


def test_path_pattern():
    """What counts as a machine path, and what does not."""
    hits = ["/" + "work/wt/x", "cd /" + "tmp/s31 &&", "/" + "root/.cache", "/" + "home/alice/x", "(/" + "tmp/smoke)"]
    misses = ["e.g. /" + "root, mode 0700", "/proc/cpuinfo", "/dev/null", "/usr/bin/time", "~/.cache/llm_marl_envs", "https://github.com/a/tmp/b",
              "$LLM_MARL_CACHE/models", "runs/compare", "docs/results/x", "a/" + "work/b", "shared/peers"]
    assert all(MACHINE_PATH.search(text) for text in hits), [t for t in hits if not MACHINE_PATH.search(t)]
    assert not any(MACHINE_PATH.search(text) for text in misses), [t for t in misses if MACHINE_PATH.search(t)]


def test_no_machine_paths_in_tracked_text():
    found = []
    for path in tracked_files():
        text = text_of(path)
        if text is not None:
            found += machine_paths(path.relative_to(ROOT).as_posix(), text)
    assert not found, "absolute paths of a machine in tracked files (use a relative path or a variable):\n" + \
        "\n".join(found)


def test_no_commit_citations_in_python_docstrings_or_comments():
    found = []
    for path in tracked_files():
        if path.suffix != ".py" or not path.exists():
            continue
        source = path.read_text(encoding="utf-8")
        for line, text in docstrings_and_comments(source):
            if COMMIT_CITATION.search(text):
                found.append(f"{path.relative_to(ROOT).as_posix()}:{line}: {COMMIT_CITATION.search(text).group(0)}")
    assert not found, "docstrings and comments cite commits (history belongs in git):\n" + "\n".join(found)


def test_measurement_pattern():
    """What counts as narrating a measurement, and what describes code."""
    hits = ["run on 2026-11-26", "measured on a 2-core Xeon", "Measured: splitting", "The measured run",
            "0.672 [0.608, 0.735]", "gain +0.267 on three seeds", "−0.022 on another CPU", "27-45% right",
            "142 ms per call", "took 12.3 s", "1.2-2.2x slower"]
    misses = ["as measured by starting one", "cores left free, measured over the time since", "when measured;",
              "every KL is measured first", "a bootstrap 95% CI", "0.4 + 0.05 * (n - 1)", "lr=2e-4", "seed 0",
              "temperature 0.7", "[0, 1]", "x - 0.5", "v0.1.0", "top-p 0.9"]
    assert all(MEASUREMENT.search(text) for text in hits), [t for t in hits if not MEASUREMENT.search(t)]
    assert not any(MEASUREMENT.search(text) for text in misses), [t for t in misses if MEASUREMENT.search(t)]


def test_no_measurement_narration_in_docstrings_or_comments():
    found = []
    for path in tracked_files():
        relative = path.relative_to(ROOT).as_posix()
        if path.suffix != ".py" or not path.exists() or relative.split("/")[0] not in NARRATION_FREE:
            continue
        for line, text in docstrings_and_comments(path.read_text(encoding="utf-8")):
            for offset, row in enumerate(text.splitlines()):
                for match in MEASUREMENT.finditer(row):
                    found.append(f"{relative}:{line + offset}: {match.group(0)!r}  ({row.strip()[:100]})")
    assert not found, ("docstrings and comments narrate measurements (put them on docs/performance.md or a "
                       "results page, with command, date, commit and machine):\n" + "\n".join(found))
