"""Imports between our packages run one way, with no cycle between modules:

    verifiers  <-  llm_marl_envs  <-  llm_marl (runtime: models, backends, team, rollout, benchmark)  <-  trainers
        <-  llm_marl.cli (the command line: the top layer)

Checked statically over every import statement, those inside functions included: an import
hidden in a function to dodge a cycle is still a cycle. No module loads one of ours by name
(``importlib.import_module("trainers...")``), which would hide an edge from this check.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["verifiers", "llm_marl_envs", "llm_marl", "trainers"]       # each may import only those before it
TOP = ["llm_marl.cli"]              # modules above every layer: they may import any module, and none imports them


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules that ``path`` imports anywhere in its code (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:            # `from pkg import name`: name may be a symbol
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imports_of(name, path, set(project_modules())) for name, path in project_modules().items()}


def layer(module: str) -> int:
    return len(LAYERS) if module in TOP else LAYERS.index(module.split(".")[0])


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down_the_layers(module):
    upward = sorted(t for t in GRAPH[module] if layer(t) > layer(module))
    assert not upward, f"{module} imports {upward}, which sit above it in {' <- '.join(LAYERS)}"


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the graph's components of more than one module (each a cycle)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_between_modules():
    # a package's __init__ re-exporting its own submodules is not a cycle of ideas: leave those edges out
    graph = {
        m: {t for t in targets if not (GRAPH_IS_INIT[m] and t.startswith(m + "."))} for m, targets in GRAPH.items()
    }
    assert strongly_connected(graph) == []


GRAPH_IS_INIT = {name: path.name == "__init__.py" for name, path in project_modules().items()}


# the modules that load modules by name, and why: the names come from users, not from our packages
LOADS_BY_NAME = {"llm_marl_envs.registry": "an env's entry point 'package.module:Class', as Gymnasium's",
                 "verifiers._sandbox_zygote": "the modules a sandboxed program imports"}


def loads_by_name(path: Path) -> bool:
    """Whether a file calls ``importlib.import_module`` or ``__import__``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) in ("import_module",
                                                                                              "__import__"):
                return True
    return False


def test_only_the_named_modules_load_modules_by_name():
    loading = {name for name, path in project_modules().items() if loads_by_name(path)}
    assert loading <= set(LOADS_BY_NAME), (f"{sorted(loading - set(LOADS_BY_NAME))} load modules by name: import "
                                           f"ours with import statements, which the layering check sees")
    assert loading == set(LOADS_BY_NAME), "the check finds the modules that do"


def test_the_cli_is_the_top_layer():
    assert "trainers.magrpo" in GRAPH["llm_marl.cli"] and "trainers.mappo" in GRAPH["llm_marl.cli"]
    assert "trainers.common.arguments" in GRAPH["llm_marl.cli"]
    assert [m for m, targets in GRAPH.items() if "llm_marl.cli" in targets] == []
    assert layer("llm_marl.cli") > layer("trainers.magrpo.trainer") > layer("llm_marl.team")


def test_the_check_sees_real_imports():
    """The graph is read from the code: known edges are present (guards against a check that reads nothing)."""
    assert "llm_marl_envs.core" in GRAPH["llm_marl.rollout"]
    assert "llm_marl.team" in GRAPH["trainers.common.checkpoint"]
    assert "llm_marl.backends.hf" in GRAPH["llm_marl.rollout"], "an import inside a function is an edge"
    assert len(GRAPH) > 60
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
