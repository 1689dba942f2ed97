"""Files written so that a crash or a concurrent writer never leaves a torn one."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_file_atomically(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp)`` on a uniquely named temp file beside ``path``, then rename it to ``path`` in one step."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
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
