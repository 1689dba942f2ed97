"""Run generated code against assert-based tests in a sandbox: ``run_tests`` and ``run_tests_batch``.

The score is the fraction of the test's ``assert`` statements that passed. Tests are either a
HumanEval-style block (``def check(candidate): assert ...``, called with the entry point) or
MBPP-style top-level asserts (a string, or a list of assert strings) that call the function by
name. Before running, every ``assert`` statement of the test (top level, inside ``check``, inside
loops) is rewritten with :mod:`ast` into ``try: assert ... except BaseException: record(i, error)
else: record(i, ok)``, so each one is counted on its own: an assert inside a loop passes only when
all its executions pass, an assert never reached counts as failed, and a program that exits early
(``sys.exit(0)``, ``os._exit(0)``) before the asserts scores 0.

Isolation (Linux; each layer is used where the kernel and user allow it). Generated code never
runs in the caller's process. A small *zygote* interpreter (``python -I -S``: no site-packages,
empty environment) is started per worker and clones, per check, a runner that executes the code
(see ``_sandbox_zygote.py``); the next check's runner is made while a check runs and waits, holding
nothing of any check, until its check arrives. The runner is PID 1 of its own PID namespace and its
own session, so neither ``os.kill(os.getppid(), 9)`` nor ``kill(-1, 9)`` reaches anything outside,
and its death takes all its descendants with it.
Layers, each reported as active or not in ``Verdict.details["isolation"]``:

- ``netns``: a network namespace with no interface up — no network, not even loopback to the
  host's listeners. Each zygote has its own, which its checks enter one at a time: concurrent checks
  are in different namespaces, and a check starts only once its zygote's namespace is as new, with
  no socket of any family (the previous check's processes are gone with its PID namespace; a socket
  they left in flight over a Unix socket stays until the kernel collects it, which the zygote waits
  for, or it moves to a new namespace) and its interfaces' flags and counters unchanged, so no
  listener, socket or message of one check reaches another. No check can change the namespace's
  settings: ``/proc`` is read-only (``readonly_fs``) or the check runs under an unprivileged uid,
  and the program holds no capability. Without either, each check gets a new namespace.
- ``ipcns``: an IPC namespace per check, so a System V shared-memory segment, semaphore set or
  message queue, or a POSIX message queue, that a check makes is seen by no other check and not by
  the host, and goes with the namespace once the check's processes are gone.
- ``pidns``: the PID namespace above, per check (without it: process-group kill plus a sweep of
  the uid's processes).
- ``readonly_fs``: the zygote's private mount namespace: the whole file system is read-only
  except a private tmpfs ``/tmp`` that holds only the fresh working directories of the running
  check and of the next one (each removed before the check after it), so nothing written survives
  a check.
- ``uid_dropped``: when started as root, the runner drops to an unprivileged uid (two per zygote,
  alternating between checks), so the process-count limit is enforced and root-only files are
  unreadable.
- ``rlimits``: CPU time, address space, file size (which also caps stdout/stderr: they go to a
  file in the working directory, so a flood of output stops at ``output_bytes``: EFBIG/SIGXFSZ),
  process count, no core files, open files.
- ``env``: the environment is scrubbed (``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` only).
- ``no_new_privs`` and a parent-death signal; a wall-clock timeout kills the runner.

When the kernel or user refuses a namespace layer (netns, ipcns, pidns, readonly_fs, or the uid drop as
root), checks still run with the remaining layers and a ``RuntimeWarning`` naming the missing ones
is issued once; with ``LLM_MARL_SANDBOX_STRICT=1`` the sandbox refuses instead (``IsolationError``).

**Plain values.** The program and the test never share an interpreter. Inside the runner, the *test
process* forks a *program process* (no capabilities, no access to the result pipe) that executes the
program; the test process and the zygote are not dumpable, so the program cannot trace them or read
their memory or file descriptors. The test (and ``task_code``) reaches the test process in an
anonymous in-memory file that it reads only after forking the program process, and the zygote passes
each check on without decoding it, so no program's copy of memory holds the test's code or expected
values, its own or another check's. The test runs in the test process,
where every name the program defines is either a copy of a plain value or a ``ProgramValue`` proxy:
calling it, reading or setting its attributes sends a request to the program process, which answers
with a plain value (exactly ``int``, ``float``, ``complex``, ``bool``, ``str``, ``bytes``, ``None``,
or ``list``/``tuple``/``dict``/``set``/``frozenset`` of them, recursively; no subclasses) or with
another proxy. Comparing, hashing, truth-testing, iterating or computing with a proxy raises
``NotPlainValue``, so an assert on a value that is not plain fails with that reason in
``details["results"]``; the comparisons, the assert machinery and the builtins are the test
process's own. Exceptions the program raises come back as the built-in exception of the same name
(``ValueError``, ...), others as ``ProgramError``. A program that exits, kills itself or closes its
pipes fails every assert that still needs it. The calls of the asserts that open a test (a call with
literal arguments compared with constants, as in ``assert candidate([1, 2]) == 3``) go to the program
process in one message and are answered one by one in the same order, as if each had been sent when
the test made it.

Results come back on a dedicated pipe that only the test process holds, one line per assert
execution, each carrying a per-check random nonce; the zygote drops lines without it, so printing
or writing fake results does not count. The sandbox interpreter has only the standard library.
"""
from __future__ import annotations

