"""Returning freed heap memory to the operating system after gathered (sharded) phases."""
from __future__ import annotations

import ctypes

_MALLOC_TRIM = None


def release_free_memory() -> None:
    """Give the heap memory that was freed back to the OS (glibc ``malloc_trim``; elsewhere nothing).

    Sharded training on a CPU frees whole gathered layers at every step, and glibc keeps such
    blocks in its heap; trimming after a step lowers the resident memory of the steps that follow.
    """
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)
