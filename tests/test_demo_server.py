"""The demo as a server that runs for days: what it keeps between requests is bounded (results in memory by count and
bytes, request files on disk), its temporary folder goes when it stops, a failing request (a corrupt file, an
exception inside the analysis, a malformed API call) leaves it answering the next one, the page names the device the
models really run on, and the video tab's downloads have distinct names. The app is served on a loopback port and
driven through ``gradio_client``, each call bounded by a timeout."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import DATA, require_module

from sapiens2.demo import DemoOptions
from sapiens2.demo.analysis import analyse, read_upload
from sapiens2.demo.models import ModelCache
from sapiens2.demo.sessions import RequestFolders, ResultStore, array_bytes

PHOTO = DATA / "astronaut.png"
CALL_TIMEOUT = 120  # seconds for one request, on a busy machine


def tiny_options(tiny_checkpoints, **changes) -> DemoOptions:
    fields = {"models": tiny_checkpoints, "detector": "none", "input_size": (64, 48), "device": "cpu"} | changes
    return DemoOptions(**fields)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# ------------------------------------------------------------------------------------------------- bounded retention


def test_kept_results_are_bounded_by_count_and_bytes(tiny_checkpoints, tmp_path):
    cache = ModelCache(tiny_options(tiny_checkpoints))
    analysis = analyse(read_upload(PHOTO, 40, 50), PHOTO.name, ["seg", "normal"], cache, tmp_path / "one")
    size = array_bytes(analysis)  # the photo (512*512*3), seg labels (512*512) and normals (512*512*3 float32)
    assert size == 512 * 512 * (3 + 1 + 12)
    store = ResultStore(max_count=3, max_bytes=10 * size)
    keys = [store.put(analysis) for _ in range(5)]
    assert len(store) == 3 and store.get(keys[0]) is None and store.get(keys[-1]) is analysis  # by count
    store = ResultStore(max_count=100, max_bytes=int(2.5 * size))
    keys = [store.put(analysis) for _ in range(5)]
    assert len(store) == 2 and store.nbytes == 2 * size <= store.max_bytes  # by bytes
    store.get(keys[3])  # used again: now the most recent, so the next drop takes keys[4]
    store.put(analysis)
    assert store.get(keys[3]) is analysis and store.get(keys[4]) is None
    newest = store.put(analysis, replaces=keys[3])  # a page's new results replace its old ones
    assert store.get(keys[3]) is None and store.get(newest) is analysis
    store.drop(newest)
    assert store.get(newest) is None
    huge = ResultStore(max_count=4, max_bytes=1)
    assert huge.get(huge.put(analysis)) is analysis  # the newest is kept whatever its size


def test_request_folders_are_bounded_and_removed_on_close(tmp_path):
    folders = RequestFolders(keep=10, max_bytes=2500, parent=tmp_path)
    made = []
    for _ in range(5):
        made.append(folders.new())
        (made[-1] / "result.bin").write_bytes(b"x" * 1000)
    # Each new folder drops the oldest until the finished ones hold at most 2.5 kB: two of 1 kB, and the new one.
    assert [folder.exists() for folder in made] == [False, False, True, True, True]
    folders = RequestFolders(keep=3, max_bytes=10**9, parent=tmp_path)
    made = [folders.new() for _ in range(5)]
    assert [folder.exists() for folder in made] == [False, False, True, True, True]
    folders.close()
    assert not folders.root.exists()


# ------------------------------------------------------------------------------------------------- device, downloads


def test_the_page_names_the_device_the_models_really_run_on(tiny_checkpoints):
    import torch

    from sapiens2.demo.render import models_markdown

    options = tiny_options(tiny_checkpoints, device=None)
    cache = ModelCache(options)
    before = models_markdown(options, cache)
    assert "auto" not in before  # not a guess: Predictor's own choice of device
    predictor = cache.get("seg")
    device = torch.device(predictor.device)
    expected = "cpu, fp32" if device.type == "cpu" else f"({torch.cuda.get_device_name(device)})"
    assert expected in cache.device_text("seg") and expected in models_markdown(options, cache)
    assert f"device: {cache.device_text('seg')}" in before


def test_video_downloads_have_distinct_names(tiny_checkpoints, tmp_path):
    require_module("av")
    from videoclips import moving_crops, write_clip

    from sapiens2.demo.app import download_files
    from sapiens2.demo.video import analyse_video

    clip = write_clip(tmp_path / "clip.mp4", list(moving_crops(3)))
    cache = ModelCache(tiny_options(tiny_checkpoints))
    folder = tmp_path / "request"
    outcome = analyse_video(clip, ["seg", "normal", "albedo"], cache, folder, max_frames=3, max_file_mb=50)
    assert outcome.errors == []
    offered = [Path(path) for path in download_files(outcome.files, folder)]
    names = [path.name for path in offered]
    assert len(names) == len(set(names)) == len(outcome.files)  # what a browser saves: one name per file
    for original, download in zip(outcome.files, offered, strict=True):
        assert download.read_bytes() == original.read_bytes()
        relative = original.relative_to(folder)
        assert download.name == "_".join(relative.parts)  # clip_seg/chunk_000000.npz -> clip_seg_chunk_000000.npz
    assert download_files(offered, folder) == [str(path) for path in offered]  # distinct names stay as they are


# ------------------------------------------------------------------------------------------------- the served app


@pytest.fixture(scope="module")
def served(tiny_checkpoints, tmp_path_factory):
    """The demo on 127.0.0.1 (tiny seg and pose models), at most 2 pages' results kept, and a client on it."""
    require_module("gradio")
    client_module = require_module("gradio_client")
    from sapiens2.demo import launch

    options = tiny_options(
        {task: tiny_checkpoints[task] for task in ("seg", "pose")},
        port=_free_port(),
        tasks=("seg",),
        max_kept_results=2,
        max_kept_mb=64,
    )
    app = launch(options, block=False)
    try:
        yield app, client_module, f"http://127.0.0.1:{options.port}/", tmp_path_factory.mktemp("served")
    finally:
        app.close()
        assert not app.sapiens2_folders.root.exists()  # closing the app removes the requests' files


