"""The Ray engine: a Ray Data pipeline on a local instance or an existing cluster, driven by ``run_bulk``.

    shards (driver) -> read records + ledger check (CPU tasks) -> read bytes, hash, decode (CPU tasks, batches)
        -> job.process (map_batches on an actor pool: one job per actor, set up once; one GPU each on GPU clusters)
        -> outcomes streamed back to the driver in input order -> sink + ledger (the driver's committer)

Rows carry their payload pickled (records, decoded images, outcomes), so any job's data crosses Ray unchanged. The
ledger and the sink's files live in the output folder, which every node must see (a shared file system) for the
files and Parquet sinks' arrays; the driver writes parts, tar shards and commits.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

from ..data.collections import Collection, Shard
from .job import BulkJob, prepare, process_prepared
from .ledger import Ledger

__all__ = ["run_ray", "start_local_ray"]

CPU_TASK = 0.25  # CPUs reserved per read/decode task, so the actors never starve them on a small instance


class _ReadShard:
    """flat_map: one shard description -> one row per record, with the content hash the ledger has as done."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def __call__(self, row: dict[str, Any]) -> Iterator[dict[str, Any]]:
        shard: Shard = pickle.loads(row["shard"])
        done = self.ledger.skip_hashes(shard.id)
        for index, record in enumerate(shard):
            yield {"shard": shard.id, "index": index, "payload": pickle.dumps((record, done(record)))}


def _decode(batch: dict[str, Any], job: bytes) -> dict[str, Any]:
    """map_batches on CPU tasks: read bytes, hash, skip or decode (``job.prepare``)."""
    bulk_job: BulkJob = pickle.loads(job)
    payloads = []
    for shard, blob in zip(batch["shard"], batch["payload"], strict=True):
        record, done = pickle.loads(blob)
        timings: dict[str, float] = {}
        prepared = prepare(bulk_job, record, done, str(shard), "", timings)
        payloads.append(pickle.dumps((prepared, timings)))
    return {"shard": batch["shard"], "index": batch["index"], "payload": payloads}


class _Process:
    """map_batches on an actor: the job set up once per actor, ``process`` per batch."""

    def __init__(self, job: bytes, gpu: bool, threads: int) -> None:
        import os

        try:
            import ray
        except ImportError:  # an actor runs where Ray is installed; kept for the lazy-import rule
            raise RuntimeError("Ray workers need ray installed") from None

        self.job: BulkJob = pickle.loads(job)
        if not gpu and threads:
            import torch

            torch.set_num_threads(threads)
        device = "cuda" if gpu else "cpu"
        context = ray.get_runtime_context()
        self.label = f"ray:{context.get_node_id()[:6]}/{os.getpid()}/{device}"
        self.job.setup(device)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        unpacked = [pickle.loads(blob) for blob in batch["payload"]]
        timings: dict[str, float] = {}
        outcomes = process_prepared(self.job, [prepared for prepared, _ in unpacked], self.label, timings)
        share = timings.get("process", 0.0) / max(sum(o.output is not None for o in outcomes), 1)
        payloads = []
        for outcome, (_, item_timings) in zip(outcomes, unpacked, strict=True):
            if outcome.output is not None:
                item_timings["process"] = share
            payloads.append(pickle.dumps((outcome, item_timings)))
        return {"shard": batch["shard"], "index": batch["index"], "payload": payloads}


def _actors(ray: Any, devices: list[str]) -> tuple[int, bool]:
    """(actor count, one GPU each): ``all`` -> every GPU of the cluster (else one CPU actor)."""
    if devices == ["all"]:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        return (gpus, True) if gpus else (1, False)
    return len(devices), any(label.startswith("cuda") for label in devices)