import ast
import atexit
import marshal
import math
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import Verdict, _python_ast
from ._sandbox_zygote import read_message, write_all, write_message

DEFAULT_TIMEOUT_S = 10.0
_ZYGOTE_SCRIPT = Path(__file__).with_name("_sandbox_zygote.py")
_RECORD_NAME = "__sbx_record__"          # placeholder; the runner renames it per check
_SUPERVISOR_SLACK_S = 10.0               # beyond timeout_s before the caller gives up on a zygote
_SETUP_FAILED_EXIT = 120


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one check.

    Attributes:
        memory_bytes: address-space limit of the runner (RLIMIT_AS).
        output_bytes: cap on stdout+stderr and on any file the program writes (RLIMIT_FSIZE).
        output_keep: how many bytes of the output are returned in ``details["output"]``.
        max_processes: process/thread limit of the runner's uid (RLIMIT_NPROC).
    """

    memory_bytes: int = 1 << 30
    output_bytes: int = 1 << 20
    output_keep: int = 4096
    max_processes: int = 16

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "output_bytes", "output_keep", "max_processes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SandboxLimits.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class InstrumentedTest:
    """A test whose asserts report one by one: the compiled code and each assert's source."""

    code: Any                      # code object, compiled here, executed in the runner
    assert_sources: tuple[str, ...]
    calls_check: bool              # HumanEval style: the test defines check(candidate)
    calls_ahead: tuple[str, tuple[tuple[tuple[Any, ...], tuple[tuple[str, Any], ...]], ...]] | None = None
    """The function name and the literal (args, kwargs) of the calls the test's first asserts make, in order."""


class _AssertRecorder(ast.NodeTransformer):
    """Rewrite each ``assert`` into a try/except that records pass/fail under its index."""

    def __init__(self, source: str) -> None:
        self.lines = source.encode().splitlines(keepends=True)  # ast's lines and utf-8 byte columns
        self.sources: list[str] = []

    def segment(self, node: ast.stmt) -> str:
        """The source text of ``node`` (like ``ast.get_source_segment``, without re-splitting per call)."""
        first, last = node.lineno - 1, node.end_lineno - 1
        if first == last:
            return self.lines[first][node.col_offset:node.end_col_offset].decode()
        parts = [
            self.lines[first][node.col_offset :],
            *self.lines[first + 1 : last],
            self.lines[last][: node.end_col_offset],
        ]
        return b"".join(parts).decode()

    def visit_Assert(self, node: ast.Assert) -> ast.Try:
        index = len(self.sources)
        self.sources.append(self.segment(node))
        at = {"lineno": node.lineno, "col_offset": node.col_offset,
              "end_lineno": node.end_lineno, "end_col_offset": node.end_col_offset}

        def record(outcome: ast.expr) -> ast.Expr:
            call = ast.Call(ast.Name(_RECORD_NAME, ast.Load(), **at), [ast.Constant(index, **at), outcome], [], **at)
            return ast.Expr(call, **at)

        failed = ast.ExceptHandler(ast.Name("BaseException", ast.Load(), **at), "__sbx_exc__",
                                   [record(ast.Name("__sbx_exc__", ast.Load(), **at))], **at)
        return ast.Try(body=[node], handlers=[failed], orelse=[record(ast.Constant(None, **at))], finalbody=[], **at)


