"""What this CPU can do, and the native-backend settings that follow from it.

* :func:`cpu_info` — the CPU's model name and feature flags (``/proc/cpuinfo`` on Linux).
* :func:`llamacpp_extra_buffers` — whether llama.cpp may repack weights into its "extra" CPU
  buffer types. On CPUs with AMX those include ggml's AMX matmul path, which segfaults at the
  first decode (llama.cpp issue 20824, "segfault in ggml_backend_amx_mul_mat"); with the extra
  buffers off, weights stay in the plain CPU buffer and the same model runs. The environment
  variable ``LLM_MARL_LLAMACPP_EXTRA_BUFFERS`` (``auto`` | ``on`` | ``off``) forces either choice.
* :func:`free_cores` — cores not busy with other processes, read at each call (load average).
* :class:`CoreMeter` — the same question answered from CPU time spent since the last reading,
  with this process's own time taken out: what a backend asks before every generate call.
* :func:`keep_freed_memory` — make glibc's ``malloc`` keep freed blocks for the next tensor instead
  of unmapping them, so a forward pass does not page-fault its activations in afresh each time. The
  environment variable ``LLM_MARL_HEAP`` (``keep`` | ``system``) chooses; :class:`~llm_marl.backends.hf.HFPolicy`
  applies it when it is built.
* :func:`short_openmp_spin` — how long idle OpenMP workers (torch's and llama.cpp's) spin before they
  sleep: briefly (``GOMP_SPINCOUNT``), unless the user set ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``; the
  CLI and the llama.cpp backend apply it before an OpenMP runtime starts.
"""
from __future__ import annotations

import ctypes
import os
import platform
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass

EXTRA_BUFFERS_ENV = "LLM_MARL_LLAMACPP_EXTRA_BUFFERS"
# CPU flags (as Linux names them) that make llama.cpp pick its AMX buffer type.
AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16"})
# Flags worth reporting: the SIMD level decides which kernels ggml and torch use.
RELEVANT_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16",
                  "asimd", "sve")
_ON, _OFF, _AUTO = ("1", "on", "true", "yes"), ("0", "off", "false", "no"), ("", "auto")
HEAP_ENV = "LLM_MARL_HEAP"
# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_TRIM_NEVER = 2**31 - 1
# libgomp's spin-wait iterations before an idle worker sleeps: its default is 300,000 (0 with
# OMP_WAIT_POLICY=PASSIVE); see short_openmp_spin for why this library picks 3,000
OPENMP_SPIN_COUNT = 3000
OPENMP_WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")   # the user's choice of wait, left alone where set


@dataclass(frozen=True)
class CpuInfo:
    """The CPU's model name and its feature flags (lower case, as in ``/proc/cpuinfo``)."""

    model: str
    flags: frozenset[str]

    @property
    def relevant_flags(self) -> list[str]:
        """The flags of :data:`RELEVANT_FLAGS` this CPU has, in that order."""
        return [f for f in RELEVANT_FLAGS if f in self.flags]

    @property
    def has_amx(self) -> bool:
        """Whether the CPU has Intel AMX tiles."""
        return bool(self.flags & AMX_FLAGS)


def cpu_info(cpuinfo_path: str = "/proc/cpuinfo") -> CpuInfo:
    """Model name and flags of the first CPU in ``cpuinfo_path``; empty flags where that file does not exist."""
    model, flags = platform.processor() or platform.machine(), frozenset()
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return CpuInfo(model=model, flags=flags)
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if not sep:
            continue
        if key in ("model name", "cpu model") and model in ("", platform.machine(), platform.processor()):
            model = value.strip()
        elif key in ("flags", "features") and not flags:      # x86 says flags, AArch64 says Features
            flags = frozenset(value.lower().split())
    return CpuInfo(model=model, flags=flags)


@dataclass(frozen=True)
class BufferChoice:
    """Whether llama.cpp may use its extra CPU buffer types (repacked and AMX weights), and why."""

    use_extra_bufts: bool
    reason: str


