"""The local engine: one worker process per device (GPU, or CPU worker) on this host, fed batches from one queue.

The parent streams the shards, asks the ledger what is done, cuts batches and hands each to the least busy worker
(at most two in flight each, so a slow device takes fewer); workers load the job once (``job.setup``) and send back
outcomes, which the parent gives to the committer (sink + ledger, shards committed in input order). A worker that
dies has its batches handed to the others; workers exit when the parent dies. One device runs in this process.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import wait
from typing import Any

from ..data.collections import Shard
from ..messages import report_warning
from .job import BulkJob, prepare, process_prepared, run_batch
from .ledger import Ledger

__all__ = ["run_local", "torch_device"]

IN_FLIGHT = 2  # batches per worker: one running, one waiting, so the device never idles on the parent
READ_AHEAD = 2  # batches read and decoded ahead of the device when it runs in this process


def torch_device(label: str) -> str:
    """The torch device of a worker label: ``cpu:1`` (the second CPU worker) -> ``cpu``; ``cuda:1`` unchanged."""
    return "cpu" if label.startswith("cpu") else label


def _set_threads(label: str, threads: int) -> None:
    if label.startswith("cpu") and threads > 0:
        import torch

        torch.set_num_threads(threads)


def _tasks(shards: Iterator[Shard], ledger: Ledger, batch_size: int) -> Iterator[tuple]:
    """("batch", shard id, index, [(record, done hash)]) per batch, then ("seal", shard id, number of batches)."""
    for shard in shards:
        done = ledger.skip_hashes(shard.id)
        batch: list = []
        count = 0
        for record in shard:
            batch.append((record, done(record)))
            if len(batch) == batch_size:
                yield ("batch", shard.id, count, batch)
                batch, count = [], count + 1
        if batch:
            yield ("batch", shard.id, count, batch)
            count += 1
        yield ("seal", shard.id, count)


def _worker(job: BulkJob, label: str, threads: int, tasks: Any, connection: Any, parent: int) -> None:
    """A worker process: set up the job on its device, then process batches until told to stop.

    When the parent is gone (killed, or stopped by Ctrl-C, which reaches the whole process group) the worker ends
    quietly: the parent reports the interruption once, and a rerun resumes."""
    try:
        _serve(job, label, threads, tasks, connection, parent)
    except (BrokenPipeError, ConnectionResetError, EOFError, KeyboardInterrupt):
        pass  # the parent is gone or stopping: nothing to send results to


def _serve(job: BulkJob, label: str, threads: int, tasks: Any, connection: Any, parent: int) -> None:
    _set_threads(label, threads)
    try:
        job.setup(torch_device(label))
    except Exception as error:  # reported by the parent as one line, the job stops
        connection.send(("fatal", f"{label}: setup failed ({type(error).__name__}: {error})"))
        return
    connection.send(("ready", None))
    while True:
        try:
            task = tasks.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the parent was killed: stop instead of writing for nobody
                return
            continue
        if task is None:
            break
        task_id, shard, batch = task
        timings: dict[str, float] = {}
        outcomes = run_batch(job, batch, shard, label, timings)
        connection.send(("result", (task_id, outcomes, timings)))
    job.close()


def _inline(
    job: BulkJob, label: str, threads: int, tasks: Iterator[tuple], committer: Any, prefetch: bool = True
) -> None:
    _set_threads(label, threads)
    try:
        job.setup(torch_device(label))
    except Exception as error:  # same message as from a worker process
        raise RuntimeError(f"{label}: setup failed ({type(error).__name__}: {error})") from error
    try:
        if not prefetch:
            for task in tasks:
                if task[0] == "seal":
                    committer.seal(task[1], task[2])
                    continue
                _, shard, index, batch = task
                timings: dict[str, float] = {}
                committer.add(shard, index, run_batch(job, batch, shard, label, timings), timings, label)
            return
        with ThreadPoolExecutor(1, thread_name_prefix="bulk-reader") as reader:
            for task in _read_ahead(job, label, tasks, reader):
                if task[0] == "seal":
                    committer.seal(task[1], task[2])
                    continue
                _, shard, index, prepared, timings = task
                committer.add(shard, index, process_prepared(job, prepared, label, timings), timings, label)
    finally:
        job.close()


def _read_ahead(job: BulkJob, label: str, tasks: Iterator[tuple], reader: ThreadPoolExecutor) -> Iterator[tuple]:
    """The tasks with each batch read and decoded on the reader thread, ``READ_AHEAD`` batches ahead of the
    device (decoders release the GIL); yields ("batch", shard, index, prepared, timings) and the seals in order."""
    ahead: deque = deque()

    def read(batch: list, shard: str, timings: dict[str, float]) -> list:
        return [prepare(job, record, done, shard, label, timings) for record, done in batch]

    def resolved(task: tuple) -> tuple:
        if task[0] == "seal":
            return task
        _, shard, index, future, timings = task
        return ("batch", shard, index, future.result(), timings)

    for task in tasks:
        if task[0] == "batch":
            timings: dict[str, float] = {}
            task = ("batch", task[1], task[2], reader.submit(read, task[3], task[1], timings), timings)
        ahead.append(task)
        while sum(t[0] == "batch" for t in ahead) > READ_AHEAD:
            yield resolved(ahead.popleft())
    while ahead:
        yield resolved(ahead.popleft())


def run_local(
    job: BulkJob,
    shards: Iterator[Shard],
    ledger: Ledger,
    committer: Any,
    devices: list[str],
    batch_size: int,
    threads: int | None = None,
    prefetch: bool = True,
) -> None:
    """Run ``job`` over ``shards`` on ``devices`` (worker labels: ``cpu:0``, ``cpu:1``, ``cuda:0`` ...).

    One device runs in this process (its torch threads left as they are unless ``threads`` is given); more run one
    spawned process each (CPU workers get ``threads``, default ``cores // CPU workers``, torch threads).
    Outcomes go to ``committer.add(shard, batch index, outcomes, timings, device)``; the end of a
    shard to ``committer.seal(shard, batches)``. With ``prefetch`` a single in-process device gets its batches
    read and decoded on a reader thread, ahead of it (the pipelined reader).

    Raises:
        RuntimeError: a worker's ``setup`` failed, or every worker died.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cpu_workers = sum(label.startswith("cpu") for label in devices)
    tasks = _tasks(shards, ledger, batch_size)
    if len(devices) == 1:
        _inline(job, devices[0], threads or 0, tasks, committer, prefetch)
        return
    threads = threads or max(1, cores // max(cpu_workers, 1))
    context = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA or OpenMP state
    workers = []
    for label in devices:
        receive, send = context.Pipe(duplex=False)
        task_queue = context.Queue()
        process = context.Process(
            target=_worker, args=(job, label, threads, task_queue, send, os.getpid()), daemon=True, name=label
        )
        process.start()
        send.close()
        workers.append({"label": label, "process": process, "queue": task_queue, "pipe": receive, "held": {}})
    try:
        _drive(workers, tasks, committer)
    finally:
        for worker in workers:
            if worker["process"].is_alive():
                worker["queue"].put(None)
        for worker in workers:
            worker["process"].join(timeout=30)
            if worker["process"].is_alive():
                worker["process"].kill()


def _drive(workers: list[dict], tasks: Iterator[tuple], committer: Any) -> None:
    retry: deque = deque()
    next_id = 0
    exhausted = False
    alive = list(workers)
    while True:
        while True:  # one batch at a time to the least busy worker, so the first batches spread over all of them
            worker = min(alive, key=lambda w: len(w["held"]))
            if len(worker["held"]) >= IN_FLIGHT:
                break
            if retry:
                task = retry.popleft()
            elif not exhausted:
                try:
                    event = next(tasks)
                except StopIteration:
                    exhausted = True
                    continue
                if event[0] == "seal":
                    committer.seal(event[1], event[2])
                    continue
                task = (next_id, event[1], event[2], event[3])
                next_id += 1
            else:
                break
            worker["held"][task[0]] = task
            worker["queue"].put((task[0], task[1], task[3]))
        if exhausted and not retry and not any(w["held"] for w in alive):
            return
        by_pipe = {id(w["pipe"]): w for w in alive}
        by_sentinel = {w["process"].sentinel: w for w in alive}
        for ready in wait([w["pipe"] for w in alive] + list(by_sentinel), timeout=5.0):
            worker = by_pipe.get(id(ready)) or by_sentinel.get(ready)
            if worker is None or worker not in alive:
                continue
            try:
                while worker["pipe"].poll():
                    kind, payload = worker["pipe"].recv()
                    if kind == "fatal":
                        raise RuntimeError(payload)
                    if kind == "result":
                        task_id, outcomes, timings = payload
                        _, shard, index, _ = worker["held"].pop(task_id)
                        committer.add(shard, index, outcomes, timings, worker["label"])
            except (EOFError, OSError):
                worker["ended"] = True  # its end of the pipe is closed: it is gone (or going)
            if not worker["process"].is_alive() and (worker.get("ended") or not worker["pipe"].poll()):
                alive.remove(worker)
                lost = sorted(worker["held"].values())
                retry.extend(lost)
                worker["held"].clear()
                code = worker["process"].exitcode
                report_warning(f"worker {worker['label']} stopped (exit code {code}); {len(lost)} batches go to the "
                               "other workers")  # fmt: skip
                if not alive:
                    raise RuntimeError("every worker stopped; rerun the same command to resume")
