"""Sandbox zygote: a small, long-lived interpreter that runs each code check in fresh isolation.

Started by :mod:`verifiers.sandbox` as ``python -I -S _sandbox_zygote.py`` with an empty environment
(no site-packages, no inherited variables). Once, at start, it enters a private mount namespace
where the whole file system is read-only except a fresh tmpfs on ``/tmp`` (when not root, inside
a user namespace first) and a network namespace of its own with no interface up (see
:func:`enter_slot_network`), imports the common standard-library modules and freezes its heap.
Then it serves requests read from stdin, one at a time.

Each check gets a *runner* made before the check arrives (while the previous check runs, or while
the caller is busy):

1. a fresh working directory in that tmpfs, owned by the check's unprivileged uid (two uids per
   zygote, alternating, so the runner made during a check shares nothing with it);
2. the runner, cloned straight into a new PID namespace, where it is PID 1 in its own session, and a
   new IPC namespace, which holds no System V shared memory, semaphore or message queue and no POSIX
   message queue of another check or of the host, and takes what the check makes there with it once
   the check's processes are gone (and into a new network namespace when the zygote has none of its
   own); it drops to the unprivileged uid, sets ``no_new_privs`` and a parent-death signal, points
   stdout/stderr at a capped file, forks the *program process* (no capabilities) and waits, with
   nothing of any check in its memory.

When the check arrives, the zygote passes its two parts on undecoded (the program to the program
process, the test to the runner, each through an anonymous in-memory file), zeroes its copies and
starts both; each sets its rlimits (CPU, address space, file size = output cap, process count, no
core files, open files), the program process runs the program and the runner runs the
instrumented test against it (see :func:`run_test`). The zygote reads the per-assert records from a
pipe (each line must carry the per-check random nonce), enforces the wall-clock timeout by killing
the runner (as PID 1 of its namespace, its death takes every descendant with it) and writes one
report to the caller. A runner whose test ran to its end is reaped, and its directory removed,
right after the report; any other is killed and reaped before it. The next check starts once the
network namespace holds no socket again (see :func:`slot_network_as_new`).

The runner cannot signal the zygote: it sees no process outside its PID namespace.

Wire format both ways: 4-byte little-endian length + ``marshal`` payload (dicts of plain values);
after a request's header come the program's and the test's requests, marshalled by the caller
(the test's holds code objects compiled by the same interpreter).
"""
import _signal
import builtins
import collections
import ctypes
import gc
import marshal
import os
import resource
import select
import signal
import sys
import time
import types

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUSER = 0x00020000, 0x20000000, 0x40000000, 0x10000000
CLONE_NEWIPC = 0x08000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 1 << 18
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
SYS_MOUNT_SETATTR = 442  # x86_64 and aarch64 share this number
SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(os.uname().machine)
SIGCHLD = 17
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
LINUX_CAPABILITY_VERSION_3, CAP_SETPCAP = 0x20080522, 8
UID_BASE = 1_000_000     # runner uids = UID_BASE + 2 * zygote pid (+ 1): unique among live zygotes
RECORD_NAME = "__sbx_record__"
# Imported once here so that a check importing them pays a dict lookup, not a module load.
PRELOAD = ("array", "bisect", "cmath", "collections", "copy", "dataclasses", "datetime", "decimal", "fractions",
           "functools", "hashlib", "heapq", "itertools", "json", "math", "operator", "random", "re", "statistics",
           "string", "typing")

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
PREFIX, PREFIX_FD = None, None   # set by main(): see open_private_prefix


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


CapSets = CapData * 2
# Looked up here, in the zygote: a check's processes then use these objects instead of building them.
for _function in ("capget", "capset", "prctl", "syscall"):
    getattr(libc, _function)


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount_setattr(path, flags, attr_set, attr_clr):
    attr = MountAttr(attr_set, attr_clr, 0, 0)
    _check(libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr), ctypes.sizeof(attr)),
           f"mount_setattr({path})")


def spawn_runner(caps):
    """Fork the runner, directly into new network, IPC and PID namespaces when the probe found them
    usable: a raw clone(2) with CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWPID, which (unlike unshare) leaves the
    zygote's own namespaces alone and needs no intermediate process. The zygote is
    single-threaded, so skipping Python's after-fork hooks is safe (the runner reseeds
    ``random``, the one hook that matters)."""
    per_check_netns = caps["netns"] and not caps.get("slot_netns")  # else the zygote's own (enter_slot_network)
    flags = ((CLONE_NEWNET if per_check_netns else 0) | (CLONE_NEWIPC if caps["ipcns"] else 0)
             | (CLONE_NEWPID if caps["pidns"] else 0))
    if not flags:
        return os.fork()
    if SYS_CLONE is None:
        raise OSError(0, f"no clone(2) number known for {os.uname().machine}")
    return raw_clone(flags)


def raw_clone(flags):
    """clone(2) with ``flags`` (0: a plain fork) and none of Python's fork hooks: for single-threaded
    callers only, whose child reseeds ``random`` (see :func:`spawn_runner`)."""
    pid = libc.syscall(SYS_CLONE, ctypes.c_ulong(flags | SIGCHLD), None, None, None, None)
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clone: {os.strerror(err)}")
    return pid


