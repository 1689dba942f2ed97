"""Try a native backend in a child process before trusting it in this one.

A crash inside native code (a segfault in a ggml kernel) kills the whole Python process with
no traceback. So the first time llama.cpp is used on a machine, :func:`probe_llamacpp` loads the
model and decodes a few tokens in a child process, with the buffer settings this process would
use, and caches the verdict under ``$LLM_MARL_CACHE/probes``, keyed by llama-cpp-python's
version, the CPU's model and flags, the buffer choice and the model file. Later loads read the
verdict. ``LLM_MARL_NATIVE_PROBE=off`` skips the probe (the backend is then trusted).

    python -m llm_marl.native_probe MODEL.gguf --extra-buffers off     # what the child runs
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from .files import write_text_atomically
from .hardware import BufferChoice, cpu_info
from .models import cache_root

PROBE_ENV = "LLM_MARL_NATIVE_PROBE"
PROBE_TOKENS = 4


@dataclass(frozen=True)
class ProbeVerdict:
    """Whether the child ran the backend to the end; ``cause`` says how it died when it did not."""

    ok: bool
    cause: str
    key: str
    cached: bool = False


def probe_cache_dir() -> Path:
    """Where verdicts are cached: ``$LLM_MARL_CACHE/probes`` (default ``~/.cache/llm_marl_envs/probes``)."""
    return cache_root() / "probes"


def probe_key(model_path: str | os.PathLike, choice: BufferChoice) -> str:
    """A short hash of what decides whether the backend runs: its version, the CPU, the buffers, the model file."""
    try:
        import llama_cpp
        version = getattr(llama_cpp, "__version__", "?")
    except ImportError:
        version = "missing"
    cpu = cpu_info()
    path = Path(model_path)
    size = path.stat().st_size if path.is_file() else -1
    parts = [
        "llamacpp",
        version,
        cpu.model,
        " ".join(sorted(cpu.flags)),
        str(choice.use_extra_bufts),
        path.name,
        str(size),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def probe_command(model_path: str | os.PathLike, use_extra_bufts: bool) -> list[str]:
    """The child's command line: this module's ``main`` on the model, with the given buffer setting."""
    return [sys.executable, "-m", "llm_marl.native_probe", str(model_path),
            "--extra-buffers", "on" if use_extra_bufts else "off"]


def probe_disabled() -> bool:
    """Whether ``$LLM_MARL_NATIVE_PROBE`` switches the probe off (``0``, ``off``, ``false``, ``no``)."""
    return os.environ.get(PROBE_ENV, "").strip().lower() in ("0", "off", "false", "no")


def cached_verdict(model_path: str | os.PathLike, choice: BufferChoice) -> ProbeVerdict | None:
    """The verdict cached for this model, buffer choice, CPU and llama.cpp version, or ``None`` if not probed yet."""
    key = probe_key(model_path, choice)
    try:
        saved = json.loads(_cache_file(key).read_text(encoding="utf-8"))
        return ProbeVerdict(ok=bool(saved["ok"]), cause=str(saved["cause"]), key=key, cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def probe_llamacpp(model_path: str | os.PathLike, choice: BufferChoice, *, timeout_s: float = 300.0) -> ProbeVerdict:
    """The cached verdict for llama.cpp on this machine, probing in a child process the first time."""
    if probe_disabled():
        return ProbeVerdict(ok=True, cause=f"not probed ({PROBE_ENV} is off)", key="")
    saved = cached_verdict(model_path, choice)
    if saved is not None:
        return saved
    key = probe_key(model_path, choice)
    verdict = ProbeVerdict(key=key, **_run_child(probe_command(model_path, choice.use_extra_bufts), timeout_s))
    record = asdict(verdict) | {"model": str(model_path), "use_extra_bufts": choice.use_extra_bufts}
    write_text_atomically(_cache_file(key), json.dumps(record, indent=1))
    return verdict


def _cache_file(key: str) -> Path:
    return probe_cache_dir() / f"llamacpp-{key}.json"


def _run_child(command: list[str], timeout_s: float) -> dict[str, object]:
    """Run ``command``; ``ok`` when it exits 0, else the signal or exit status and its last line of error output."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired:
        return {"ok": False, "cause": f"the probe did not finish in {timeout_s:g} s"}
    if done.returncode == 0:
        return {"ok": True, "cause": ""}
    lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    tail = lines[-1] if lines else ""
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        cause = f"the probe was killed by {name}"
    else:
        cause = f"the probe exited with status {done.returncode}"
    return {"ok": False, "cause": cause + (f" ({tail[:200]})" if tail else "")}


def decode_a_few_tokens(model_path: str, use_extra_bufts: bool, num_tokens: int = PROBE_TOKENS) -> list[int]:
    """Load ``model_path`` in llama.cpp with the given buffer setting and decode ``num_tokens`` greedy tokens."""
    import ctypes

    import llama_cpp

    llama_cpp.llama_backend_init()
    model_params = llama_cpp.llama_model_default_params()
    model_params.use_extra_bufts = use_extra_bufts
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), model_params)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {model_path}")
    context_params = llama_cpp.llama_context_default_params()
    context_params.n_ctx, context_params.n_batch = 128, 128
    context_params.n_threads = context_params.n_threads_batch = 1
    context = llama_cpp.llama_init_from_model(model, context_params)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    text = b"1 + 1 ="
    ids = (llama_cpp.llama_token * 64)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), ids, 64, True, True)
    tokens, out = list(ids[:n]), []
    for _ in range(num_tokens):
        batch_ids = (llama_cpp.llama_token * len(tokens))(*tokens)
        if llama_cpp.llama_decode(context, llama_cpp.llama_batch_get_one(batch_ids, len(tokens))) != 0:
            raise RuntimeError("llama_decode failed")
        logits = llama_cpp.llama_get_logits_ith(context, -1)
        row = (ctypes.c_float * n_vocab).from_address(ctypes.addressof(logits.contents))
        best = max(range(n_vocab), key=row.__getitem__)
        out.append(best)
        tokens = [best]
    llama_cpp.llama_free(context)
    llama_cpp.llama_model_free(model)
    return out


def main(argv: list[str] | None = None) -> int:
    """The child: decode a few tokens and print them; a native crash shows as the exit signal."""
    parser = argparse.ArgumentParser(description="Probe llama.cpp on this CPU with a few decoded tokens.")
    parser.add_argument("model", help="a .gguf file")
    parser.add_argument("--extra-buffers", choices=["on", "off"], required=True,
                        help="llama.cpp's use_extra_bufts (repacked/AMX weight buffers)")
    args = parser.parse_args(argv)
    tokens = decode_a_few_tokens(args.model, args.extra_buffers == "on")
    print(f"ok: decoded {tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
