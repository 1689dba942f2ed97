"""Sandbox zygote: a small, long-lived interpreter that runs each code check in fresh isolation.

Started by :mod:`verifiers.code` as ``python -I -S _sandbox_zygote.py`` with an empty environment
(no site-packages, no inherited variables). Once, at start, it enters a private mount namespace
where the whole file system is read-only except a fresh tmpfs on ``/tmp`` (when not root, inside
a user namespace first), imports the common standard-library modules and freezes its heap. Then
it serves requests read from stdin, one at a time. Per request it

1. makes a fresh working directory in that tmpfs, owned by the check's unprivileged uid,
2. clones the *runner* straight into a new network namespace (no interface up: no network at
   all) and a new PID namespace, where it is PID 1 in its own session; the runner drops to the
   unprivileged uid, sets rlimits (CPU, address space, file size = output cap, process count, no
   core files, open files), ``no_new_privs`` and a parent-death signal, points stdout/stderr at
   a capped file and executes the program, then the instrumented test,
3. reads the runner's per-assert records from a pipe (each line must carry the per-check random
   nonce), enforces the wall-clock timeout by killing the runner (as PID 1 of its namespace, its
   death takes every descendant with it), removes the working directory and writes one report
   to the caller.

The runner cannot signal the zygote: it sees no process outside its PID namespace.

Wire format both ways: 4-byte little-endian length + ``marshal`` payload (dicts of plain values
and, from the caller, one code object compiled by the same interpreter).
"""
import ctypes
import gc
import marshal
import os
import platform
import resource
import select
import shutil
import signal
import sys
import time
import types

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUSER = 0x00020000, 0x20000000, 0x40000000, 0x10000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 1 << 18
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
SYS_MOUNT_SETATTR = 442  # x86_64 and aarch64 share this number
SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(platform.machine())
SIGCHLD = 17
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
UID_BASE = 1_000_000     # runner uid = UID_BASE + zygote pid: unique among live zygotes
RECORD_NAME = "__sbx_record__"
# Imported once here so that a check importing them pays a dict lookup, not a module load.
PRELOAD = ("array", "bisect", "cmath", "collections", "copy", "dataclasses", "datetime", "decimal", "fractions",
           "functools", "hashlib", "heapq", "itertools", "json", "math", "operator", "random", "re", "statistics",
           "string", "typing")

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
PREFIX, PREFIX_FD = None, None   # set by main(): see open_private_prefix


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
    """Fork the runner, directly into new network and PID namespaces when the probe found them
    usable: a raw clone(2) with CLONE_NEWNET | CLONE_NEWPID, which (unlike unshare) leaves the
    zygote's own namespaces alone and needs no intermediate process. The zygote is
    single-threaded, so skipping Python's after-fork hooks is safe (the runner reseeds
    ``random``, the one hook that matters)."""
    flags = (CLONE_NEWNET if caps["netns"] else 0) | (CLONE_NEWPID if caps["pidns"] else 0)
    if not flags:
        return os.fork()
    if SYS_CLONE is None:
        raise OSError(0, f"no clone(2) number known for {platform.machine()}")
    pid = libc.syscall(SYS_CLONE, ctypes.c_ulong(flags | SIGCHLD), None, None, None, None)
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clone: {os.strerror(err)}")
    return pid


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
    uid = UID_BASE + os.getpid()
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
            shutil.rmtree(workdir, ignore_errors=True)
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
                text = ("%s: %s" % (name_of(exc).__name__, exc))[:300]
            except BaseException:
                text = name_of(exc).__name__
            line = b"%s %d %s\n" % (nonce, index, text.encode("utf-8", "replace").replace(b"\n", b"\\n"))
        write(fd, line)

    return record


def rename_global(code, old, new):
    """``code`` with every global ``old`` renamed ``new`` (nested code objects included)."""
    consts = tuple(rename_global(c, old, new) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_consts=consts, co_names=tuple(new if n == old else n for n in code.co_names))


def run_program(req, record, record_name):
    """Runner: execute the program, then the instrumented test, reporting through ``record``."""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        code = compile(req["program"], "<program>", "exec", dont_inherit=True, optimize=0)
    except SyntaxError as err:
        record(-1, SyntaxError(f"line {err.lineno}: {err.msg}"))
        return
    except BaseException as err:
        record(-1, err)
        return
    try:
        exec(code, namespace)
    except BaseException as err:  # SystemExit included: exiting early never counts as passing
        record(-1, err)
        return
    entry_point = req["entry_point"]
    if entry_point and not callable(namespace.get(entry_point)):
        record(-1, NameError(f"entry point {entry_point!r} is not defined as a function by the program"))
        return
    namespace[record_name] = record
    try:
        exec(rename_global(req["test_code"], RECORD_NAME, record_name), namespace)
        if req["call_check"]:
            namespace["check"](namespace[entry_point])
    except BaseException as err:
        record(-2, err)
        return
    record(-3, None)