def enter_slot_network():
    """Zygote side: move into a new network namespace (no interface up) that this zygote's checks
    take in turn, one at a time; its state as new (see :func:`network_state`)."""
    _check(libc.unshare(CLONE_NEWNET), "unshare network namespace")
    return network_state()


def network_state():
    """What a check could leave in the zygote's network namespace: how many sockets it holds (any
    family; the zygote itself holds none) and its interfaces with their flags and counters."""
    parts = []
    for path in ("/proc/self/net/sockstat", "/proc/self/net/dev"):
        fd = os.open(path, os.O_RDONLY)
        try:
            parts.append(os.read(fd, 1 << 16))
        finally:
            os.close(fd)
    return parts[0].partition(b"\n")[0], parts[1]  # "sockets: used N" counts this namespace's sockets only


def slot_network_as_new(fresh, wait_s=0.05):
    """Whether the zygote's network namespace is back to ``fresh``: the finished check's processes are
    gone, and a socket they kept in flight over a Unix socket goes when the kernel's collector runs."""
    deadline = time.monotonic() + wait_s
    while network_state() != fresh:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def enter_user_namespace():
    """Zygote side, once, when not root: become root of a user namespace mapped to our own uid,
    which allows the mount, network and PID namespaces below without privileges."""
    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(CLONE_NEWUSER), "unshare user namespace")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(text)


def seal_filesystem():
    """Zygote side, once: a private mount namespace where everything is read-only except a fresh
    tmpfs on /tmp (root-owned, mode 0711), which holds only the current check's working directory.
    Nothing a check writes outlives it: its directory is removed before the next check starts."""
    _check(libc.unshare(CLONE_NEWNS), "unshare mount namespace")
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount private /")
    _check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0711,size=64m"), "tmpfs on /tmp")
    _mount_setattr("/", AT_RECURSIVE, MOUNT_ATTR_RDONLY, 0)
    _mount_setattr("/tmp", 0, 0, MOUNT_ATTR_RDONLY)


def open_private_prefix():
    """An O_PATH fd to the interpreter prefix when a private ancestor (e.g. /root, mode 0700) would
    hide the standard library from the dropped uid; ``None`` when the path is traversable."""
    prefix = os.path.realpath(sys.base_prefix)
    path = "/"
    for part in prefix.strip("/").split("/"):
        path = os.path.join(path, part)
        if not os.stat(path).st_mode & 0o001:
            return prefix, os.open(prefix, os.O_PATH | os.O_DIRECTORY)
    return prefix, None


def reach_stdlib_through_fd(prefix, fd):
    """Import the stdlib through /proc/self/fd/<fd> (an fd opened while root; runners inherit it),
    which needs no permission on the private ancestors of the prefix once the uid is dropped."""
    via = f"/proc/self/fd/{fd}"

    def moved(paths):
        return [via + p[len(prefix):] if p.startswith(prefix) else p for p in paths]

    sys.path[:] = moved(sys.path)
    for module in list(sys.modules.values()):  # submodules of already-imported packages
        if isinstance(getattr(module, "__path__", None), list):
            module.__path__[:] = moved(module.__path__)


def probe(caps):
    """Which per-check layers this kernel and user allow, strongest first: tried in a throwaway
    process tree exactly as a check would use them."""
    order = [("netns", "pidns", "drop_uid"), ("netns", "pidns"), ("netns",), ()]
    if caps["userns"]:  # our user namespace maps one uid only: nothing to drop to
        order = order[1:]
    order = [layers + extra for layers in order for extra in (("ipcns",), ())]  # each with an IPC namespace first
    uid = runner_uid(0)
    for layers in order:
        trial = dict(caps, **{k: True for k in layers})
        try:
            workdir = make_workdir(trial, "probe", uid)
        except OSError:
            continue
        try:
            pid = spawn_runner(trial)
            if pid == 0:
                try:
                    if trial["drop_uid"]:
                        drop_privileges(uid)
                        import json  # noqa: F401  (not yet imported: proves the stdlib is reachable)
                    os._exit(0 if not trial["pidns"] or os.getpid() == 1 else 1)
                except BaseException:
                    os._exit(1)
            if os.waitpid(pid, 0)[1] == 0:
                return trial
        except OSError:
            continue
        finally:
            remove_tree(workdir)
    return caps


def drop_privileges(uid):
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def make_workdir(caps, tag, uid):
    """A fresh private directory under /tmp, owned by the runner's uid when it is dropped."""
    path = os.path.join("/tmp", f"llm-marl-sbx-{tag}-{os.urandom(8).hex()}")
    os.mkdir(path, 0o700)
    if caps["drop_uid"]:
        os.chown(path, uid, uid)
    return path


def make_recorder(fd, nonce):
    """The only writer of result lines; binds os.write now so later monkeypatching cannot reach it."""
    write, name_of = os.write, type

    def record(index, exc):
        if exc is None:
            line = b"%s %d ok\n" % (nonce, index)
        else:
            try:
                text = (f"{name_of(exc).__name__}: {exc}")[:300]
            except BaseException:
                text = name_of(exc).__name__
            line = b"%s %d %s\n" % (nonce, index, text.encode("utf-8", "replace").replace(b"\n", b"\\n"))
        write(fd, line)

    return record