def llamacpp_extra_buffers(flags: Iterable[str], env: Mapping[str, str] | None = None) -> BufferChoice:
    """Decide ``use_extra_bufts`` for llama.cpp from the CPU's ``flags`` and ``$LLM_MARL_LLAMACPP_EXTRA_BUFFERS``.

    ``auto`` (the default) turns the extra buffers off exactly when the CPU has AMX, whose ggml
    matmul crashes; elsewhere llama.cpp keeps its defaults. ``on``/``off`` force the choice.
    """
    env = os.environ if env is None else env
    setting = env.get(EXTRA_BUFFERS_ENV, "").strip().lower()
    if setting in _ON:
        return BufferChoice(True, f"forced on by {EXTRA_BUFFERS_ENV}={env[EXTRA_BUFFERS_ENV]}")
    if setting in _OFF:
        return BufferChoice(False, f"forced off by {EXTRA_BUFFERS_ENV}={env[EXTRA_BUFFERS_ENV]}")
    if setting not in _AUTO:
        raise ValueError(f"{EXTRA_BUFFERS_ENV} must be one of auto, on, off; got {env[EXTRA_BUFFERS_ENV]!r}")
    amx = sorted(AMX_FLAGS.intersection(f.lower() for f in flags))
    if amx:
        return BufferChoice(False, f"CPU has AMX ({', '.join(amx)}): ggml's AMX matmul crashes (llama.cpp issue "
                                   f"20824), so weights stay in the plain CPU buffer; {EXTRA_BUFFERS_ENV}=on forces it")
    return BufferChoice(True, "no AMX on this CPU: llama.cpp's default buffer types (repacked weights where it has "
                              "kernels for them)")


def buffer_choice(use_extra_bufts: bool | None = None) -> BufferChoice:
    """``use_extra_bufts`` as the caller set it, or (``None``) this CPU's :func:`llamacpp_extra_buffers` decision."""
    if use_extra_bufts is None:
        return llamacpp_extra_buffers(cpu_info().flags)
    return BufferChoice(bool(use_extra_bufts), "set by the caller")


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def free_cores() -> int:
    """CPU cores not busy with other processes (usable cores minus the 1-minute load average), at least 1.

    llama.cpp's worker threads spin at barriers: with more threads than free cores, a thread that
    another process preempts holds all the others at every barrier and generation slows down by
    an order of magnitude, so backends take the free cores, not all of them.
    """
    cores = usable_cores()
    try:
        busy = os.getloadavg()[0]
    except OSError:
        busy = 0.0
    return max(1, min(cores, int(cores - busy + 0.5)))


CpuReading = tuple[float, float, float]      # (wall seconds, busy CPU seconds of the machine, of this process)


def read_cpu_times() -> CpuReading | None:
    """Wall time, the machine's busy CPU seconds (``/proc/stat``) and this process's CPU seconds; ``None`` off Linux."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]] + [0] * (8 - len(fields[1:9]))
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    hz = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return time.monotonic(), (user + nice + system + irq + softirq + steal) / hz, own.user + own.system


class CoreMeter:
    """Cores that other processes leave free, measured over the time since the previous reading.

    The 1-minute load average counts this process's own threads and lags a minute behind: read once
    while another job ran, it kept a whole benchmark on 1 of 2 cores. The meter instead takes the
    machine's busy CPU time since its last reading, subtracts this process's own CPU time, and
    divides by the wall time: the cores the others used. It falls back to :func:`free_cores` when
    ``/proc/stat`` is unreadable, and keeps its last answer when read again within ``min_window_s``.
    """

    def __init__(self, read: Callable[[], CpuReading | None] = read_cpu_times, min_window_s: float = 0.1,
                 cores: int | None = None) -> None:
        self._read, self.min_window_s = read, min_window_s
        self.cores = cores or usable_cores()
        self._last = read()
        self._answer: int | None = None

    def free_cores(self) -> int:
        """Cores not used by other processes since the previous call (at least 1, at most the usable cores)."""
        now = self._read()
        if now is None or self._last is None:
            self._last = now
            return free_cores()
        wall = now[0] - self._last[0]
        if wall < self.min_window_s:
            return self._answer if self._answer is not None else free_cores()
        others = max(0.0, (now[1] - self._last[1]) - (now[2] - self._last[2])) / wall
        self._last = now
        self._answer = max(1, min(self.cores, int(self.cores - others + 0.5)))
        return self._answer


@dataclass(frozen=True)
class HeapChoice:
    """Whether this process's ``malloc`` keeps freed memory for reuse (see :func:`keep_freed_memory`), and why."""

    kept: bool
    reason: str