def _call(client, *args, api_name: str):
    """One request, bounded by a timeout: a server that stopped answering fails here instead of hanging."""
    return client.submit(*args, api_name=api_name).result(timeout=CALL_TIMEOUT)


def _run(client_module, client, path: Path, tasks=("seg",)):
    return _call(client, client_module.handle_file(str(path)), list(tasks), "sapiens308", True, [], api_name="/on_run")


def test_a_failing_request_leaves_the_app_answering(served):
    app, client_module, url, folder = served
    client = client_module.Client(url, verbose=False)
    try:
        bad = DATA / "bad_inputs" / "truncated.jpg"
        upload = _call(client, client_module.handle_file(str(bad)), api_name="/on_upload")
        assert "truncated JPEG" in upload[1]
        assert "truncated JPEG" in _run(client_module, client, bad)[0]
        # An exception inside the analysis: OpenCV cannot encode a picture 70000 pixels wide (seg's files).
        strip = folder / "strip.png"
        cv2.imwrite(str(strip), np.full((2, 70_000, 3), 120, np.uint8))
        status = _run(client_module, client, strip)[0]
        assert "seg failed" in status and "could not encode" in status
        # A malformed call (a task that does not exist): Gradio refuses it.
        with pytest.raises(Exception):  # noqa: B017 - gradio_client's AppError; the point is what follows
            _run(client_module, client, PHOTO, tasks=("bogus",))
        status = _run(client_module, client, PHOTO)[0]  # the same server answers the next request
        assert "**astronaut.png**: 512×512 pixels" in status and "failed" not in status
    finally:
        client.close()