def rename_global(code, old, new):
    """``code`` with every global ``old`` renamed ``new`` (nested code objects included)."""
    consts = tuple(rename_global(c, old, new) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_consts=consts, co_names=tuple(new if n == old else n for n in code.co_names))


# ---------------------------------------------------------------- plain values and the program process
PLAIN_SCALARS = (int, float, complex, bool, str, bytes, type(None))
PLAIN_CONTAINERS = (list, tuple, set, frozenset, dict)
PLAIN_MAX_DEPTH = 100
PLAIN_NAMES = "int, float, complex, bool, str, bytes, None, or a list/tuple/dict/set/frozenset of them"


def _stdlib_dict_types():
    import collections
    return (collections.Counter, collections.defaultdict, collections.OrderedDict)


# The standard library's dict subclasses reach the test as the plain dict they hold (tests compare
# them with dict literals): in the program process only, where a patched ``collections`` changes
# nothing but the data sent.
READ_AS_DICT = _stdlib_dict_types()


def is_plain(value, depth=0, active=None):
    """Whether ``value`` is exactly a built-in plain type (no subclass), recursively, without cycles."""
    kind = type(value)
    if any(kind is scalar for scalar in PLAIN_SCALARS):
        return True
    if not any(kind is container for container in PLAIN_CONTAINERS) or depth > PLAIN_MAX_DEPTH:
        return False
    active = set() if active is None else active
    if id(value) in active:
        return False
    active.add(id(value))
    items = [x for pair in value.items() for x in pair] if kind is dict else value
    plain = all(is_plain(item, depth + 1, active) for item in items)
    active.discard(id(value))
    return plain


class NotPlainValue(BaseException):
    """A test used a value of the program that is not plain: the assert it is in fails.

    A ``BaseException``, so ``except Exception`` in a test does not swallow it."""


class ProgramError(Exception):
    """The program raised an exception that is not a built-in one, or its process ended."""


