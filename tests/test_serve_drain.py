"""Graceful shutdown of ``sapiens2 serve`` (slow: a Serve instance of its own): requests in flight when the
service is told to stop are answered, new ones get 503 + Retry-After and ``/readyz`` says draining."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_serve import call, photos, start_service

pytestmark = pytest.mark.slow


def test_stopping_drains_the_requests_in_flight(tiny_checkpoints, tmp_path_factory, tmp_path):
    from sapiens2.serve.app import stop

    body = photos(tmp_path, 1)[0].read_bytes()
    # batches wait up to 3 s to fill: requests are reliably in flight when stop() starts
    for url in start_service(tiny_checkpoints, tmp_path_factory, **{"--task": "seg", "--max-wait-ms": 3000}):
        assert call(url, "/v1/seg", body)[0] == 200
        with ThreadPoolExecutor(4) as pool:
            in_flight = [pool.submit(call, url, "/v1/seg", body) for _ in range(4)]
            time.sleep(1.0)
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
