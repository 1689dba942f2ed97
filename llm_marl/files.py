"""Files written so that a crash or a concurrent writer never leaves a torn one."""
from __future__ import annotations

import os
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
