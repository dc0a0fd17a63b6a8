"""This process's C heap: ``release_free_memory`` gives its free pages back to the system (glibc's ``malloc_trim``).

A process that serves one request or batch after another (the service's CPU replicas, the demo, bulk workers) frees
each one's images and maps when it is done, but glibc keeps freed heap memory for reuse, in one arena per thread
that allocated it, so the resident memory follows the largest request each thread has handled, not the working set.
Imports nothing else from sapiens2 (nor torch).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

__all__ = ["release_free_memory"]


def release_free_memory() -> None:
    """Return the free pages of every arena of the C heap to the system (glibc's ``malloc_trim(0)``; nothing
    elsewhere), so that a long-running process's resident memory is its working set, not the high-water mark of its
    largest request or batch: what a container's memory limit sees. Memory still referenced, a leak included, stays.
    It walks the heap's free chunks: call it once per request or batch, not per image."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


_LIBC = _glibc()
