"""This process's C heap (glibc): ``keep_freed_host_memory`` keeps freed blocks for reuse, ``release_free_memory``
gives the free pages back to the system (``malloc_trim``). The fast mode calls the first once (a forward's activations
are reused by the next); the service's replicas, the demo and bulk workers call the second after each request or batch.

A process that serves one request or batch after another (the service's CPU replicas, the demo, bulk workers) frees
each one's images and maps when it is done, but glibc keeps freed heap memory for reuse, in one arena per thread
that allocated it, so the resident memory follows the largest request each thread has handled, not the working set.
Imports nothing else from sapiens2 (nor torch).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

__all__ = ["keep_freed_host_memory", "release_free_memory"]


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (glibc malloc.h)


def keep_freed_host_memory(mmap_threshold: int = 32 * 2**20, trim_threshold: int = 2**30) -> bool:
    """Tell glibc's malloc to serve blocks below ``mmap_threshold`` from the heap and to return freed heap memory to
    the OS only above ``trim_threshold``; returns True when applied (Linux with glibc), False elsewhere.

    Process-wide and permanent (as ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` in the environment would
    be): the activations of one forward are reused by the next instead of being unmapped and faulted in again, at
    the cost of the process keeping up to ``trim_threshold`` of freed memory. 32 MiB is glibc's largest allowed
    mmap threshold on 64-bit systems.
    """
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:  # not glibc (musl, macOS, Windows)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))


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