def run_ray(
    job: BulkJob,
    collection: Collection,
    ledger: Ledger,
    committer: Any,
    devices: list[str],
    batch_size: int,
    address: str | None = None,
    threads: int | None = None,
) -> None:
    """Run ``job`` over ``collection`` as a Ray Data pipeline (see the module docstring).

    Uses the Ray instance this process is connected to, else connects to ``address`` (an existing cluster), else
    starts a local instance (no dashboard) and shuts it down at the end.
    """
    try:
        import ray
    except ImportError:
        raise ValueError("engine 'ray' needs Ray: pip install 'sapiens2[ray]'") from None
    started, watchdog = False, None
    if not ray.is_initialized():
        marker = f"{os.getpid()}-{uuid.uuid4().hex}" if address is None else None
        watchdog = _start_watchdog(marker) if marker is not None else None  # before any Ray process starts
        try:
            with _marked_environment(marker):  # every process of a local instance inherits the marker
                options = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
                if address is None:
                    start_local_ray(**options)
                else:
                    ray.init(address=address, **options)
        except Exception as error:  # Ray's ConnectionError, AuthenticationError, RuntimeError ...
            _stop_watchdog(watchdog)
            raise RuntimeError(connect_problem(address, error)) from None
        started = address is None
    try:
        _pipeline(ray, job, collection, ledger, committer, devices, batch_size, threads)
    finally:
        if started:
            ray.shutdown()
        _stop_watchdog(watchdog)  # it ends what shutdown left (nothing, normally)


def start_local_ray(**options: Any) -> None:
    """``ray.init(**options)`` of a new local instance that listens on loopback only: its GCS, raylet, agents,
    metrics and worker servers all take 127.0.0.1, so nothing of it is reachable from the network.

    Ray (2.x) binds its servers to the node's address, every interface for a routable one, and turns
    ``_node_ip_address="127.0.0.1"`` back into the routable address on Linux. Its single-machine mode (the default
    on Windows and macOS, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``) takes 127.0.0.1 instead; that mode is read from
    ``ray_constants.ENABLE_RAY_CLUSTER`` when the node starts, so it is set there for this call only. No other
    machine can join such an instance: a cluster is ``ray start`` and an address (``tests/test_bulk_ray.py`` checks
    the listening sockets).
    """
    try:
        import ray
    except ImportError:
        raise ValueError("a local Ray instance needs Ray: pip install 'sapiens2[ray]'") from None
    try:
        from ray._private import ray_constants
    except ImportError:  # a Ray that moved its private constants: plain ray.init (the socket tests will say so)
        ray_constants = None
    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        ray.init(**options)
        return
    cluster = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(**options)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = cluster


MARKER = "SAPIENS2_RAY_INSTANCE"
"""Environment variable that marks the processes of a local Ray instance started by ``run_ray``."""

_WATCHDOG = """
import os, select, signal, sys, time
marker, driver = f"{sys.argv[1]}={sys.argv[2]}".encode(), int(sys.argv[3])

def processes():
    # live pid -> (parent pid, start time, marked): a start time tells a reused pid from the one seen before
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (os.getpid(), driver):
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z":  # already dead, waiting for its parent to reap it
                continue
            with open(f"/proc/{name}/environ", "rb") as handle:
                marked = marker in handle.read().split(b"\\0")
        except OSError:
            continue
        found[int(name)] = (int(fields[1]), fields[19], marked)
    return found

def members(found):
    # the marked processes and their descendants: Ray's agents run with an environment of their own, so only
    # their parent (the raylet) carries the marker, and they lose that link when it dies
    chosen = {pid for pid, (_, _, marked) in found.items() if marked}
    grew = True
    while grew:
        more = {pid for pid, (parent, _, _) in found.items() if parent in chosen} - chosen
        chosen |= more
        grew = bool(more)
    return {(pid, found[pid][1]) for pid in chosen}

seen = set()
while True:  # until end of file on stdin: the driver closed the pipe, or died (kill -9 included)
    seen |= members(processes())
    if select.select([sys.stdin], [], [], 1.0)[0] and not os.read(sys.stdin.fileno(), 4096):
        break

def sweep():
    found, killed = processes(), 0
    for pid, started in seen | members(found):
        if pid in found and found[pid][1] == started:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed

# A process that is being killed may still start another: sweep until three sweeps in a row, half a second
# apart, find nothing (at most 30 s).
quiet, deadline = 0, time.monotonic() + 30
while quiet < 3 and time.monotonic() < deadline:
    quiet = 0 if sweep() else quiet + 1
    time.sleep(0.5)
"""


