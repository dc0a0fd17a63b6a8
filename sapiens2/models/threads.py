"""CPU threads of the forward pass: how many, and how the idle ones wait (issue #25).

torch runs its CPU kernels on one OpenMP pool per process (libgomp in the pip wheels). Two settings decide how it
behaves when other processes share the cores:

- **How many threads**: ``set_threads(n)`` (``torch.set_num_threads``); torch's default is one per core this process
  may use. ``--threads`` on ``predict``, ``eval``, ``demo`` and ``serve``, ``Predictor(threads=...)``.
- **How idle threads wait** between parallel regions: OpenMP's default spins for a while, which is fastest on
  quiet cores, but when another process holds a core the spinning threads and the preempted one take turns and a
  tiny model's throughput fell to a quarter of one thread's (docs/benchmarks.md, "CPU threads"). With
  ``OMP_WAIT_POLICY=PASSIVE`` idle threads sleep and two threads stayed within 10 % of one. libgomp reads the
  variable once, when torch loads it, so ``import sapiens2`` sets it (unless it is set) when torch is not loaded
  yet; later it reaches only child processes (bulk workers, Ray actors). ``wait_policy()`` says which applies.
"""

from __future__ import annotations

import os

import torch

__all__ = ["WAIT_POLICY_ENV", "available_cores", "check_threads", "set_threads", "wait_policy"]

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


def available_cores() -> int:
    """The logical CPUs this process may run on (its affinity mask; all of them where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check_threads(threads: int | None, name: str = "threads") -> int | None:
    """``threads`` if it is None or an integer >= 1; otherwise a ValueError naming ``name`` (a flag or argument)."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"{name} must be an integer >= 1, got {threads!r}")
    return threads


def set_threads(threads: int | None) -> int:
    """Run torch's CPU kernels on ``threads`` threads in this process (None: leave the count as it is).

    The count is process-wide (``torch.set_num_threads``): the last call wins. Returns the count in use.
    """
    check_threads(threads)
    if threads is not None and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def wait_policy() -> str:
    """How idle OpenMP threads wait in processes started from here: ``PASSIVE`` (sleep), ``ACTIVE`` (spin), or
    ``default`` (spin a while, then sleep) when ``OMP_WAIT_POLICY`` is not set."""
    return os.environ.get(WAIT_POLICY_ENV, "").strip().upper() or "default"
