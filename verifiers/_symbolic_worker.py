"""A child process that runs math-verify comparisons so that a runaway sympy call can be killed.

math-verify's own timeout uses ``signal.alarm`` and therefore works only in the main thread.
:func:`verifiers.math.verify_answer` calls :meth:`SymbolicWorker.compare` when it runs in any
other thread: the comparison happens in the child's main thread (where math-verify's timeout
works), and if the child does not answer in time it is killed and restarted on the next call.
Protocol: one JSON line ``[gold, answer]`` in, one JSON line ``true``/``false``/``null`` out.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

STARTUP_TIMEOUT_S = 60.0
"""How long the child may take to import sympy and math-verify."""


SYMBOLIC_TIMEOUT_S = 3
"""math-verify's own parse/verify timeout in seconds (signal based, so main thread only; in other
threads the comparison runs in a child process that is killed after ``3 * SYMBOLIC_TIMEOUT_S + 1``)."""


def symbolic_equal(gold: str, answer: str) -> bool | None:
    """math-verify equivalence of two normalised LaTeX strings (``None`` when either fails to parse).

    In the main thread math-verify's signal-based timeouts bound the time; elsewhere call it
    through :class:`SymbolicWorker`.
    """
    parsed_gold = _math_verify_parse(gold)
    parsed_answer = _math_verify_parse(answer)
    if not parsed_gold or not parsed_answer:
        return None
    from math_verify import verify

    return bool(verify(list(parsed_gold), list(parsed_answer), timeout_seconds=_timeout()))


@functools.lru_cache(maxsize=4096)
def _math_verify_parse(text: str) -> tuple[Any, ...]:
    """math-verify's parse of ``$text$`` (cached: golds repeat across agents and turns)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    parsed = parse(f"${text}$", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
                   parsing_timeout=_timeout())
    return tuple(parsed)


def _timeout() -> int | None:
    """math-verify's signal-based timeout (it only works in the main thread)."""
    return SYMBOLIC_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None



class SymbolicWorker:
    """A lazily started child process answering symbolic-equality questions with a hard timeout."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        atexit.register(self.close)

    def compare(self, gold: str, answer: str) -> bool | None:
        """math-verify equality of two normalised strings; ``None`` on parse failure or timeout."""
        with self._lock:
            process = self._running_process()
            if process is None:
                return None
            request = json.dumps([gold, answer]) + "\n"
            try:
                process.stdin.write(request.encode())  # type: ignore[union-attr]
                process.stdin.flush()  # type: ignore[union-attr]
            except OSError:
                self._kill()
                return None
            line = self._read_line(process, self.timeout_s)
            if line is None:
                self._kill()
                return None
            return json.loads(line)

    def close(self) -> None:
        """Stop the child process (also registered with :mod:`atexit`)."""
        self._kill()

    def _running_process(self) -> subprocess.Popen[bytes] | None:
        """The live child, started (and waited for until ready) if needed."""
        if self._process is not None and self._process.poll() is None:
            return self._process
        package_root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        self._process = subprocess.Popen(
            [sys.executable, "-m", "verifiers._symbolic_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, bufsize=0,
        )
        if self._read_line(self._process, STARTUP_TIMEOUT_S) != b"ready":
            self._kill()
            return None
        return self._process

    @staticmethod
    def _read_line(process: subprocess.Popen[bytes], timeout_s: float) -> bytes | None:
        """One line from the child's stdout, or ``None`` if none arrives within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        chunks = []
        stdout = process.stdout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([stdout], [], [], remaining)[0]:
                return None
            byte = stdout.read(1)  # type: ignore[union-attr]
            if not byte:
                return None
            if byte == b"\n":
                return b"".join(chunks)
            chunks.append(byte)

    def _kill(self) -> None:
        """Kill and reap the child, if any."""
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait()
            self._process = None


def _serve() -> None:
    """Child loop: answer ``[gold, answer]`` lines until stdin closes."""
    symbolic_equal("1", "1")  # import and warm up sympy/math-verify before reporting ready
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        gold, answer = json.loads(line)
        sys.stdout.write(json.dumps(symbolic_equal(gold, answer)) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
