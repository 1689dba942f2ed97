"""Files written so that a crash or a concurrent writer never leaves a torn one."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def current_umask() -> int:
    """The process's file-creation mask (read from ``/proc`` where it can be, so no other thread sees it change)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_file_atomically(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp)`` on a uniquely named temp file beside ``path``, then rename it to ``path`` in one step.

    The file gets the permissions a plain ``open(path, "w")`` would give it: those of the file it replaces, else
    ``0o666`` less the umask (a temp file alone would be private to its owner, ``0o600``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~current_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, mode)
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` via a uniquely named temp file beside it, then one rename."""
    return write_file_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def replace_directory(source: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Rename the finished directory ``source`` to ``target``, swapping out an existing ``target`` first.

    ``target`` is either the old directory or the new one at every moment but the one between two renames,
    when it is briefly absent (a reader then finds the previous entry beside it, e.g. the last checkpoint).
    """
    source, target = Path(source), Path(target)
    if target.exists():
        stale = target.with_name(f".stale-{target.name}")
        os.rename(target, stale)
        shutil.rmtree(stale, ignore_errors=True)
    os.rename(source, target)
    return target