class ProgramValue:
    """A value that lives in the program's process: a function, a class, an instance.

    The test may call it, read and set its attributes and pass it back to the program; results come
    back as plain values or as other ``ProgramValue``\\s. Comparing, hashing, testing its truth,
    iterating, indexing or computing with it raises :class:`NotPlainValue`, so an object with its
    own ``__eq__`` never decides an assert.
    """

    __slots__ = ("_channel", "_handle", "_type_name")

    def __init__(self, channel, handle, type_name):
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_type_name", type_name)

    def __call__(self, *args, **kwargs):
        return self._channel.request("call", self._handle, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._channel.request("getattr", self._handle, name, None)

    def __setattr__(self, name, value):
        self._channel.request("setattr", self._handle, name, value)

    def __repr__(self):
        return f"<{self._type_name} value of the program>"

    __str__ = __repr__

    def _refuse(self, *args):
        raise NotPlainValue(
            f"the program returned an object of type {self._type_name}, not a plain value ({PLAIN_NAMES}); the test "
            "does not compare or compute with it"
        )


for _name in ("eq", "ne", "lt", "le", "gt", "ge", "hash", "bool", "len", "iter", "contains", "getitem", "setitem",
              "delitem", "reversed", "int", "float", "complex", "index", "round", "abs", "neg", "pos", "invert",
              "add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "divmod", "pow", "lshift", "rshift",
              "and", "or", "xor", "radd", "rsub", "rmul", "rmatmul", "rtruediv", "rfloordiv", "rmod", "rdivmod",
              "rpow", "rlshift", "rrshift", "rand", "ror", "rxor", "enter", "exit", "fspath", "bytes"):
    setattr(ProgramValue, f"__{_name}__", ProgramValue._refuse)


class ProgramChannel:
    """The test's side of the pipes to the program process: requests out, plain values back."""

    def __init__(self, to_program, from_program, program_pid):
        self.to_program, self.from_program, self.program_pid = to_program, from_program, program_pid
        self.gone = None
        self.sent_ahead = collections.deque()  # calls whose replies are on their way, in order

    def send_ahead(self, target, calls):
        """Send the calls of the test's first asserts (``((args, kwargs), ...)``, literals found by
        :func:`verifiers.sandbox.instrument_test`) to ``target`` in one message. The program process
        answers them one by one, in that order, as it would if each were sent when the test makes it;
        each call the test then makes must be the next of them (see :meth:`request`)."""
        if type(target) is not ProgramValue or not calls or self.gone is not None:
            return
        handle = object.__getattribute__(target, "_handle")
        payloads = [("call", handle, tuple(self.encode(x) for x in args), {k: self.encode(v) for k, v in kwargs})
                    for args, kwargs in calls]
        try:
            write_message(self.to_program, ("calls", handle, [(p[2], p[3]) for p in payloads], None))
        except OSError:
            return  # the program is gone: the test's first call finds out
        self.sent_ahead.extend(payloads)

    def encode(self, value, depth=0):
        """An argument for the program: plain values as they are, proxies by handle, built-in
        classes (``int``, ``str``, ...) by name, lists/tuples/dict values holding proxies item by item."""
        kind = type(value)
        if kind is ProgramValue:
            return ("h", object.__getattribute__(value, "_handle"))
        if is_plain(value):
            return ("v", value)
        if kind is type and getattr(builtins, value.__name__, None) is value:
            return ("b", value.__name__)
        if depth < PLAIN_MAX_DEPTH and (kind is list or kind is tuple):
            return ("l" if kind is list else "t", [self.encode(item, depth + 1) for item in value])
        if depth < PLAIN_MAX_DEPTH and kind is dict and all(is_plain(key) for key in value):
            return ("d", [(key, self.encode(item, depth + 1)) for key, item in value.items()])
        raise TypeError(
            f"the test can pass the program only plain values ({PLAIN_NAMES}) and values the program returned, "
            f"got {type(value).__name__}"
        )

    def decode(self, message):
        if type(message) is tuple and len(message) == 2 and message[0] == "v" and is_plain(message[1]):
            return message[1]
        if (type(message) is tuple and len(message) == 3 and message[0] == "h" and type(message[1]) is int
                and type(message[2]) is str):
            return ProgramValue(self, message[1], message[2][:100])
        if type(message) is tuple and len(message) == 2 and message[0] == "m" and message[1] in sys.modules:
            return sys.modules[message[1]]  # a module this interpreter imported itself: no import runs here
        raise ProgramError("the program process sent something that is not a plain value")

    def receive(self):
        if self.gone is not None:
            raise ProgramError(self.gone)
        try:
            reply = read_message(self.from_program)
        except BaseException:
            reply = None
        if reply is None:
            self.gone = f"the program's process ended ({self.exit_status()})"
            raise ProgramError(self.gone)
        return reply

    def exit_status(self):
        pid, status = 0, 0
        for _ in range(20):  # a process that closed its pipes is usually a few ms from its exit
            try:
                pid, status = os.waitpid(self.program_pid, os.WNOHANG)
            except OSError:
                return "exit status unknown"
            if pid:
                break
            time.sleep(0.01)
        if pid == 0:
            return "it closed its channel"
        if os.WIFSIGNALED(status):
            return f"killed by signal {os.WTERMSIG(status)}"
        return f"exit code {os.WEXITSTATUS(status)}"

    def request(self, op, handle, a, b):
        if op == "call":
            payload = (op, handle, tuple(self.encode(x) for x in a), {k: self.encode(v) for k, v in b.items()})
        elif op == "setattr":
            payload = (op, handle, a, self.encode(b))
        else:
            payload = (op, handle, a, None)
        if self.gone is not None:
            raise ProgramError(self.gone)
        if self.sent_ahead:  # its reply is on the way, or this call is not the one sent ahead: fail closed
            if not same_value(payload, self.sent_ahead.popleft()):
                self.gone = "the test's calls did not follow the order sent ahead to the program"
                raise ProgramError(self.gone)
        else:
            try:
                write_message(self.to_program, payload)
            except OSError:
                self.gone = f"the program's process ended ({self.exit_status()})"
                raise ProgramError(self.gone) from None
        reply = self.receive()
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "ok":
            return self.decode(reply[1])
        if (type(reply) is tuple and len(reply) == 3 and reply[0] == "raised" and type(reply[1]) is str
                and type(reply[2]) is str):
            builtin = getattr(builtins, reply[1], None)
            if isinstance(builtin, type) and issubclass(builtin, Exception):
                raise builtin(reply[2][:300])
            raise ProgramError(f"{reply[1][:100]}: {reply[2][:300]}")
        raise ProgramError("the program process sent an unreadable reply")


def same_value(a, b):
    """``a == b`` that also tells apart types (``1``, ``1.0``, ``True``) and signed zeros."""
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is float or kind is complex:
        return repr(a) == repr(b)
    if kind is list or kind is tuple:
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if kind is dict:
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a.items(), b.items()))
    return a == b


def serve_program(req, inbox, outbox):
    """Program process: run the program, report its names, then answer the test's requests. Never returns."""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    objects = []

    def encode(value):
        if is_plain(value):
            return ("v", value)
        if type(value) in READ_AS_DICT and is_plain(dict(value)):
            return ("v", dict(value))
        if isinstance(value, types.ModuleType):
            return ("m", value.__name__)
        objects.append(value)
        return ("h", len(objects) - 1, type(value).__name__)

    def decode(item):
        tag, body = item[0], item[1]
        if tag == "h":
            return objects[body]
        if tag == "b":
            return getattr(builtins, body)
        if tag == "l" or tag == "t":
            items = [decode(x) for x in body]
            return items if tag == "l" else tuple(items)
        if tag == "d":
            return {key: decode(x) for key, x in body}
        return body

    def describe(err):
        try:
            return (f"{type(err).__name__}: {err}")[:300]
        except BaseException:
            return type(err).__name__

    try:
        exec(compile(req["program"], "<program>", "exec", dont_inherit=True, optimize=0), namespace)
        entry_point = req["entry_point"]
        if entry_point and not callable(namespace.get(entry_point)):
            raise NameError(f"entry point {entry_point!r} is not defined as a function by the program")
        names = {name: encode(value) for name, value in list(namespace.items())
                 if not (name.startswith("__") and name.endswith("__"))}
        write_message(outbox, ("ready", names))
    except SyntaxError as err:
        write_message(outbox, ("failed", f"SyntaxError: line {err.lineno}: {err.msg}"))
        os._exit(0)
    except BaseException as err:  # SystemExit included: exiting early never counts as passing
        write_message(outbox, ("failed", describe(err)))
        os._exit(0)
    def answer(op, handle, a, b):
        try:
            target = objects[handle]
            if op == "call":
                result = target(*[decode(x) for x in a], **{k: decode(v) for k, v in b.items()})
            elif op == "getattr":
                result = getattr(target, a)
            else:
                setattr(target, a, decode(b))
                result = None
            return ("ok", encode(result))
        except BaseException as err:
            return ("raised", type(err).__name__, describe(err).partition(": ")[2])

    while True:
        message = read_message(inbox)
        if message is None:
            os._exit(0)
        op, handle, a, b = message
        if op == "calls":  # sent ahead: each answered in turn, as if it had come alone
            for args, kwargs in a:
                write_message(outbox, answer("call", handle, args, kwargs))
        else:
            write_message(outbox, answer(op, handle, a, b))


