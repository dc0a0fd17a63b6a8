"""Graceful shutdown of ``sapiens2 serve`` (slow: a Serve instance of its own): requests in flight when the
service is told to stop are answered, new ones get 503 + Retry-After and ``/readyz`` says draining."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_serve import call, photos, start_service
from test_serve_hostile import cli_server

pytestmark = pytest.mark.slow


def test_stopping_drains_the_requests_in_flight(tiny_checkpoints, tmp_path_factory, tmp_path):
    from sapiens2.serve.app import stop

    body = photos(tmp_path, 1)[0].read_bytes()
    # batches wait up to 6 s to fill: the four requests are still inside when stop() starts, which waits until the
    # gateway counts them (a busy 2-core machine may take over a second to admit them; an idle service stops at once)
    for url in start_service(tiny_checkpoints, tmp_path_factory, **{"--task": "seg", "--max-wait-ms": 6000}):
        assert call(url, "/v1/seg", body)[0] == 200
        with ThreadPoolExecutor(4) as pool:
            in_flight = [pool.submit(call, url, "/v1/seg", body) for _ in range(4)]
            wait_until_inside(url, 4)
            stopper = threading.Thread(target=stop, args=(60.0,))
            stopper.start()
            time.sleep(0.5)
            status, headers, answer = call(url, "/v1/seg", body)  # arrives while draining
            ready = call(url, "/readyz", token=None)
            stopper.join(timeout=120)
            answers = [future.result(timeout=120) for future in in_flight]
        assert not stopper.is_alive()
        assert [answer[0] for answer in answers] == [200] * 4
        retry_after = {key.lower(): value for key, value in headers.items()}.get("retry-after", "")
        assert status == 503 and "shutting down" in answer["error"] and retry_after.isdigit()
        assert ready[0] == 503 and ready[2]["status"] == "draining"


def wait_until_inside(url: str, count: int, timeout: float = 30.0) -> None:
    """Until the gateway's /metrics count ``count`` requests in flight."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, _, text = call(url, "/metrics")
        assert status == 200, text
        inside = re.search(r"^sapiens2_requests_in_flight ([0-9.]+)$", str(text), re.MULTILINE)
        if inside and float(inside.group(1)) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"the gateway never counted {count} requests in flight")


def test_sigterm_stops_a_busy_server_within_its_drain(tiny_checkpoints, tmp_path_factory, tmp_path):
    body = photos(tmp_path, 1)[0].read_bytes()
    drain = 1.0
    # batches wait 8 s to fill: the requests are still in flight when the drain ends
    flags = ("--drain", f"{drain:g}", "--max-wait-ms", "8000", "--max-batch", "8")
    with cli_server(tiny_checkpoints, tmp_path_factory.mktemp("ray"), *flags) as server:
        with ThreadPoolExecutor(3) as pool:
            for _ in range(3):
                pool.submit(call, server.url, "/v1/seg", body, token=None)  # cut off: their outcome is not checked
            time.sleep(1.5)
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=120) == 0
            took = time.monotonic() - started
    assert took < drain + 5.0, f"a busy server with --drain {drain:g} took {took:.1f} s to stop"


def test_sigterm_to_the_whole_process_group_stops_an_idle_server_at_once(tiny_checkpoints, tmp_path_factory):
    with cli_server(tiny_checkpoints, tmp_path_factory.mktemp("ray")) as server:
        started = time.monotonic()
        os.killpg(server.process.pid, signal.SIGTERM)  # systemd's default KillMode, timeout(1), kill -- -PGID
        assert server.process.wait(timeout=120) == 0
        took = time.monotonic() - started
        errors = server.stderr.read_text()
    assert took < 5.0, f"the server took {took:.1f} s to stop"
    assert "stopped with this process" in errors and "Failed to connect to GCS" not in errors
