"""An ``accelerate launch`` command line for several processes on this machine (tests, benchmarks)."""
from __future__ import annotations

import socket
import sys


def local_launch_command(num_processes: int, script: str, *script_args: str) -> list[str]:
    """``accelerate launch`` of ``script`` on ``num_processes`` processes of this machine, as an argv list.

    Uses ``--multi_gpu`` (torchrun) even without GPUs: the trainers' ``Accelerator(cpu=True)`` then
    joins the processes with gloo, whereas accelerate's ``--cpu`` multi-process mode needs MPI and
    silently runs one process without it. The rendezvous port is a free local one.
    """
    multi = ["--multi_gpu"] if num_processes > 1 else []
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return [sys.executable, "-m", "accelerate.commands.launch", *multi, "--num_processes", str(num_processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(port), script, *script_args]