@lru_cache(maxsize=1024)
def _compile_task_code(task_code: str) -> Any:
    try:
        return _python_ast.compile_module(task_code, "<task>")
    except SyntaxError as err:
        raise ValueError(f"task_code does not parse (line {err.lineno}: {err.msg}); pass valid Python") from None


def _test_source(test: str | Sequence[str]) -> str:
    if isinstance(test, str):
        return test
    if isinstance(test, Sequence) and all(isinstance(t, str) for t in test):
        return "\n".join(test)
    raise ValueError(f"test must be a str or a list of assert strings, got {type(test).__name__}")


def _inert(node: ast.expr) -> bool:
    """Whether ``node`` is built from constants only (no name, call or attribute: it cannot reach the program)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_inert(item) for item in node.elts)
    if isinstance(node, ast.Dict):
        return all(_inert(item) for item in node.values) and all(key is None or _inert(key) for key in node.keys)
    if isinstance(node, ast.UnaryOp):
        return _inert(node.operand)
    if isinstance(node, ast.BinOp):
        return _inert(node.left) and _inert(node.right)
    if isinstance(node, ast.BoolOp):
        return all(_inert(item) for item in node.values)
    if isinstance(node, ast.Compare):
        return _inert(node.left) and all(_inert(item) for item in node.comparators)
    if isinstance(node, ast.IfExp):
        return _inert(node.test) and _inert(node.body) and _inert(node.orelse)
    return False


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None
    return not _holds_set(value), value  # a set's order on the wire is not the literal's: never sent ahead


def _holds_set(value: Any) -> bool:
    if isinstance(value, (set, frozenset)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_set(item) for item in value)
    if isinstance(value, dict):
        return any(_holds_set(item) for pair in value.items() for item in pair)
    return False


def _only_call(test: ast.expr) -> ast.Call | None:
    """The one call of an assert made of that call (of a plain name) and constants, which runs whatever
    happens (``f(1) == 2``, ``not f(1)``, ``3 < f(2)``); ``None`` for any other assert."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, right = test.left, test.comparators[0]
        if isinstance(left, ast.Call) and _inert(right):
            test = left
        elif isinstance(right, ast.Call) and _literal(left)[0]:
            test = right
    if not isinstance(test, ast.Call) or not isinstance(test.func, ast.Name):
        return None
    return test


def _calls_ahead(body: list[ast.stmt], name: str | None) -> tuple[str, tuple] | None:
    """The literal calls that the asserts opening ``body`` make, in order, all of ``name`` (the first
    call's name when ``None``): ``(name, ((args, kwargs), ...))``, or ``None`` when there are none.

    Only asserts whose one program call is certain to run before anything else that could reach the
    program: the call, with literal arguments, and constants (the message too). Stops at the first
    other statement (a docstring or an assert of constants only is skipped).
    """
    calls = []
    for stmt in body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue
        if not isinstance(stmt, ast.Assert) or not (stmt.msg is None or isinstance(stmt.msg, ast.Constant)):
            break
        call = _only_call(stmt.test)
        if call is None and _inert(stmt.test):
            continue
        if call is None or call.func.id != (name or call.func.id) or any(isinstance(a, ast.Starred) for a in call.args):
            break
        values = [_literal(arg) for arg in call.args] + [_literal(kw.value) for kw in call.keywords]
        if not all(ok for ok, _ in values) or any(kw.arg is None for kw in call.keywords):
            break
        name = call.func.id
        args = tuple(value for _, value in values[:len(call.args)])
        kwargs = tuple((kw.arg, value) for kw, (_, value) in zip(call.keywords, values[len(call.args):]))
        calls.append((args, kwargs))
    return (name, tuple(calls)) if calls else None


