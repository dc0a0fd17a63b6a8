"""The ``sapiens2 demo`` page in a real browser: Debian's headless Chromium (``/usr/bin/chromium``, installed by
``.ci/run``; ``$SAPIENS2_CHROMIUM`` elsewhere) driven by Playwright against the app on a loopback port with tiny
local checkpoints. One app and one browser for the whole module.

Screenshots are written to a ``demo_screenshots`` folder of the test's temporary directory and, when
``$SAPIENS2_ARTIFACTS`` is set (CI), copied there.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import types
from pathlib import Path

import pytest
from conftest import DATA, require, require_module

from sapiens2.predict import PredictOptions, predict_files

PHOTO = DATA / "astronaut.png"
CHROMIUM = Path(os.environ.get("SAPIENS2_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TASKS = ("seg", "pose")
LOCAL = (*TASKS, "pointmap")  # tasks with a tiny local model; the others are the released 1b, offline
INPUT_SIZE = (256, 192)  # the tiny pointmap head's grid (conftest.TINY_INPUT), for every task
WAIT_MS = 60_000


def require_chromium(path: Path = CHROMIUM) -> Path:
    """The browser, or (locally) a skip / (under CI=true) a failure that says Chromium is missing and how to fix it."""
    return require(path, f"Chromium is missing: no browser at {path} (apt install chromium, or set SAPIENS2_CHROMIUM "
                         "to a Chromium executable)")  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def site(tiny_checkpoints, tmp_path_factory):
    """The demo served on 127.0.0.1 (seg, pose and pointmap: tiny models; other tasks: the released 1b, offline and
    not cached) and one Chromium page on it."""
    require_module("gradio")
    sync_api = require_module("playwright.sync_api")
    chromium = require_chromium()
    from huggingface_hub import constants

    from sapiens2.demo import DemoOptions, launch

    folder = tmp_path_factory.mktemp("demo_browser")
    options = DemoOptions(
        models={task: tiny_checkpoints[task] for task in LOCAL},
        detector="none",
        input_size=INPUT_SIZE,
        device="cpu",
        host="127.0.0.1",
        port=_free_port(),
        tasks=TASKS,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_OFFLINE", True)  # a task without a local model must explain, not download
        patch.setattr(constants, "HF_HUB_CACHE", str(folder / "empty_hub"))
        app = launch(options, block=False)
        try:
            with sync_api.sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
                page.set_default_timeout(WAIT_MS)
                page.goto(f"http://127.0.0.1:{options.port}/")
                page.wait_for_selector("#run")
                yield types.SimpleNamespace(page=page, browser=browser, folder=folder, options=options)
                browser.close()
        finally:
            app.close()


def upload(page, path: Path) -> None:
    clear = page.locator("#photo-upload button[aria-label='Clear']")
    if clear.count():
        clear.first.click()
    page.locator("#photo-upload input[type=file]").set_input_files(str(path))


def run_and_wait(page) -> None:
    """Press Run and wait until the request is over: the status's progress tracker was shown after the click and is
    hidden again, and stays hidden (an earlier event's tracker, or a transient hide between progress updates, would
    otherwise end the wait while the run is still going: seen under load)."""
    tracker = "#status [data-testid=status-tracker]"
    hidden = "s => { const e = document.querySelector(s); return e !== null && e.classList.contains('hide') }"
    page.wait_for_function(hidden, arg=tracker)  # whatever ran before (the upload) is over
    page.eval_on_selector(
        tracker,
        """tracker => {
            window.trackerShown = false;
            new MutationObserver(() => { if (!tracker.classList.contains("hide")) window.trackerShown = true; })
                .observe(tracker, {attributes: true, attributeFilter: ["class"]});
        }""",
    )
    page.click("#run")
    done = f"s => window.trackerShown && ({hidden})(s)"
    for _ in range(2):  # hidden, then still hidden a moment later
        page.wait_for_function(done, arg=tracker)
        page.wait_for_timeout(300)
    page.wait_for_function(done, arg=tracker)


def assert_size(page, view: str, size: tuple[int, int]) -> None:
    """The picture the browser received for a result view has (H, W) ``size`` (waiting for it to load)."""
    image = f"#{view} img"
    try:
        page.wait_for_function(
            "([s, h, w]) => { const e = document.querySelector(s); return e && e.complete && e.naturalHeight === h "
            "&& e.naturalWidth === w }",
            arg=[image, size[0], size[1]],
            timeout=20_000,
        )
    except Exception:
        shown = page.locator(image).count()
        got = page.eval_on_selector(image, "e => [e.naturalHeight, e.naturalWidth]") if shown else None
        raise AssertionError(f"{view}: the browser shows a picture of (H, W) {got}, expected {size}") from None


def set_tasks(page, tasks) -> None:
    group = page.locator("#tasks")
    for task in ("pose", "seg", "normal", "pointmap", "albedo", "matting"):
        box = group.get_by_label(task, exact=True)
        box.check() if task in tasks else box.uncheck()


def download(page, name: str, folder: Path, where: str = "#downloads") -> Path:
    with page.expect_download() as info:
        page.click(f"{where} a[download='{name}']")
    path = folder / name
    info.value.save_as(path)
    return path


def screenshot(page, folder: Path, name: str) -> Path:
    """Save a screenshot of the page as a test artefact (and in $SAPIENS2_ARTIFACTS when set)."""
    shots = folder / "demo_screenshots"
    shots.mkdir(exist_ok=True)
    path = page.screenshot(path=shots / name, full_page=True) and shots / name
    if os.environ.get("SAPIENS2_ARTIFACTS"):
        target = Path(os.environ["SAPIENS2_ARTIFACTS"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target / name)
    return path


@pytest.fixture(scope="module")
def ran(site):
    """The page after uploading the photo and running seg and pose on it."""
    page = site.page
    upload(page, PHOTO)
    page.wait_for_selector("#view-photo img")
    set_tasks(page, TASKS)
    run_and_wait(page)
    page.wait_for_selector("#view-pose img")
    return site


def test_photo_gives_seg_and_pose_at_the_photo_size(ran):
    page = ran.page
    for view in ("view-photo", "view-seg", "view-pose"):
        assert_size(page, view, (512, 512))
    status = page.inner_text("#status")
    assert "astronaut.png" in status and "512×512" in status
    for task in TASKS:  # per-task timings, and the models' first-use load
        assert task in status
    assert "inference" in status and "failed" not in status
    legend = page.inner_text("#seg-legend")
    assert "Background" in legend and "Tongue" in legend
    shot = screenshot(page, ran.folder, "demo_seg_pose.png")
    assert shot.stat().st_size > 10_000


def test_downloads_equal_what_predict_writes(ran, tiny_checkpoints):
    out = ran.folder / "predict"
    status = predict_files(
        PredictOptions(
            tasks=TASKS,
            inputs=[PHOTO],
            output=out,
            models={task: tiny_checkpoints[task] for task in TASKS},
            detector="none",
            input_size=INPUT_SIZE,
            device="cpu",
        )
    )
    assert status == 0
    names = {element.get_attribute("download") for element in ran.page.locator("#downloads a[download]").all()}
    assert names == {p.name for p in out.iterdir() if p.name != "_bulk"}  # _bulk: predict's record of its inputs
    got = download(ran.page, "astronaut_seg.png", ran.folder)
    assert got.read_bytes() == (out / "astronaut_seg.png").read_bytes()
    record = json.loads(download(ran.page, "astronaut_pose.json", ran.folder).read_text())
    expected = json.loads((out / "astronaut_pose.json").read_text())
    assert record.pop("path") == PHOTO.name and expected.pop("path") == str(PHOTO)
    assert record == expected


def test_keypoint_set_choice_redraws_and_rewrites_the_pose_file(ran):
    page = ran.page
    page.locator("#keypoint-set").get_by_label("COCO 17", exact=True).check()
    page.wait_for_function(
        "() => [...document.querySelectorAll('#downloads a[download]')].some(a => a.download === 'astronaut_pose.json')"
        " && document.querySelector('#view-pose img') !== null"
    )
    page.wait_for_timeout(500)  # the rewritten file list replaces the old one
    record = json.loads(download(page, "astronaut_pose.json", ran.folder).read_text())
    assert record["keypoint_format"] == "coco17" and record["num_keypoints"] == 17
    assert_size(page, "view-pose", (512, 512))
    page.locator("#keypoint-set").get_by_label("Sapiens 308", exact=True).check()


def test_corrupt_upload_is_explained_and_the_app_keeps_serving(ran):
    page = ran.page
    upload(page, DATA / "bad_inputs" / "truncated.jpg")
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('truncated.jpg')")
    assert "cannot read image 'truncated.jpg': truncated JPEG" in page.inner_text("#status")
    run_and_wait(page)
    assert "truncated JPEG" in page.inner_text("#status")
    assert page.locator("#view-seg img").count() == 0  # no stale result next to the message
    screenshot(page, ran.folder, "demo_bad_input.png")
    upload(page, DATA / "camera.png")  # the same server answers the next request
    page.wait_for_selector("#view-photo img")
    run_and_wait(page)
    assert "camera.png" in page.inner_text("#status")
    assert_size(page, "view-seg", (512, 512))


def test_pointmap_shows_depth_and_a_turnable_3d_view(ran):
    page = ran.page
    upload(page, PHOTO)
    page.wait_for_selector("#view-photo img")
    set_tasks(page, ("pointmap",))
    run_and_wait(page)
    assert_size(page, "view-depth", (512, 512))
    page.wait_for_function(  # the glTF viewer draws into a canvas once the mesh file has loaded
        "() => { const c = document.querySelector('#view-mesh canvas'); return c && c.width > 0 && c.height > 0 }"
    )
    names = {element.get_attribute("download") for element in page.locator("#downloads a[download]").all()}
    assert {"astronaut.ply", "astronaut_pointmap.npy", "astronaut_depth.npy", "astronaut_focal.json"} <= names
    set_tasks(page, TASKS)


def test_a_task_without_a_model_says_how_to_pass_one(ran):
    page = ran.page
    upload(page, PHOTO)
    page.wait_for_selector("#view-photo img")
    set_tasks(page, ("seg", "normal"))
    run_and_wait(page)
    status = page.inner_text("#status")
    assert "cannot load the normal model" in status and "HF_HUB_OFFLINE" in status
    assert "sapiens2 demo --model pose=PATH" in status
    assert page.locator("#view-normal img").count() == 0
    assert_size(page, "view-seg", (512, 512))
    set_tasks(page, TASKS)


def test_short_video_tab_plays_the_overlay_and_offers_predicts_files(site, tiny_checkpoints):
    require_module("av")
    from videoclips import moving_crops, write_clip

    from sapiens2 import Predictor
    from sapiens2.video import VideoOptions, predict_video

    clip = write_clip(site.folder / "clip.mp4", list(moving_crops(6)))
    page = site.page
    page.get_by_role("tab", name="Short video").click()
    page.locator("#clip-upload input[type=file]").set_input_files(str(clip))
    page.locator("#clip-upload a[download='clip.mp4']").wait_for()
    page.click("#video-run")
    page.wait_for_function(
        "() => { const v = document.querySelector('#view-overlay video'); return v && v.videoWidth > 0 }"
    )
    assert page.eval_on_selector("#view-overlay video", "v => [v.videoWidth, v.videoHeight]") == [128, 96]
    assert "clip.mp4: 6 frames" in page.inner_text("#video-status")
    names = {element.get_attribute("download") for element in page.locator("#video-downloads a[download]").all()}
    assert {"clip_frames.jsonl", "clip_overlay.mp4", "clip_video.json"} <= names
    got = download(page, "clip_frames.jsonl", site.folder, "#video-downloads")
    pose = Predictor("pose", tiny_checkpoints["pose"], device="cpu", input_size=INPUT_SIZE, detector=None)
    report = predict_video(pose, clip, site.folder / "video_predict", VideoOptions(end=site.options.max_video_frames))
    assert report.error is None
    assert got.read_bytes() == (site.folder / "video_predict" / "clip_frames.jsonl").read_bytes()
    screenshot(page, site.folder, "demo_video.png")
    page.get_by_role("tab", name="Photo").click()


@pytest.mark.slow  # a 4-megapixel seg run to queue behind: ~5 s alone, far more on a busy machine
def test_a_second_request_waits_in_the_queue_and_sees_its_place(site):
    """One model run at a time: while one page's request runs, another page's request shows "queue: 1/1"."""
    import cv2

    big = site.folder / "big.jpg"  # 4 megapixels: seg at full resolution takes a moment
    cv2.imwrite(str(big), cv2.resize(cv2.imread(str(PHOTO)), (2000, 2000)))
    first, second = site.page, site.browser.new_page(viewport={"width": 1400, "height": 1000})
    second.set_default_timeout(WAIT_MS)
    second.goto(first.url)
    for page, photo in ((first, big), (second, PHOTO)):
        upload(page, photo)
        page.wait_for_selector("#view-photo img")
        set_tasks(page, ("seg",))
    first.click("#run")
    first.wait_for_function("() => document.querySelector('#status').innerText.includes('seg: running')")
    second.click("#run")
    second.wait_for_function("() => /queue: 1\\/1/.test(document.querySelector('#status').innerText)")
    first.wait_for_function("() => document.querySelector('#status').innerText.includes('2000×2000')")
    second.wait_for_function("() => document.querySelector('#status').innerText.includes('512×512')")
    assert_size(first, "view-seg", (2000, 2000))
    assert_size(second, "view-seg", (512, 512))
    second.close()
    set_tasks(first, TASKS)


def test_a_missing_chromium_says_so_and_fails_under_ci(tmp_path, monkeypatch):
    nowhere = tmp_path / "no_chromium"
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception) as failure:
        require_chromium(nowhere)
    message = str(failure.value)
    assert f"Chromium is missing: no browser at {nowhere}" in message and "SAPIENS2_SHARED" not in message
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="Chromium is missing"):
        require_chromium(nowhere)
