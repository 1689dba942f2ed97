"""Studies sit beside the library: not installed with it, and never imported by it."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("verifiers", "llm_marl_envs", "llm_marl", "trainers")


def test_the_packages_pyproject_installs_hold_no_study():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = pyproject.split("[tool.setuptools.packages.find]", 1)[1]
    include = re.findall(r'"([^"]+)"', re.search(r"include\s*=\s*\[(.*?)\]", section, re.S).group(1))
    installed = find_packages(where=str(ROOT), include=include)
    assert {name.split(".")[0] for name in installed} == set(PACKAGES)
    assert (ROOT / "studies" / "collaboration" / "study.py").is_file()


def test_no_library_module_imports_a_study():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                found += [f"{path.relative_to(ROOT)}: {name}" for name in names if name.split(".")[0] == "studies"]
    assert not found, "library modules import a study (a study imports the library, never the reverse):\n" + \
        "\n".join(found)