def _test_calls_ahead(tree: ast.Module) -> tuple[str, tuple] | None:
    """:func:`_calls_ahead` of the body of ``check(candidate)`` (HumanEval style: one plain ``def check``, the
    only top-level binding of that name) or of the module (top-level asserts)."""
    try:
        binds_check = [node for node in tree.body if "check" in _top_level_names(node)]
        if not binds_check:
            return _calls_ahead(tree.body, None)
        check = binds_check[0]
        if len(binds_check) > 1 or not isinstance(check, ast.FunctionDef) or check.decorator_list:
            return None
        if not check.args.args:
            return None
        return _calls_ahead(check.body, check.args.args[0].arg)
    except RecursionError:  # a literal nested too deep to look at: the test runs without calls sent ahead
        return None


def _top_level_names(stmt: ast.stmt) -> set[str]:
    """The names a module-level statement binds (not inside functions or classes)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).partition(".")[0] for alias in stmt.names}
    names = set()
    for node in ast.walk(stmt):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not stmt:
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    return names


@lru_cache(maxsize=4096)
def instrument_test(test: str) -> InstrumentedTest:
    """Parse ``test``, rewrite its asserts to report individually and find the calls its opening asserts
    make (:func:`_calls_ahead`); cached per test text."""
    try:
        tree = _python_ast.parse(test)
    except SyntaxError as err:
        raise ValueError(f"test code does not parse (line {err.lineno}: {err.msg}); pass valid Python") from None
    calls_ahead = _test_calls_ahead(tree)  # before the rewrite below changes the tree
    rewriter = _AssertRecorder(test)
    tree = rewriter.visit(tree)
    if not rewriter.sources:
        raise ValueError("test contains no assert statements; the score is the fraction of asserts passed")
    calls_check = any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body)
    code = _python_ast.compile_module(tree, "<test>")
    return InstrumentedTest(code, tuple(rewriter.sources), calls_check, calls_ahead)


# ---------------------------------------------------------------- zygote processes
class _Zygote:
    """One zygote interpreter and its pipes; serves one check at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_ZYGOTE_SCRIPT)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # silent unless it crashes
            env={}, cwd="/", start_new_session=True, close_fds=True,
        )
        hello = self._receive(time.monotonic() + 30.0)
        if hello is None:
            self.kill()
            error = self.proc.stderr.read().decode("utf-8", "replace")[-2000:]
            self._close_pipes()
            raise RuntimeError(
                f"sandbox zygote {_ZYGOTE_SCRIPT} did not start (exit code {self.proc.poll()}):\n{error}"
            )
        self.caps: dict[str, Any] = hello["caps"]
        self.standby_pid: int | None = hello["standby"]  # the runner waiting for the next check (for tests)
        try:
            check_isolation(self.caps)
        except IsolationError:
            self.discard()
            raise

    def _receive(self, deadline: float) -> Any:
        return read_message(self.proc.stdout.fileno(), deadline)

    def request(self, header: dict[str, Any], program: bytes, test: bytes, wait_s: float) -> dict[str, Any] | None:
        """Send one check: ``header``, then the marshalled ``program`` and ``test`` requests, which the zygote
        passes on undecoded to the program process and the test process. The report, or ``None`` when the
        zygote died or stopped answering."""
        try:
            write_message(self.proc.stdin.fileno(), {**header, "program_size": len(program), "test_size": len(test)})
            write_all(self.proc.stdin.fileno(), program + test)
        except OSError:
            return None
        report = self._receive(time.monotonic() + wait_s)
        if report is not None:
            self.standby_pid = report.get("standby")
        return report

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the zygote and everything in its session; wait for it."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()

    def discard(self) -> None:
        """Kill the zygote and close its pipes."""
        self.kill()
        self._close_pipes()

    def close(self) -> None:
        """Let the zygote exit (end of its input), killing it if it does not; close its pipes."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass


STRICT_ENV = "LLM_MARL_SANDBOX_STRICT"
_warned_missing: set[str] = set()


class IsolationError(RuntimeError):
    """Strict mode (``LLM_MARL_SANDBOX_STRICT=1``) and a sandbox layer the kernel or user does not allow."""


def missing_layers(caps: Mapping[str, Any]) -> list[str]:
    """The kernel isolation layers a zygote could not set up (the uid drop counts only when running as root)."""
    wanted = ["netns", "ipcns", "pidns", "readonly_fs"] + (["drop_uid"] if os.geteuid() == 0 else [])
    return [layer for layer in wanted if not caps.get(layer)]


def check_isolation(caps: Mapping[str, Any]) -> None:
    """Refuse (strict mode) or warn once per set of missing layers when a sandbox runs without all of its layers."""
    missing = missing_layers(caps)
    if not missing:
        return
    fix = ("allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or "
           "kernel.apparmor_restrict_unprivileged_userns=0), or in a container grant CAP_SYS_ADMIN / an unconfined "
           "seccomp profile")
    if os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        raise IsolationError(f"{STRICT_ENV} is set and the sandbox cannot set up {missing}; refusing to run untrusted "
                             f"code without them. To get them: {fix}; or unset {STRICT_ENV} to run with the "
                             f"remaining layers (separate process, rlimits, scrubbed environment, timeout)")
    if set(missing) - _warned_missing:
        _warned_missing.update(missing)
        warnings.warn(f"SANDBOX ISOLATION REDUCED: generated code runs WITHOUT {missing} (the kernel or user does not "
                      f"allow them): it can reach the network, other processes or the file system that these layers "
                      f"would block. To get them: {fix}. Set {STRICT_ENV}=1 to refuse to run code without them.",
                      RuntimeWarning, stacklevel=3)


def _isolation(caps: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "separate_process": True,
        "netns": bool(caps["netns"]),
        "ipcns": bool(caps["ipcns"]),
        "pidns": bool(caps["pidns"]),
        "readonly_fs": bool(caps["readonly_fs"]),
        "userns": bool(caps["userns"]),
        "uid_dropped": bool(caps["drop_uid"]),
        "rlimits": ["CPU", "AS", "FSIZE", "NPROC", "CORE", "NOFILE"],
        "env_scrubbed": True,
        "no_new_privs": True,
        "wall_clock_kill": True,
    }


class Sandbox:
    """A pool of sandbox zygotes; ``run`` and ``run_batch`` check programs against tests."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self._idle: list[_Zygote] = []
        self._lock = threading.Lock()
        self._owner_pid = os.getpid()
        self._caps: dict[str, Any] | None = None

    @property
    def isolation(self) -> dict[str, Any]:
        """The isolation layers active for checks run by this sandbox."""
        zygote = self._acquire()
        self._release(zygote)
        return _isolation(zygote.caps)

    def _acquire(self) -> _Zygote:
        with self._lock:
            if os.getpid() != self._owner_pid:  # forked caller: the pipes belong to the parent
                self._idle, self._owner_pid = [], os.getpid()
            while self._idle:
                zygote = self._idle.pop()
                if zygote.alive():
                    return zygote
                zygote.discard()  # died while idle (killed from outside)
        return _Zygote()

    def _release(self, zygote: _Zygote) -> None:
        with self._lock:
            if os.getpid() == self._owner_pid and zygote.alive():
                self._idle.append(zygote)
                return
        zygote.discard()

    def close(self) -> None:
        """Stop every idle zygote (a later check starts new ones)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for zygote in idle:
            zygote.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run(self, program: str, test: str | Sequence[str], entry_point: str,
            timeout_s: float = DEFAULT_TIMEOUT_S, task_code: str = "") -> Verdict:
        """Run ``program`` against ``test`` in a fresh sandbox; score = fraction of asserts passed.

        ``task_code``: trusted code of the task (a prompt's imports and helper functions) that runs
        in the test process before the test, so the test's own references to those helpers (e.g.
        ``encode_cyclic`` in a ``decode_cyclic`` test) reach the task's definitions, not the program's.
        """
        return self._execute(self._prepare(program, test, entry_point, timeout_s, task_code))

    def _prepare(self, program: str, test: str | Sequence[str], entry_point: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 task_code: str = "") -> _PreparedCheck:
        """Check the arguments, instrument the test and encode both requests (no zygote needed yet)."""
        if not isinstance(program, str):
            raise ValueError(f"program must be a str, got {type(program).__name__}")
        if not isinstance(entry_point, str) or (entry_point and not entry_point.isidentifier()):
            raise ValueError(f"entry_point must be a Python identifier (or '' for none), got {entry_point!r}")
        if not isinstance(timeout_s, (int, float)) or not 0 < timeout_s <= 3600 or math.isnan(timeout_s):
            raise ValueError(f"timeout_s must be a number in (0, 3600], got {timeout_s!r}")
        if not isinstance(task_code, str):
            raise ValueError(f"task_code must be a str of Python code, got {type(task_code).__name__}")
        instrumented = instrument_test(_test_source(test))
        limits = {"timeout": float(timeout_s), "memory_bytes": self.limits.memory_bytes,
                  "output_bytes": self.limits.output_bytes, "max_processes": self.limits.max_processes}
        program_request = marshal.dumps({"program": program, "entry_point": entry_point, **limits})
        call_check = instrumented.calls_check and bool(entry_point)
        test_request = marshal.dumps({
            "task_code": _compile_task_code(task_code) if task_code.strip() else None,
            "test_code": instrumented.code, "entry_point": entry_point, "call_check": call_check,
            "calls_ahead": instrumented.calls_ahead if call_check or not instrumented.calls_check else None, **limits,
        })
        return _PreparedCheck(instrumented, float(timeout_s), program_request, test_request)

    def _execute(self, check: _PreparedCheck) -> Verdict:
        """Run a prepared check on an idle zygote; its verdict."""
        header = {"timeout": check.timeout_s, "output_keep": self.limits.output_keep}
        zygote = self._acquire()
        report = zygote.request(header, check.program_request, check.test_request,
                                check.timeout_s + _SUPERVISOR_SLACK_S)
        if report is None:
            zygote.discard()
            report = {"error": "sandbox zygote stopped answering; it was killed and will be restarted"}
        self._release(zygote)
        return _verdict(report, check.test, check.timeout_s, _isolation(zygote.caps), self.limits)

    def run_batch(self, items: Iterable[Mapping[str, Any] | Sequence[Any]], max_workers: int | None = None,
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Verdict]:
        """Run many checks in parallel (a bounded pool, one zygote per worker); verdicts in input order.

        One more thread instruments tests and encodes requests a few checks ahead of the workers, so a
        worker sends its next check as soon as its last one is done."""
        jobs = [_normalise_item(item, i, timeout_s) for i, item in enumerate(items)]
        workers = max_workers if max_workers is not None else _default_workers()
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"max_workers must be a positive int or None, got {max_workers!r}")
        if not jobs:
            return []
        workers = min(workers, len(jobs))
        prepared: list[Future | None] = [None] * len(jobs)
        submitted, lock = [0], threading.Lock()

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-prepare") as preparer, \
                ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
            def prepare_until(end: int) -> None:
                with lock:
                    while submitted[0] < min(end, len(jobs)):
                        prepared[submitted[0]] = preparer.submit(self._prepare, **jobs[submitted[0]])
                        submitted[0] += 1

            def work(index: int) -> Verdict:
                prepare_until(index + 1 + workers)  # keep one prepared check per worker waiting
                check = prepared[index].result()
                prepared[index] = None
                return self._execute(check)

            prepare_until(workers)
            return list(pool.map(work, range(len(jobs))))


@dataclass(frozen=True)
class _PreparedCheck:
    """A check ready to send: its instrumented test, timeout and the two encoded requests."""

    test: InstrumentedTest
    timeout_s: float
    program_request: bytes
    test_request: bytes


def _default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _normalise_item(item: Mapping[str, Any] | Sequence[Any], index: int, timeout_s: float) -> dict[str, Any]:
    if isinstance(item, Mapping):
        missing = {"program", "test", "entry_point"} - set(item)
        extra = set(item) - {"program", "test", "entry_point", "timeout_s", "task_code"}
        if missing or extra:
            raise ValueError(f"batch item {index}: keys must be program, test, entry_point[, timeout_s, task_code]; "
                             f"missing {sorted(missing)}, unknown {sorted(extra)}")
        return {"timeout_s": timeout_s, **item}
    if isinstance(item, Sequence) and not isinstance(item, str) and len(item) == 3:
        return {"program": item[0], "test": item[1], "entry_point": item[2], "timeout_s": timeout_s}
    raise ValueError(f"batch item {index} must be a dict or a (program, test, entry_point) tuple, got {item!r:.80}")


# ---------------------------------------------------------------- reports -> verdicts
def _strip(text: str) -> str:
    return text[:-2] if text.endswith(": ") else text


def _verdict(report: Mapping[str, Any], test: InstrumentedTest, timeout_s: float,
             isolation: dict[str, Any], limits: SandboxLimits) -> Verdict:
    total = len(test.assert_sources)
    if "error" in report:
        return Verdict(0.0, False, {"passed": 0, "total": total, "reason": report["error"], "isolation": isolation})
    failures: dict[int, str] = {}
    seen_ok: set[int] = set()
    events: dict[int, str] = {}
    for index, text in report["records"]:
        if index < 0:
            events.setdefault(index, _strip(text))
        elif 0 <= index < total:
            if text == "ok":
                seen_ok.add(index)
            else:
                failures.setdefault(index, _strip(text))
    passed_ids = seen_ok - set(failures)
    results = [
        {"assert": src, "passed": i in passed_ids, "error": failures.get(i, None if i in seen_ok else "not reached")}
        for i, src in enumerate(test.assert_sources)
    ]
    first_failure = next(({"assert": r["assert"], "error": r["error"]} for r in results if not r["passed"]), None)
    reason = _reason(report, events, len(passed_ids), total, first_failure, timeout_s, limits)
    details = {
        "passed": len(passed_ids), "total": total, "results": results, "first_failure": first_failure,
        "reason": reason, "timed_out": report["timed_out"], "exit_code": report["exit_code"],
        "signal": report["signal"], "elapsed_s": round(report["elapsed_s"], 4),
        "output": report["output"].decode("utf-8", "replace"), "isolation": isolation,
    }
    score = len(passed_ids) / total
    return Verdict(score, score == 1.0, details)


def _reason(report: Mapping[str, Any], events: dict[int, str], passed: int, total: int,
            first_failure: dict[str, str] | None, timeout_s: float, limits: SandboxLimits) -> str | None:
    tally = f"{passed}/{total} asserts passed"
    sig = report["signal"]
    if report["timed_out"]:
        return f"timed out after {timeout_s:g} s ({tally})"
    if -1 in events:
        hint = f" (the output/file size limit is {limits.output_bytes} bytes)" if "[Errno 27]" in events[-1] else ""
        return f"program failed before the tests: {events[-1]}{hint}"
    if sig is not None:
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        why = {"SIGXFSZ": f"output/file size limit of {limits.output_bytes} bytes exceeded",
               "SIGXCPU": "CPU time limit exceeded"}.get(name, "the program killed itself or its process group")
        return f"killed by {name}: {why} ({tally})"
    if report["exit_code"] == _SETUP_FAILED_EXIT:
        return f"sandbox setup failed: {report['output'].decode('utf-8', 'replace')[-300:]}"
    if -2 in events:
        return f"test code raised outside an assert: {events[-2]} ({tally})"
    if -3 not in events:
        return f"process exited (code {report['exit_code']}) before the tests finished ({tally})"
    if first_failure is not None:
        return (
            f"{total - passed} of {total} asserts failed; first: {first_failure['assert']} -> {first_failure['error']}"
        )
    return None


# ---------------------------------------------------------------- module-level API
_default_sandbox: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """The process-wide sandbox behind ``run_tests`` / ``run_tests_batch`` (zygotes reused)."""
    global _default_sandbox
    with _default_lock:
        if _default_sandbox is None:
            _default_sandbox = Sandbox()
            atexit.register(_default_sandbox.close)
        return _default_sandbox


def run_tests(program: str, test: str | Sequence[str], entry_point: str,
              timeout_s: float = DEFAULT_TIMEOUT_S, task_code: str = "") -> Verdict:
    """Run ``program`` against ``test`` in the sandbox; score = fraction of asserts passed.

    ``task_code`` (optional): the task's trusted helpers, which the test then uses (see :meth:`Sandbox.run`).
    """
    return default_sandbox().run(program, test, entry_point, timeout_s, task_code)


def run_tests_batch(items: Iterable[Mapping[str, Any] | Sequence[Any]], max_workers: int | None = None,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Verdict]:
    """``run_tests`` over many (program, test, entry_point) items in parallel; verdicts in order."""
    return default_sandbox().run_batch(items, max_workers=max_workers, timeout_s=timeout_s)


__all__ = ["run_tests", "run_tests_batch", "Sandbox", "SandboxLimits", "instrument_test", "default_sandbox",
           "DEFAULT_TIMEOUT_S"]
