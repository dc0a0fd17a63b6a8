"""A real Ray cluster (``ray start --head``, Ray's CLI) with token authentication, driven by bulk jobs in
subprocesses. Slow, and in its own module: ``ray stop --force`` in the teardown ends every Ray process of this
user, so no test here may hold a Ray instance in-process (its driver would exit with the cluster)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import require_module
from test_bulk import make_images

pytestmark = pytest.mark.slow


def _ray_cli() -> str:
    return shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray") or "ray"


def test_a_token_cluster_refuses_a_wrong_token_naming_authentication_and_runs_with_its_token(tmp_path):
    """``ray start --head`` with token authentication (Ray's own CLI, a real cluster), then bulk drivers."""
    require_module("ray")
    ray_cli = _ray_cli()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tests = str(Path(__file__).parent)
    env = os.environ | {"HOME": str(tmp_path / "home"), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex,
                        "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    folder = make_images(tmp_path / "in", count=3, corrupt=False)
    driver = ("import sys; from test_bulk import ColourJob; from sapiens2.bulk import BulkOptions, run_bulk; "
              "report = run_bulk(ColourJob(), BulkOptions(inputs=[sys.argv[1]], output=sys.argv[2], engine='ray', "
              "ray_address=sys.argv[3], progress=False)); print(report.lines()[0])")  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:
        subprocess.run([ray_cli, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                        "--disable-usage-stats"], env=env, check=True, capture_output=True, timeout=180)  # fmt: skip
        wrong = env | {"RAY_AUTH_TOKEN": uuid.uuid4().hex}
        result = subprocess.run([sys.executable, "-c", driver, str(folder), str(tmp_path / "wrong"), address],
                                env=wrong, capture_output=True, text=True, timeout=240)  # fmt: skip
        assert result.returncode != 0
        last = result.stderr.strip().splitlines()[-1]
        assert "cannot connect to the Ray cluster" in last and "token authentication" in last, result.stderr[-3000:]
        result = subprocess.run([sys.executable, "-c", driver, str(folder), str(tmp_path / "right"), address],
                                env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert result.returncode == 0 and "3 done, 0 failed" in result.stdout, result.stderr[-3000:]
        assert "deprecated" not in result.stderr.lower()
    finally:
        subprocess.run([ray_cli, "stop", "--force"], env=env, capture_output=True, timeout=120)


def _session(sid: int) -> list[str]:
    """Processes of the session ``sid`` still alive, as 'pid command' lines."""
    listing = subprocess.run(["ps", "-eo", "pid=,sid=,stat=,args="], capture_output=True, text=True).stdout
    alive = []
    for line in listing.splitlines():
        pid, session, state, *args = line.split(maxsplit=3)
        if int(session) == sid and not state.startswith("Z"):
            alive.append(f"{pid} {' '.join(args)}")
    return alive


def test_no_ray_process_lingers_after_the_driver_is_killed(tmp_path):
    """kill -9 of a bulk driver that started its own Ray instance: Ray's processes end with it."""
    require_module("ray")
    folder = make_images(tmp_path / "in", count=6, corrupt=False)
    tests = str(Path(__file__).parent)
    env = os.environ | {"HOME": str(tmp_path / "home"), "PYTHONPATH": os.pathsep.join([tests, os.environ.get(
        "PYTHONPATH", "")])}  # fmt: skip
    driver = ("import sys; from test_bulk import ColourJob; from sapiens2.bulk import BulkOptions, run_bulk; "
              "run_bulk(ColourJob(delay=5.0), BulkOptions(inputs=[sys.argv[1]], output=sys.argv[2], engine='ray', "
              "batch_size=1, progress=False))")  # fmt: skip
    argv = [sys.executable, "-c", driver, str(folder), str(tmp_path / "out")]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    process = subprocess.Popen(argv, env=env, start_new_session=True, **quiet)
    try:
        deadline = time.monotonic() + 180
        agents = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")  # up first, with the raylet
        while not any("ray::" in line and not line.endswith(agents) for line in _session(process.pid)):
            assert process.poll() is None and time.monotonic() < deadline, "the job ended or never started Ray"
            time.sleep(0.5)  # until the pipeline's workers are up
        # The watchdog notes the instance's processes once a second: a driver killed within that second of its
        # agents starting leaves them to Ray's own ~60 s timeout (docs/bulk.md); a user's kill comes later.
        time.sleep(2.0)
        os.kill(process.pid, signal.SIGKILL)  # the driver only, as a user's kill -9 would
        process.wait()
        deadline = time.monotonic() + 20  # Ray's agents, left alone, outlive a killed driver by ~60 s
        while _session(process.pid) and time.monotonic() < deadline:
            time.sleep(1)
        assert _session(process.pid) == []
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        subprocess.run([_ray_cli(), "stop", "--force"], env=env, capture_output=True, timeout=120)
