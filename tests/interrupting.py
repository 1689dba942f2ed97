"""Interrupting a training command the way a person does: Ctrl-C once its first checkpoint is on disk."""
from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


def interrupt_after_first_checkpoint(command: Sequence[str], output_dir: Path, *, cwd: Path,
                                     env: Mapping[str, str]) -> subprocess.CompletedProcess:
    """Run ``command``, send SIGINT once ``output_dir``'s first checkpoint is complete (or the command ended, or
    300 s passed), and return how it ended."""
    # a shell that starts the tests in the background ignores SIGINT, and a child inherits that: restore it
    process = subprocess.Popen(list(command), cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = output_dir / "checkpoints" / "step-000001" / "trainer_state.pt"
    deadline = time.monotonic() + 300
    while not first.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)