def set_limits(req):
    """This process's rlimits for the check: CPU time, address space, file size (the output cap),
    process count, no core files, open files (inherited by anything it forks)."""
    cpu = int(req["timeout"]) + 1
    limits = {resource.RLIMIT_CPU: (cpu, cpu + 1), resource.RLIMIT_AS: (req["memory_bytes"],) * 2,
              resource.RLIMIT_FSIZE: (req["output_bytes"],) * 2, resource.RLIMIT_NPROC: (req["max_processes"],) * 2,
              resource.RLIMIT_CORE: (0, 0), resource.RLIMIT_NOFILE: (256, 256)}
    for which, value in limits.items():
        resource.setrlimit(which, value)


def start_program(request):
    """Fork the program process before anything of the check is known (no capabilities, no result
    channel, no access to the test's file); it waits for its own part of the request on ``request``
    (go pipe, in-memory file). The test's channel to it."""
    to_program_r, to_program_w = os.pipe()
    from_program_r, from_program_w = os.pipe()
    pid = os.fork() if SYS_CLONE is None else raw_clone(0)  # the test process is single-threaded
    if pid == 0:
        try:
            if "random" in sys.modules:
                sys.modules["random"].seed()
            os.close(to_program_w)
            os.close(from_program_r)
            keep = sorted(fd for fd in (to_program_r, from_program_w, *request, PREFIX_FD) if fd is not None)
            for low, high in zip([3] + [fd + 1 for fd in keep], keep + [1 << 16]):
                os.closerange(low, high)  # the result pipe and the test among them: the program never holds them
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            drop_capabilities()
            req = read_request(*request)
            if req is None:
                os._exit(0)
            set_limits(req)
            serve_program(req, to_program_r, from_program_w)
        except BaseException:
            os._exit(121)
        os._exit(0)
    for fd in (to_program_r, from_program_w, *request):
        os.close(fd)
    return ProgramChannel(to_program_w, from_program_r, pid)


def drop_capabilities():
    """Empty the bounding, permitted, effective and inheritable capability sets of this process
    (root of a user namespace holds them all there; without them it cannot trace the test process)."""
    header, held = CapHeader(LINUX_CAPABILITY_VERSION_3, 0), CapSets()
    libc.capget(ctypes.byref(header), held)
    if held[0].effective & (1 << CAP_SETPCAP):  # without it (a dropped uid) the bounding set cannot change
        for cap in range(64):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # fails harmlessly for caps we do not hold
    libc.capset(ctypes.byref(header), CapSets())  # dropping is always allowed; a refusal leaves
    # the test process protected by its non-dumpable flag against an unprivileged program


def run_test(req, channel, record, record_name):
    """Test process: run the instrumented test against the program process, reporting through
    ``record``; whether the test ran to its end. The test sees the program's names as plain values or
    ``ProgramValue``\\s."""
    test_code, task_code = req["test_code"], req["task_code"]
    try:
        ready = channel.receive()
    except ProgramError as err:
        record(-1, ProgramError(f"the program exited before the tests: {err}"))
        return False
    if type(ready) is tuple and len(ready) == 2 and ready[0] == "failed" and type(ready[1]) is str:
        record(-1, ProgramError(ready[1][:300]))
        return False
    if not (type(ready) is tuple and len(ready) == 2 and ready[0] == "ready" and type(ready[1]) is dict):
        record(-1, ProgramError("the program process sent an unreadable greeting"))
        return False
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    entry_point = req["entry_point"]
    for name, item in ready[1].items():
        if type(name) is not str or not name.isidentifier() or (hasattr(builtins, name) and name != entry_point):
            continue  # a program cannot shadow the test's builtins (isinstance, abs, ...)
        try:
            namespace[name] = channel.decode(item)
        except BaseException:
            continue
    namespace[record_name] = record
    ahead = req["calls_ahead"]  # (name, calls) of the test's first asserts, or None
    try:
        if task_code is not None:  # the task's own helpers win over the program's of the same name
            exec(task_code, namespace)
        test_code = rename_global(test_code, RECORD_NAME, record_name)
        if ahead is not None and not req["call_check"]:  # top-level asserts
            channel.send_ahead(namespace.get(ahead[0]), ahead[1])
        exec(test_code, namespace)
        if req["call_check"]:
            if ahead is not None:  # the asserts at the top of check(candidate)
                channel.send_ahead(namespace[entry_point], ahead[1])
            namespace["check"](namespace[entry_point])
    except BaseException as err:
        record(-2, err)
        return False
    finally:
        try:
            os.kill(channel.program_pid, signal.SIGKILL)
        except OSError:
            pass
    return True


