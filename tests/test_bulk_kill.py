"""kill -9 a bulk ``sapiens2 predict`` mid-way (local workers, or the Ray driver), rerun the same command: every
output present once, none corrupt, and nothing the ledger had as done recomputed (its files keep their mtimes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest
from conftest import DATA, require_module

from sapiens2.bulk import Ledger

pytestmark = pytest.mark.slow


def many_photos(folder, count):
    folder.mkdir(parents=True)
    image = cv2.imread(str(DATA / "astronaut.png"))
    for i in range(count):
        cv2.imwrite(str(folder / f"p{i:02d}.png"), np.roll(image, 7 * i, axis=1)[: 200 + i])
    (folder / "zz_broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 30)
    return folder


def command(tiny_checkpoints, inputs, out, *extra):
    return [sys.executable, "-m", "sapiens2", "predict", "--task", "seg", str(inputs), "-o", str(out),
            "--input-size", "64", "48", f"--model=seg={tiny_checkpoints['seg']}", "--batch-size", "1",
            "--shard-size", "3", *extra]  # fmt: skip


def done_entries(out):
    return {k: e for k, e in Ledger(out).entries().items() if e.status == "done"} if (out / "_bulk").is_dir() else {}


def kill_when_done(argv, out, at_least, timeout=240, stderr=None):
    """Start the job, SIGKILL it once the ledger holds ``at_least`` done items; returns the done entries the ledger
    holds once the job and its workers are dead (and what they wrote to stderr into the list ``stderr``, when
    given). Read after the kill: the job may commit more items between the poll that saw ``at_least`` and the
    signal (3 more, one shard, on a loaded machine)."""
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                               env=env)  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if len(done_entries(out)) >= at_least:
                os.kill(process.pid, signal.SIGKILL)
                break
            assert process.poll() is None, f"the job ended before it could be killed: {process.stderr.read()}"
            time.sleep(0.02)
        else:
            pytest.fail("the job did not get far enough in time")
        process.wait()
        time.sleep(3)  # workers notice their parent is gone within a second and stop
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # anything still alive in the job's session
        except ProcessLookupError:
            pass
    if stderr is not None:
        stderr.append(process.stderr.read().decode(errors="replace"))
    return done_entries(out)


def temporaries(out):
    """Files under ``out`` that are temporaries of atomic writes (``_bulk/tmp/*``, ``.<name>.<hex>.tmp.<ext>``)."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and ".tmp" in p.name)


def rerun(argv):
    result = subprocess.run(argv, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"},
                            timeout=300)  # fmt: skip
    assert result.returncode == 1, result.stderr  # the broken file, recorded again
    return result


def test_local_workers_killed_then_rerun_finish_exactly_once(tiny_checkpoints, tmp_path):
    inputs = many_photos(tmp_path / "in", 18)
    out = tmp_path / "out"
    argv = command(tiny_checkpoints, inputs, out, "--devices", "cpu:2", "--threads", "1")
    stderr: list[str] = []
    done = kill_when_done(argv, out, at_least=4, stderr=stderr)
    assert len(done) < 18
    assert "Traceback" not in stderr[0] and "BrokenPipeError" not in stderr[0]  # the orphaned workers end quietly
    stamps = {key: (out / key.replace(".png", "_seg.png")).stat().st_mtime_ns for key in done}
    result = rerun(argv)
    assert f"{len(Ledger(out).entries()) - 1 - len(done)} done, 1 failed, {len(done)} skipped" in result.stdout
    for key, stamp in stamps.items():  # completed before the kill: not recomputed
        assert (out / key.replace(".png", "_seg.png")).stat().st_mtime_ns == stamp
    for i in range(18):
        labels = cv2.imread(str(out / f"p{i:02d}_seg.png"), cv2.IMREAD_UNCHANGED)
        assert labels is not None and labels.shape == (200 + i, 512)
    visible = [p.name for p in out.iterdir() if not p.name.startswith(".")]
    expected = [f"p{i:02d}_seg{suffix}" for i in range(18) for suffix in (".png", "_overlay.jpg")]
    assert sorted(visible) == sorted(["_bulk", *expected])
    entries = Ledger(out).entries()
    assert sum(e.status == "done" for e in entries.values()) == 18 and entries["zz_broken.png"].status == "failed"


def parquet_keys(out):
    pq = require_module("pyarrow.parquet")
    keys = []
    for part in sorted((out / "parts").glob("*.parquet")):
        keys += pq.read_table(part).column("key").to_pylist()  # every part readable: none corrupt
    return keys


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_parquet_job_killed_then_rerun_has_every_row_once(tiny_checkpoints, tmp_path, engine):
    if engine == "ray":
        require_module("ray")
    inputs = many_photos(tmp_path / "in", 15)
    out = tmp_path / "out"
    devices = ["--devices", "cpu:2", "--threads", "1"] if engine == "local" else ["--devices", "cpu:1"]
    argv = command(tiny_checkpoints, inputs, out, "--sink", "parquet", "--engine", engine, *devices)
    done = kill_when_done(argv, out, at_least=3)
    # the parts the ledger has committed (a part written just before the kill, without its commit, is rewritten)
    committed = {out / entry.part for entry in Ledger(out).entries().values() if entry.part}
    parts = {p: p.stat().st_mtime_ns for p in (out / "parts").glob("*.parquet") if p in committed}
    assert len(done) < 15 and parts
    result = rerun(argv)
    assert f"{len(done)} skipped" in result.stdout
    keys = parquet_keys(out)
    assert sorted(keys) == [f"p{i:02d}.png" for i in range(15)]  # each once
    assert temporaries(out) == []  # what the killed run left mid-write is gone, and the rerun left none
    assert {p: p.stat().st_mtime_ns for p in parts} == parts  # committed parts untouched by the rerun
    for key in done:
        assert Ledger(out).entries()[key].part in {f"parts/{p.name}" for p in parts}


def test_one_worker_killed_its_batches_go_to_the_other(tiny_checkpoints, tmp_path):
    inputs = many_photos(tmp_path / "in", 14)
    out = tmp_path / "out"
    argv = command(tiny_checkpoints, inputs, out, "--devices", "cpu:2", "--threads", "1")
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=os.environ | {"OMP_NUM_THREADS": "1"}, start_new_session=True)  # fmt: skip
    try:
        victim = None
        deadline = time.monotonic() + 240
        while victim is None and time.monotonic() < deadline:
            done = Ledger(out).entries() if (out / "_bulk" / "ledger").is_dir() else {}
            listing = ["ps", "-ww", "-o", "pid=,args=", "--ppid", str(process.pid)]
            children = subprocess.run(listing, capture_output=True, text=True).stdout.splitlines()
            workers = [int(line.split()[0]) for line in children if "spawn_main" in line]
            if process.poll() is not None:
                break
            if len(done) >= 2 and len(workers) == 2:
                victim = workers[0]
                os.kill(victim, signal.SIGKILL)
            time.sleep(0.02)
        assert victim is not None, "the job ended before a worker could be killed"
        stdout, stderr = process.communicate(timeout=300)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert process.returncode == 1, stderr  # the broken file only
    assert "stopped (exit code -9)" in stderr and "14 done, 1 failed" in stdout
    assert all(cv2.imread(str(out / f"p{i:02d}_seg.png")) is not None for i in range(14))