def test_this_run_keeps_gradio_ray_and_subprocess_temporaries_in_folders_of_its_own(served):
    """Two test runs at once shared Gradio's ``/tmp/gradio``: one run's cleanup made the other's uploads answer 403
    (``test_a_failing_request_leaves_the_app_answering``). ``tests/conftest.py`` gives each run its own folder for
    Gradio's files, Ray's sessions (``RAY_TMPDIR``, which Ray reads before ``TMPDIR``) and the ``TMPDIR`` of every
    process the tests start, and removes it when the run ends."""
    from conftest import RUN_TEMPORARY

    app = served[0]
    own = RUN_TEMPORARY.resolve()
    assert own.is_relative_to(Path(tempfile.gettempdir()).resolve()) and own != Path(tempfile.gettempdir()).resolve()
    assert Path(app.GRADIO_CACHE).resolve().is_relative_to(own)
    assert Path(os.environ["RAY_TMPDIR"]).resolve().is_relative_to(own)
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                           capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert Path(child.stdout.strip()).resolve().is_relative_to(own)


@pytest.mark.slow  # a server process importing torch and Gradio, then 30 requests: ~90 s alone
def test_a_served_demo_stays_flat_under_many_pages_and_sigterm_removes_its_files(tiny_checkpoints, tmp_path):
    """``sapiens2 demo --max-kept-results 2`` answers 30 requests, each from a new page (a new session): after a
    warm-up the server's resident memory grows by less than one request's arrays (the photo, seg labels and
    normals: 16 bytes a pixel, 69 MB here). Before, each page kept its full-size arrays for an hour (69 MB a
    request); and Gradio runs each request on a thread of its pool, where glibc kept every thread's freed arrays
    in that thread's arena until the heap was trimmed after each request (``sapiens2.memory``): 582 -> 920 MB over 30
    requests, against 573 -> 628 MB. Stopped with SIGTERM (kill, docker stop, systemd), it removes its request
    folders and Gradio's copies, as Ctrl+C does."""
    client_module = require_module("gradio_client")
    require_module("gradio")
    port = _free_port()
    temp = tmp_path / "tmp"
    temp.mkdir()
    photo = tmp_path / "photo.png"  # 4.32 megapixels; seg + normal results: ~16 bytes a pixel
    cv2.imwrite(str(photo), cv2.resize(cv2.imread(str(PHOTO)), (2400, 1800)))
    argv = [sys.executable, "-m", "sapiens2", "demo", f"--model=seg={tiny_checkpoints['seg']}",
            f"--model=normal={tiny_checkpoints['normal']}", "--detector", "none", "--input-size", "64", "48",
            "--device", "cpu", "--port", str(port), "--task", "seg", "--max-kept-results", "2"]  # fmt: skip
    env = {key: value for key, value in os.environ.items() if key != "GRADIO_TEMP_DIR"}
    env |= {"TMPDIR": str(temp), "OMP_NUM_THREADS": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    def rss_mb() -> float:
        return int(Path(f"/proc/{server.pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6

    try:
        deadline, client = time.monotonic() + 120, None
        while client is None and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.5)
            try:
                client = client_module.Client(f"http://127.0.0.1:{port}/", verbose=False)
            except Exception:
                client = None
        assert client is not None, server.stdout.read() if server.poll() is not None else "no answer in 120 s"
        client.close()
        samples = []
        for _ in range(30):
            client = client_module.Client(f"http://127.0.0.1:{port}/", verbose=False)
            try:
                status = _run(client_module, client, photo, tasks=("seg", "normal"))[0]
            finally:
                client.close()
            assert "2400×1800" in status and "failed" not in status
            samples.append(rss_mb())
        warm, last = np.median(samples[2:5]), np.median(samples[-3:])
        one_request = 16 * 2400 * 1800 / 1e6
        assert last - warm < one_request, f"RSS grew from {warm:.0f} MB to {last:.0f} MB: {[round(s) for s in samples]}"
        assert [path for path in temp.rglob("*") if path.is_file()]  # the requests' files, Gradio's uploads ...
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)
    assert not list(temp.iterdir())  # ... all gone: the request folders and Gradio's folder