def runner(caps, workdir, uid, result_fd, out_fd, nonce, request, program_request):
    """Child side after clone: isolate, fork the program process, wait for the check, run it. Never returns.

    Everything up to the wait happens before the check arrives (see :func:`prepare_runner`); the test
    (and the limits) is read from ``request`` only after the program process is forked, which gets
    ``program_request`` (its go pipe and the file with the program)."""
    try:
        os.setsid()
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        keep = sorted(fd for fd in (result_fd, *request, *program_request, PREFIX_FD) if fd is not None)
        for low, high in zip([3] + [fd + 1 for fd in keep], keep + [1 << 16]):
            os.closerange(low, high)
        os.chdir(workdir)
        os.environ["HOME"] = os.environ["TMPDIR"] = workdir  # the rest of the environment is the zygote's (main)
        if caps["drop_uid"]:
            drop_privileges(uid)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for sig in (_signal.SIGINT, _signal.SIGTERM, _signal.SIGPIPE, _signal.SIGXFSZ):
            _signal.signal(sig, _signal.SIG_DFL)  # the C function: signal.signal's enum wrapping costs page faults
        if "random" in sys.modules:  # the one after-fork hook a raw clone skips
            sys.modules["random"].seed()
        record_name = f"__sbx_{os.urandom(8).hex()}__"
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the program process may not trace or read this one
        channel = start_program(program_request)
        req = read_request(*request)  # only now: the program's copy of memory never holds the test
        if req is None:
            os._exit(0)
        set_limits(req)
        record = make_recorder(result_fd, nonce)
        completed = run_test(req, channel, record, record_name)
        sys.stdout.flush()
        sys.stderr.flush()
        if completed:  # the last line; with the pipe closed, the zygote reports without waiting for the exit
            record(-3, None)
            os.close(result_fd)
    except BaseException as err:
        try:
            os.write(2, b"sandbox runner setup failed: %s\n" % repr(err).encode())
        except BaseException:
            pass
        os._exit(120)
    os._exit(0)


def read_request(go_fd, request_fd):
    """Runner side: wait for the zygote's go byte, then the request dict from the in-memory file
    (``None`` when the zygote closed the go pipe without a check)."""
    if not os.read(go_fd, 1):
        return None
    os.close(go_fd)
    size = os.fstat(request_fd).st_size
    data, offset = bytearray(), 0
    while offset < size:
        chunk = os.pread(request_fd, size - offset, offset)
        if not chunk:
            break
        data += chunk
        offset += len(chunk)
    os.close(request_fd)
    return marshal.loads(bytes(data))


def runner_uid(check_index):
    """The unprivileged uid of a check: two per zygote, alternating, so that the next check's runner,
    made while a check runs, shares nothing with it (process count, files, the sweep)."""
    return UID_BASE + 2 * os.getpid() + check_index % 2


