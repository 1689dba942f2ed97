"""Hostile programs for the code sandbox, each answering the ``add(a, b)`` task of :data:`ADD_TEST` (all must score 0).

Shared by the sandbox tests and ``benchmarks/sandbox_throughput.py --hostile-mix``.
"""
from __future__ import annotations

ADD_TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"
CORRECT_ADD = "def add(a, b):\n    return a + b\n"
HALF_RIGHT_ADD = "def add(a, b):\n    return a + b if a > 0 else 7\n"     # passes 1 of the 2 asserts

HOSTILE_PROGRAMS: dict[str, str] = {
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "memory bomb": "blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 24))\n",
    "output flood": ("import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(200):\n    sys.stdout.write(chunk)\n"
                     + CORRECT_ADD),
    "disk flood": ("with open('big', 'wb') as f:\n    for _ in range(200):\n        f.write(b'x' * (1 << 20))\n"
                   + CORRECT_ADD),
    "infinite loop": "def add(a, b):\n    while True:\n        pass\n",
    "sleeps forever": "import time\ntime.sleep(10_000)\n" + CORRECT_ADD,
    "thread bomb": ("import threading, time\nwhile True:\n"
                    "    threading.Thread(target=time.sleep, args=(10_000,)).start()\n"),
    "orphaned daemon": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                        "        time.sleep(10_000)\n    os._exit(0)\ndef add(a, b):\n    return None\n"),
    "kills everything": ("import os, signal\nfor target in (os.getppid(), 0, -1):\n    try:\n"
                         "        os.kill(target, signal.SIGKILL)\n    except OSError:\n        pass\n"
                         "def add(a, b):\n    return None\n"),
}