_heap_choice: HeapChoice | None = None


def heap_plan(env: Mapping[str, str] | None = None) -> HeapChoice:
    """What :func:`keep_freed_memory` does in this process with ``$LLM_MARL_HEAP`` as in ``env``, without doing it."""
    env = os.environ if env is None else env
    setting = env.get(HEAP_ENV, "").strip().lower()
    if setting not in ("", "keep", "system"):
        raise ValueError(f"{HEAP_ENV} must be keep or system; got {env[HEAP_ENV]!r}")
    if setting == "system":
        return HeapChoice(False, f"left to the C library by {HEAP_ENV}=system")
    if platform.libc_ver()[0] != "glibc":
        return HeapChoice(False, "not glibc: the C library's own settings")
    return HeapChoice(True, f"glibc keeps freed blocks for reuse (mallopt M_MMAP_MAX=0, no trimming); "
                            f"{HEAP_ENV}=system leaves it alone")


def keep_freed_memory(env: Mapping[str, str] | None = None) -> HeapChoice:
    """Make glibc keep freed blocks, large ones too, in its heap for reuse; once per process.

    glibc serves every block of 32 MB or more (and smaller ones until its adaptive threshold
    rises) with a fresh ``mmap`` and unmaps it on ``free``. A batched prefill's activations are such
    blocks (64 rows x 97 tokens x 1536 floats = 38 MB per MLP product), so every forward pass
    faults its pages in again: ~10,000 page faults per tensor, which on a virtual machine can cost
    more than the arithmetic on the tensor (figures on the documentation's Performance page).
    Here ``mallopt`` turns ``mmap`` for blocks off (``M_MMAP_MAX=0``) and the heap's automatic
    trimming too (``M_TRIM_THRESHOLD``), so freed memory serves the next tensor. Peak resident memory
    is unchanged; what was freed stays resident until the process ends or calls ``malloc_trim``
    (:func:`trainers.common.distributed.release_free_memory` does after sharded phases).

    ``$LLM_MARL_HEAP``: ``keep`` (the default) or ``system`` (leave glibc's settings alone). Not glibc
    (macOS, Windows, musl): nothing is changed. The first call decides; later calls return its choice.
    """
    global _heap_choice
    plan = heap_plan(env)                                 # checks the setting on every call
    if _heap_choice is not None:
        return _heap_choice
    choice = plan
    if plan.kept:
        try:
            mallopt = ctypes.CDLL("libc.so.6").mallopt
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, _TRIM_NEVER) == 1
        except (OSError, AttributeError):
            ok = False
        if not ok:
            choice = HeapChoice(False, "glibc's mallopt refused the settings")
    _heap_choice = choice
    return choice


def short_openmp_spin(env: MutableMapping[str, str] | None = None) -> str:
    """Let idle OpenMP workers spin briefly (``GOMP_SPINCOUNT=3000``) before they sleep; returns what is in force.

    Nothing is changed when ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is set already (the user's choice).
    The OpenMP runtime reads these once, when it starts (the first import of torch or of llama.cpp's
    CPU backend; both share one libgomp per process), so call this before that.

    torch and ggml meet at a barrier after every operation. Passive waiting (``OMP_WAIT_POLICY=PASSIVE``)
    puts every worker to sleep at each barrier and wakes it with a system call, which makes two threads
    markedly slower on an idle machine; libgomp's own default spins 300,000 iterations first, which
    starves a CPU shared with other work. A spin of 3,000 iterations keeps nearly all of the spinning
    speed on an idle machine and loses much less than the long spin when another process takes a core
    during a call (the documentation's Performance page times a decode step under each policy).
    The backends avoid that case by taking only the cores others leave free (:class:`CoreMeter`, read
    before every call), so it happens only when a job starts during a call. On one thread the wait does
    not matter.
    """
    env = os.environ if env is None else env
    for name in OPENMP_WAIT_ENV:
        if name in env:
            return f"{name}={env[name]} (set by the user)"
    env["GOMP_SPINCOUNT"] = str(OPENMP_SPIN_COUNT)
    return f"GOMP_SPINCOUNT={OPENMP_SPIN_COUNT}"