def runner(req, caps, workdir, result_fd, out_fd, nonce):
    """Child side after fork: isolate, limit, run. Never returns."""
    try:
        os.setsid()
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        keep = sorted(fd for fd in (result_fd, PREFIX_FD) if fd is not None)
        for low, high in zip([3] + [fd + 1 for fd in keep], keep + [1 << 16]):
            os.closerange(low, high)
        os.chdir(workdir)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
        cpu = int(req["timeout"]) + 1
        limits = {resource.RLIMIT_CPU: (cpu, cpu + 1), resource.RLIMIT_AS: (req["memory_bytes"],) * 2,
                  resource.RLIMIT_FSIZE: (req["output_bytes"],) * 2, resource.RLIMIT_NPROC: (req["max_processes"],) * 2,
                  resource.RLIMIT_CORE: (0, 0), resource.RLIMIT_NOFILE: (256, 256)}
        if caps["drop_uid"]:
            drop_privileges(req["uid"])
        for which, value in limits.items():
            resource.setrlimit(which, value)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        if "random" in sys.modules:  # the one after-fork hook a raw clone skips
            sys.modules["random"].seed()
        record_name = "__sbx_%s__" % os.urandom(8).hex()
        run_program(req, make_recorder(result_fd, nonce), record_name)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException as err:
        try:
            os.write(2, b"sandbox runner setup failed: %s\n" % repr(err).encode())
        except BaseException:
            pass
        os._exit(120)
    os._exit(0)


def supervise(req, caps):
    """Run one check in a fresh runner; return the report dict."""
    started = time.monotonic()
    nonce = os.urandom(16).hex().encode()
    req["uid"] = UID_BASE + os.getpid()  # from the zygote's pid: one uid per zygote
    workdir = make_workdir(caps, "run", req["uid"])
    # the zygote keeps this fd and reads the output through it, whatever the program does to the path
    out_fd = os.open(os.path.join(workdir, ".output"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    if caps["drop_uid"]:
        os.fchown(out_fd, req["uid"], req["uid"])
    read_fd, write_fd = os.pipe()
    pid = spawn_runner(caps)
    if pid == 0:
        os.close(read_fd)
        runner(req, caps, workdir, write_fd, out_fd, nonce)
    os.close(write_fd)
    deadline = started + req["timeout"]
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
    for target in (lambda: os.kill(pid, signal.SIGKILL), lambda: os.killpg(pid, signal.SIGKILL)):
        try:
            target()
        except OSError:
            pass
    _, status = os.waitpid(pid, 0)
    os.close(read_fd)
    if caps["drop_uid"] and not caps["pidns"]:
        sweep_uid(req["uid"])
    output = os.pread(out_fd, req["output_keep"], 0)
    os.close(out_fd)
    remove_workdir(workdir, caps)
    records = []
    for line in bytes(buf).split(b"\n"):
        head, _, rest = line.partition(b" ")
        if head != nonce:
            continue  # forged or partial line
        index, _, text = rest.partition(b" ")
        records.append((int(index), text.decode("utf-8", "replace")))
    return {"records": records, "timed_out": timed_out,
            "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "output": output, "elapsed_s": time.monotonic() - started}


def remove_workdir(path, caps):
    """Remove the check's directory (two syscalls when the program left nothing behind); with the
    private /tmp, also anything else a runner managed to put there (root of a user namespace)."""
    try:
        os.unlink(os.path.join(path, ".output"))
        os.rmdir(path)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
    if caps["readonly_fs"]:
        for entry in os.scandir("/tmp"):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)


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


def write_message(fd, obj):
    """Write ``obj`` as one framed message (length + marshal)."""
    body = marshal.dumps(obj)
    data = len(body).to_bytes(4, "little") + body
    while data:
        data = data[os.write(fd, data):]


def main():
    reply_fd = os.dup(1)  # the caller's pipe; fd 1 itself is pointed at /dev/null
    devnull = os.open("/dev/null", os.O_WRONLY)
    os.dup2(devnull, 1)
    global PREFIX, PREFIX_FD
    caps = {"netns": False, "pidns": False, "readonly_fs": False, "userns": False, "drop_uid": False}
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
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    gc.collect()
    gc.freeze()  # forked runners then leave the zygote's objects alone: fewer copy-on-write faults
    write_message(reply_fd, {"caps": caps, "pid": os.getpid()})
    while True:
        req = read_message(0)
        if req is None:
            return
        try:
            report = supervise(req, caps)
        except BaseException as err:  # a bug here must not take the zygote down
            report = {"error": f"sandbox supervisor failed: {type(err).__name__}: {err}"}
        write_message(reply_fd, report)

if __name__ == "__main__":
    main()
