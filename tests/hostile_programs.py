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

# Programs that try to pass ADD_TEST without adding: by fooling the comparison, the assert machinery,
# the exit status or the result channel. None computes a + b, so each must score 0.
FOOLING_PROGRAMS: dict[str, str] = {
    "object equal to everything": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "def add(a, b):\n    return Anything()\n"
    ),
    "int subclass equal to everything": (
        "class Int(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Int(0)\n"
    ),
    "str subclass equal to everything": (
        "class Str(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n"
        "def add(a, b):\n    return Str('')\n"
    ),
    "list subclass equal to everything": (
        "class List(list):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return List()\n"
    ),
    "reflected equality via __ne__ and ordering": (
        "class Sneaky:\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n"
        "    __bool__ = lambda s: True\n"
        "    __lt__ = __le__ = __gt__ = __ge__ = lambda s, o: True\n"
        "def add(a, b):\n    return Sneaky()\n"
    ),
    "class named int": "class int:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n"
    "    return int()\n",
    "atexit hook exits cleanly": (
        "import atexit, os\natexit.register(lambda: os._exit(0))\ndef add(a, b):\n    raise SystemExit(0)\n"
    ),
    "os._exit inside the function": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "sys.exit at import": "import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b\n",
    "raises a BaseException subclass": ("class Escape(BaseException):\n    pass\ndef add(a, b):\n    raise Escape()\n"),
    "raises KeyboardInterrupt": "def add(a, b):\n    raise KeyboardInterrupt\n",
    "signal handlers that exit": (
        "import os, signal\nfor s in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT):\n"
        "    signal.signal(s, lambda *a: os._exit(0))\nsignal.alarm(1)\ndef add(a, b):\n"
        "    import time\n    time.sleep(5)\n"
    ),
    "patched builtins": (
        "import builtins\nbuiltins.isinstance = lambda *a: True\n"
        "builtins.AssertionError = type('Quiet', (Exception,), {})\n"
        "builtins.abs = lambda x: 0\nisinstance = builtins.isinstance\ndef add(a, b):\n    return None\n"
    ),
    "fake check function": "def check(candidate):\n    pass\ndef add(a, b):\n    return None\n",
    "printed result lines": (
        "import sys\nfor i in range(4):\n    print(f'{i} ok')\n    sys.stderr.write(f'{i} ok\\n')\n"
        "def add(a, b):\n    return None\n"
    ),
    "writes result lines to every fd": (
        "import os\ndef add(a, b):\n    for fd in range(256):\n        try:\n"
        "            os.write(fd, b'0 ok\\n1 ok\\n-3 ok\\n')\n        except OSError:\n            pass\n"
    ),
    "rewrites the caller's frame": (
        "import sys\ndef add(a, b):\n    frame = sys._getframe(1)\n    while frame is not None:\n"
        "        frame.f_globals['AssertionError'] = StopIteration\n"
        "        frame.f_locals.update(candidate=lambda *a: 3)\n"
        "        frame = frame.f_back\n    return None\n"
    ),
    "calls every recorder it can find": (
        "import gc\ndef add(a, b):\n    for obj in gc.get_objects():\n"
        "        if callable(obj) and getattr(obj, '__name__', '') == 'record':\n            for i in range(4):\n"
        "                try:\n                    obj(i, None)\n                except BaseException:\n"
        "                    pass\n"
        "    return None\n"
    ),
    "ctypes patches int equality": (
        "import ctypes\ntry:\n    ctypes.memmove(id(3) + 24, id(0) + 24, 4)\nexcept BaseException:\n    pass\n"
        "def add(a, b):\n    return 0\n"
    ),
    "writes the test process's memory": (
        "import os\ndef add(a, b):\n    try:\n        with open(f'/proc/{os.getppid()}/mem', 'r+b') as mem:\n"
        "            mem.write(b'')\n    except OSError:\n        pass\n    return None\n"
    ),
    "kills the test process": (
        "import os, signal\ndef add(a, b):\n    for target in (os.getppid(), 1, -1):\n        try:\n"
        "            os.kill(target, signal.SIGKILL)\n        except OSError:\n            pass\n    return None\n"
    ),
    "self-referencing list": "def add(a, b):\n    x = []\n    x.append(x)\n    return x\n",
    "generator that yields the answer": "def add(a, b):\n    yield a + b\n",
    "returns the builtin it was asked for": "def add(a, b):\n    return int\n",
    "reads the test's expected values from memory": (
        "import gc, sys, types\ndef find():\n    seen, todo = set(), list(gc.get_objects())\n"
        "    frame = sys._getframe()\n    while frame is not None:\n        todo.append(frame)\n"
        "        frame = frame.f_back\n"
        "    while todo:\n"
        "        obj = todo.pop()\n        if id(obj) in seen:\n            continue\n        seen.add(id(obj))\n"
        "        if isinstance(obj, types.CodeType) and obj.co_name == 'check':\n            return obj\n"
        "        if isinstance(obj, types.FrameType):\n"
        "            todo.extend([obj.f_locals, obj.f_globals, obj.f_code])\n"
        "        elif isinstance(obj, (dict, list, tuple, types.CodeType, types.FunctionType)):\n"
        "            todo.extend(gc.get_referents(obj))\n"
        "def add(a, b):\n    code = find()\n    if code is None:\n        return None\n"
        "    consts = [c for c in code.co_consts if type(c) is int]\n    return 3 if (a, b) == (1, 2) else 0\n"
    ),
    "closes its channel and returns": (
        "import os\ndef add(a, b):\n    for fd in range(3, 256):\n        try:\n            os.close(fd)\n"
        "        except OSError:\n            pass\n    return a + b\n"
    ),
}