def _stop_watchdog(watchdog: subprocess.Popen | None) -> None:
    if watchdog is not None:
        watchdog.stdin.close()
        watchdog.wait(timeout=45)  # its sweeps end within 30 s


@contextlib.contextmanager
def _marked_environment(marker: str | None) -> Iterator[None]:
    if marker is None:
        yield
        return
    previous = os.environ.get(MARKER)
    os.environ[MARKER] = marker
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(MARKER, None)
        else:
            os.environ[MARKER] = previous


def _start_watchdog(marker: str) -> subprocess.Popen | None:
    """A small process that, once this driver is gone (even by kill -9), kills every process of the local Ray
    instance it started. Ray's own reaper ends the driver's process group, but Ray's agents (DashboardAgent,
    RuntimeEnvAgent) run outside it and outlive a killed driver. Linux only (it reads ``/proc``)."""
    if not os.path.isdir("/proc/self"):
        return None
    environment = {k: v for k, v in os.environ.items() if k != MARKER}
    command = [sys.executable, "-c", _WATCHDOG, MARKER, marker, str(os.getpid())]
    return subprocess.Popen(command, stdin=subprocess.PIPE, env=environment, start_new_session=True)


def connect_problem(address: str | None, error: BaseException) -> str:
    """One line for a failed ``ray.init``: Ray's reason and, for a cluster, what token authentication needs."""
    reason = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    if address is None:
        return f"cannot start a local Ray instance ({reason})"
    return (
        f"cannot connect to the Ray cluster at {address!r} ({reason[:300]}); if the cluster uses token "
        "authentication (`ray start` turns it on with RAY_AUTH_MODE=token or when ~/.ray/auth_token exists), "
        "give this process the cluster's token: RAY_AUTH_TOKEN=..., RAY_AUTH_TOKEN_PATH=... or ~/.ray/auth_token "
        "(`ray get-auth-token` on the head node prints it), or start the cluster with RAY_AUTH_MODE=disabled; "
        "see docs/bulk.md"
    )


def _pipeline(ray, job, collection, ledger, committer, devices, batch_size, threads) -> None:
    with warnings.catch_warnings():  # Ray Data's first DataContext sets its own deprecated fields (Ray 2.60)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\.data\.context")
        context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # outcomes reach the committer in input order
    context.enable_progress_bars = False  # the job has one bar: the committer's
    shards = [{"shard": pickle.dumps(shard)} for shard in collection.shards()]
    if not shards:
        return
    count, gpu = _actors(ray, devices)
    job_bytes = pickle.dumps(job)
    dataset = (
        ray.data.from_items(shards, override_num_blocks=len(shards))
        .flat_map(_ReadShard(ledger), num_cpus=CPU_TASK)
        .map_batches(_decode, fn_args=(job_bytes,), batch_size=batch_size, num_cpus=CPU_TASK)
        .map_batches(_Process, fn_constructor_args=(job_bytes, gpu, threads or 1), batch_size=batch_size,
                     compute=ray.data.ActorPoolStrategy(size=count), num_gpus=1 if gpu else 0,
                     num_cpus=0 if gpu else CPU_TASK * 2)
    )  # fmt: skip
    current: str | None = None
    rows = 0
    for row in dataset.iter_rows():
        shard = str(row["shard"])
        if shard != current:
            if current is not None:
                committer.seal(current, rows)
            current, rows = shard, 0
        outcome, timings = pickle.loads(row["payload"])
        committer.add(shard, rows, [outcome], timings, outcome.device or "ray")
        rows += 1
    if current is not None:
        committer.seal(current, rows)