def prepare_runner(caps, uid):
    """Clone a check's runner before the check arrives, so that making its namespaces, setting it up
    and forking its program process overlap with other work instead of adding to each check's
    latency. The runner waits on a go pipe; the request itself goes into an anonymous in-memory file
    (a write that never blocks on the runner)."""
    nonce = os.urandom(16).hex().encode()
    workdir = make_workdir(caps, "run", uid)
    # the zygote keeps this fd and reads the output through it, whatever the program does to the path
    out_fd = os.open(os.path.join(workdir, ".output"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    if caps["drop_uid"]:
        os.fchown(out_fd, uid, uid)
    read_fd, write_fd = os.pipe()
    go_r, go_w = os.pipe()
    program_go_r, program_go_w = os.pipe()
    request_fd = os.memfd_create("sandbox-test", os.MFD_CLOEXEC)
    program_fd = os.memfd_create("sandbox-program", os.MFD_CLOEXEC)
    pid = spawn_runner(caps)
    if pid == 0:
        for fd in (read_fd, go_w, program_go_w):
            os.close(fd)
        runner(caps, workdir, uid, write_fd, out_fd, nonce, (go_r, request_fd), (program_go_r, program_fd))
    for fd in (write_fd, go_r, program_go_r):
        os.close(fd)
    try:
        pidfd = os.pidfd_open(pid)  # readable once the runner exits
    except (OSError, AttributeError):
        pidfd = None
    return {"pid": pid, "workdir": workdir, "uid": uid, "out_fd": out_fd, "read_fd": read_fd, "go_fd": go_w,
            "request_fd": request_fd, "program_go_fd": program_go_w, "program_fd": program_fd, "nonce": nonce,
            "pidfd": pidfd, "status": None}


def stop_runner(standby, caps):
    """Kill a runner and its process group (with its PID namespace, everything it started) and reap it,
    unless it was reaped already; without a PID namespace, also every process of its uid."""
    if standby["status"] is not None:
        return
    for target in (os.kill, os.killpg):
        try:
            target(standby["pid"], signal.SIGKILL)
        except OSError:
            pass
    standby["status"] = os.waitpid(standby["pid"], 0)[1]
    if standby["pidfd"] is not None:
        os.close(standby["pidfd"])
        standby["pidfd"] = None
    if caps["drop_uid"] and not caps["pidns"]:
        sweep_uid(standby["uid"])


def discard_runner(standby, caps):
    """Stop a runner that never got a check (the zygote is exiting) and remove its directory."""
    for name in ("go_fd", "request_fd", "program_go_fd", "program_fd", "read_fd", "out_fd"):
        os.close(standby[name])
    stop_runner(standby, caps)
    remove_workdir(standby["workdir"], caps)


def supervise(header, program, test, caps, standby, next_uid):
    """Run one check in the prepared runner; return the report dict and the next check's runner.

    ``program`` and ``test`` (marshalled by the caller) go to the program process and the runner as
    they came and are then zeroed: the zygote never decodes a check, so no runner cloned from it
    holds anything of another check. With the uid drop, the next runner is made (under the other
    uid) while this check runs; this check cannot reach it (other PID and network namespaces, other
    uid, a directory of mode 0700 in a /tmp it cannot list). Otherwise it is made after this check
    is gone (see :func:`main`)."""
    started = time.monotonic()
    for blob, fd in ((program, "program_fd"), (test, "request_fd")):
        write_all(standby[fd], blob)
        blob[:] = bytes(len(blob))
        os.close(standby[fd])
    for fd in ("program_go_fd", "go_fd"):  # the program starts compiling while the runner reads the test
        try:
            os.write(standby[fd], b"g")
        except OSError:
            pass  # the runner died before its check: reported from its exit status
        os.close(standby[fd])
    upcoming = None
    if caps["drop_uid"]:
        try:
            upcoming = prepare_runner(caps, next_uid)
        except OSError:
            upcoming = None  # made again when the next check arrives
    try:
        report = finish_check(header, caps, started, standby)
    except BaseException:
        if upcoming is not None:
            discard_runner(upcoming, caps)
        raise
    return report, upcoming


def finish_check(header, caps, started, standby):
    """Collect the runner's result lines until it closes its pipe or times out; the report.

    A runner whose last line says the test ran to its end has nothing left to do but exit (status
    0): it is reaped, and its directory removed, after the report is sent (see :func:`main`).
    Otherwise it is killed and reaped first, for its exit status."""
    read_fd, out_fd, nonce = standby["read_fd"], standby["out_fd"], standby["nonce"]
    deadline = started + header["timeout"]
    buf, timed_out = bytearray(), False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([read_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        if len(buf) < (1 << 22):  # records beyond 4 MiB are dropped, not buffered
            buf += chunk
    os.close(read_fd)
    lines = bytes(buf).split(b"\n")
    if timed_out or b"%s -3 ok" % nonce not in lines:
        stop_runner(standby, caps)
    status = standby["status"]
    output = os.pread(out_fd, header["output_keep"], 0)
    os.close(out_fd)
    records = []
    for line in lines:
        head, _, rest = line.partition(b" ")
        if head != nonce:
            continue  # forged or partial line
        index, _, text = rest.partition(b" ")
        records.append((int(index), text.decode("utf-8", "replace")))
    return {"records": records, "timed_out": timed_out,
            "exit_code": 0 if status is None else os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None,
            "output": output, "elapsed_s": time.monotonic() - started}


def remove_workdir(path, caps, keep=None):
    """Remove the check's directory (two syscalls when the program left nothing behind); with the
    private /tmp, also anything else a runner managed to put there (root of a user namespace),
    except ``keep``, the next check's fresh directory."""
    try:
        os.unlink(os.path.join(path, ".output"))
        os.rmdir(path)
    except OSError:
        remove_tree(path)
    if caps["readonly_fs"]:
        for entry in os.scandir("/tmp"):
            if entry.path == keep:
                continue
            if entry.is_dir(follow_symlinks=False):
                remove_tree(entry.path)
            else:
                os.unlink(entry.path)


def remove_tree(path):
    """``shutil.rmtree`` that ignores errors, imported on first use: a zygote whose checks leave no
    files behind never loads it (every module the zygote holds makes each clone of it dearer)."""
    import shutil
    shutil.rmtree(path, ignore_errors=True)


def sweep_uid(uid):
    """Without a PID namespace: kill every process of the runner's uid (escaped descendants)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        except BaseException:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def read_message(fd, deadline=None):
    """One framed message from ``fd``; ``None`` at end of file or past ``deadline`` (monotonic)."""
    head = read_exact(fd, 4, deadline)
    body = None if head is None else read_exact(fd, int.from_bytes(head, "little"), deadline)
    return None if body is None else marshal.loads(body)


def read_exact(fd, n, deadline=None):
    """``n`` bytes from ``fd``, or ``None`` at end of file or past ``deadline``."""
    parts, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def read_into(fd, n):
    """``n`` bytes from ``fd`` into a new bytearray (which the caller can zero), or ``None`` at end of file."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        count = os.readv(fd, [view[got:]])
        if not count:
            view.release()
            buf[:] = bytes(n)
            return None
        got += count
    view.release()
    return buf


def write_all(fd, data):
    """Write all of ``data`` (bytes-like) to ``fd``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    view.release()


def write_message(fd, obj):
    """Write ``obj`` as one framed message (length + marshal)."""
    body = marshal.dumps(obj)
    write_all(fd, len(body).to_bytes(4, "little") + body)


def main():
    reply_fd = os.dup(1)  # the caller's pipe; fd 1 itself is pointed at /dev/null
    devnull = os.open("/dev/null", os.O_WRONLY)
    os.dup2(devnull, 1)
    global PREFIX, PREFIX_FD
    caps = {"netns": False, "ipcns": False, "pidns": False, "readonly_fs": False, "userns": False, "drop_uid": False}
    if os.geteuid() != 0:
        try:
            enter_user_namespace()
            caps["userns"] = True
        except (OSError, AttributeError):
            pass
    if os.geteuid() == 0:  # really root, or root of our user namespace
        PREFIX, PREFIX_FD = open_private_prefix()
        if PREFIX_FD is not None:  # from now on every import goes through the fd
            reach_stdlib_through_fd(PREFIX, PREFIX_FD)
        try:
            seal_filesystem()
            caps["readonly_fs"] = True
        except (OSError, AttributeError):
            pass
    caps = probe(caps)
    caps["slot_netns"], fresh_network = False, None
    if caps["netns"] and (caps["readonly_fs"] or caps["drop_uid"]):  # no check can change its settings
        try:
            fresh_network = enter_slot_network()
            caps["slot_netns"] = True
        except OSError:
            pass  # a network namespace per check, as the probe made them
    os.environ.clear()  # a check's environment: these, with HOME and TMPDIR set by its runner
    os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/", "TMPDIR": "/"})
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    # not dumpable: a runner or program of the same uid cannot trace the zygote or read its memory
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    gc.collect()
    gc.freeze()  # forked runners then leave the zygote's objects alone: fewer copy-on-write faults
    standby, previous, checks = None, None, 0
    try:
        standby = prepare_runner(caps, runner_uid(checks))
    except OSError:
        pass  # made again when the check arrives
    write_message(reply_fd, {"caps": caps, "pid": os.getpid(), "standby": standby and standby["pid"]})
    while True:
        if standby is None:  # the next check's runner, made while the caller is busy
            previous = end_check(previous, caps)  # same uid as the last check: that one must be gone first
            try:
                standby = prepare_runner(caps, runner_uid(checks))
            except OSError:
                standby = None  # made again when the check arrives
        previous = await_request(previous, caps, standby)
        header = read_message(0)  # {"timeout", "output_keep", "program_size", "test_size"}, then the two blobs
        program = None if header is None else read_into(0, header["program_size"])
        test = None if program is None else read_into(0, header["test_size"])
        previous = end_check(previous, caps, standby)
        if test is None:
            if standby is not None:
                discard_runner(standby, caps)
            return
        if caps["slot_netns"] and not slot_network_as_new(fresh_network):
            standby, fresh_network = renew_slot_network(caps, standby, runner_uid(checks))
        try:
            if standby is None:
                standby = prepare_runner(caps, runner_uid(checks))
            previous = standby
            report, standby = supervise(header, program, test, caps, previous, runner_uid(checks + 1))
        except BaseException as err:  # a bug here must not take the zygote down
            report = {"error": f"sandbox supervisor failed: {type(err).__name__}: {err}"}
            standby = None
        for blob in (program, test):
            blob[:] = bytes(len(blob))
        checks += 1
        report.update(runner=previous and previous["pid"], standby=standby and standby["pid"])
        write_message(reply_fd, report)
        if not caps["pidns"]:  # its processes outlive the runner until swept: no waiting for the next check
            previous = end_check(previous, caps, standby)


def renew_slot_network(caps, standby, uid):
    """Leave a network namespace that a finished check did not leave as new (a socket still open) for a
    new one, with a new runner for the next check in it. Raises (and the zygote exits) if it cannot."""
    if standby is not None:
        discard_runner(standby, caps)
    fresh = enter_slot_network()
    try:
        return prepare_runner(caps, uid), fresh
    except OSError:
        return None, fresh  # made again when the check starts


def await_request(finished, caps, standby):
    """Wait for the caller's next request; meanwhile reap the finished check's runner as soon as it
    exits (and remove its directory). The finished check, or ``None`` once it is ended."""
    while finished is not None and finished["pidfd"] is not None:
        ready = select.select([0, finished["pidfd"]], [], [])[0]
        if finished["pidfd"] in ready:
            finished = end_check(finished, caps, standby)
        elif 0 in ready:
            break
    return finished


def end_check(finished, caps, standby=None):
    """Reap a finished check's runner (killing what is left of it) and remove its directory, keeping the
    directory of ``standby``, the next check's runner. Done after the report is sent, before the next
    check starts: a runner that finished its test only has its exit left, which overlaps with the
    caller's work. Returns ``None`` (nothing left to end)."""
    if finished is not None:
        stop_runner(finished, caps)
        remove_workdir(finished["workdir"], caps, keep=standby["workdir"] if standby else None)
    return None


if __name__ == "__main__":
    main()
