"""The demo follows a model of its own keypoints or classes (``sapiens2.labels``; the set in the model file's
metadata): the page offers the model's class names and keypoint set from the start (read from the file's header, no
model loaded), a request writes and draws what ``sapiens2 predict`` does with the file's palette and skeleton, hiding
one of the model's classes shows the photo there, and the keypoint conversions of the 308 are not offered to a pose
model of its own keypoints. A model whose file does not name its set (a ``.pth``) gets its names on the page once a
run has loaded it. The served page is driven through ``gradio_client`` (slow)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import DATA, TINY_ARCH, TINY_HEADS, require_module

from sapiens2.labels import METADATA_KEY, LabelSet, class_set, keypoint_set
from sapiens2.predict.writers import LABELS_FORMAT  # the keypoint-set value of a model of its own keypoints

PHOTO = DATA / "astronaut.png"
CLASSES = ("background", "shirt", "trousers", "left_sleeve", "right_sleeve")
SHIRT_RGB = (10, 200, 30)  # the file's own colour for "shirt" (the fallback palette would give another)
KEYPOINTS = ("racket_tip", "bar_end", "left_wrist", "right_wrist")
CALL_TIMEOUT = 120  # seconds for one served request, on a busy machine


@pytest.fixture(scope="module")
def label_models(tmp_path_factory) -> dict[str, Path]:
    """Tiny random models of a 5-class list (with a palette colour of its own) and a 4-keypoint set (with its own
    skeleton), each carrying its set in the safetensors metadata as ``sapiens2 export`` writes it; and the same
    models as ``.pth`` files (``seg_pth``, ``pose_pth``), which cannot say their names."""
    from safetensors.torch import save_file

    from sapiens2 import build_model

    folder = tmp_path_factory.mktemp("label_models")
    classes = class_set(CLASSES, palette={"shirt": SHIRT_RGB})
    points = keypoint_set(KEYPOINTS, skeleton=[("left_wrist", "racket_tip"), ("right_wrist", "bar_end")])
    paths = {}
    for task, head, labels in (
        ("seg", {"num_classes": len(CLASSES)}, LabelSet(classes=classes)),
        ("pose", {"out_channels": len(KEYPOINTS)}, LabelSet(keypoints=points)),
    ):
        torch.manual_seed(0)
        model = build_model(task, TINY_ARCH, input_size=(64, 48), **TINY_HEADS[task], **head)
        state = {key: value.contiguous() for key, value in model.state_dict().items()}
        paths[task] = folder / f"my_{task}.safetensors"
        save_file(state, str(paths[task]), metadata={METADATA_KEY: labels.to_json()})
        paths[f"{task}_pth"] = folder / f"my_{task}.pth"
        torch.save(state, paths[f"{task}_pth"])
    return paths


@pytest.fixture(scope="module")
def gradio():
    """Gradio, imported once for the module (about 5 s, outside the tests' own time)."""
    return require_module("gradio")


def demo_options(models, **changes):
    from sapiens2.demo import DemoOptions

    fields = {"models": models, "detector": "none", "input_size": (64, 48), "device": "cpu"} | changes
    return DemoOptions(**fields)


def component(app, elem_id: str):
    return next(block for block in app.blocks.values() if getattr(block, "elem_id", None) == elem_id)


def values(choices) -> list[str]:
    return [value for _, value in choices]


# ------------------------------------------------------------------------------------------ the page before any run


def test_the_page_offers_the_models_own_classes_and_keypoints_before_any_model_loads(
    gradio, label_models, tiny_checkpoints
):
    from sapiens2.demo import build_app
    from sapiens2.demo.app import KEYPOINT_SETS
    from sapiens2.metadata import seg_metadata

    app = build_app(demo_options({task: label_models[task] for task in ("seg", "pose")}))
    assert not app.sapiens2_cache.is_loaded("seg") and not app.sapiens2_cache.is_loaded("pose")  # the header only
    classes = component(app, "seg-classes")
    assert values(classes.choices) == list(CLASSES) and classes.value == list(CLASSES)
    assert component(app, "view-seg").label == "Classes (seg)"  # not "Body parts": a list of one's own
    legend = component(app, "seg-legend").value
    assert legend.count('class="seg-class"') == len(CLASSES) and "right_sleeve" in legend
    assert f"background:rgb{SHIRT_RGB}".replace(" ", "") in legend.replace(" ", "")  # the file's own colour
    for elem_id in ("keypoint-set", "video-keypoints"):  # the photo tab's and the video tab's
        control = component(app, elem_id)
        assert values(control.choices) == [LABELS_FORMAT] and control.value == LABELS_FORMAT
        assert not control.interactive and "4 keypoints (racket_tip, bar_end" in control.choices[0][0]
        assert "conversions of the Sapiens 308 keypoints and do not apply" in control.info

    released = build_app(demo_options({task: tiny_checkpoints[task] for task in ("seg", "pose")}))
    assert values(component(released, "seg-classes").choices) == list(seg_metadata().class_names)
    assert component(released, "view-seg").label == "Body parts (seg)"
    control = component(released, "keypoint-set")
    assert control.choices == KEYPOINT_SETS and control.value == "sapiens308" and control.interactive is not False


def test_a_file_that_names_no_set_is_named_by_its_head(label_models, tmp_path):
    """What the page can know before loading (``checkpoints.source_label_set``): a safetensors head of 5 outputs
    without metadata is numbered as ``labels_of`` numbers a loaded one; a ``.pth`` is known only once loaded."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from sapiens2 import load_model
    from sapiens2.checkpoints import source_label_set
    from sapiens2.labels import labels_of

    with safe_open(str(label_models["seg"]), "pt") as handle:
        state = {key: handle.get_tensor(key) for key in handle.keys()}
    save_file(state, str(tmp_path / "plain.safetensors"))
    known = source_label_set(tmp_path / "plain.safetensors", "seg").classes.class_names
    assert known == labels_of(load_model("seg", tmp_path / "plain.safetensors")).classes.class_names
    assert known == tuple(f"class_{i}" for i in range(5))
    assert source_label_set(label_models["seg_pth"], "seg") is None
    assert source_label_set(label_models["seg"], "seg").classes.class_names == CLASSES
    assert source_label_set(tmp_path / "missing.safetensors", "seg") is None


# ------------------------------------------------------------------------------------------ a request


def test_a_request_writes_and_draws_with_the_models_own_set_as_predict_does(label_models, tmp_path):
    from sapiens2.demo.analysis import analyse, read_upload
    from sapiens2.demo.models import ModelCache
    from sapiens2.demo.render import seg_picture
    from sapiens2.predict import PredictOptions, predict_files
    from sapiens2.predict.visualize import seg_overlay

    models = {task: label_models[task] for task in ("seg", "pose")}
    cache = ModelCache(demo_options(models))
    image = read_upload(PHOTO, 40, 50)
    analysis = analyse(image, PHOTO.name, ["seg", "pose"], cache, tmp_path / "demo")
    assert all(outcome.error is None for outcome in analysis.outcomes.values())
    predict = PredictOptions(tasks=["seg", "pose"], inputs=[PHOTO], output=tmp_path / "predict", models=models,
                             detector="none", input_size=(64, 48), device="cpu")  # fmt: skip
    assert predict_files(predict) == 0
    for path in analysis.files():  # the palette and skeleton of the files, as predict draws them
        expected = tmp_path / "predict" / path.name
        if path.suffix == ".json":
            got, want = json.loads(path.read_text()), json.loads(expected.read_text())
            assert got.pop("path") == PHOTO.name and want.pop("path") == str(PHOTO)
            assert got == want and got["keypoint_format"] == LABELS_FORMAT and got["keypoint_names"] == list(KEYPOINTS)
        else:
            assert path.read_bytes() == expected.read_bytes(), path.name

    seg, classes = analysis.result("seg"), analysis.labels("seg")
    assert classes.class_names == CLASSES
    shirt = seg.labels == CLASSES.index("shirt")
    assert 0 < shirt.sum() < shirt.size
    everything = seg_picture(image, seg.labels, CLASSES, classes)
    np.testing.assert_array_equal(everything, seg_overlay(image, seg.labels, palette=classes.palette))
    expected_shirt = np.round(0.5 * image[shirt] + 0.5 * np.array(SHIRT_RGB)).astype(np.uint8)
    assert np.abs(everything[shirt].astype(int) - expected_shirt).max() <= 1  # the file's colour for the class
    hidden = seg_picture(image, seg.labels, [name for name in CLASSES if name != "shirt"], classes)
    np.testing.assert_array_equal(hidden[shirt], image[shirt])  # the photo where the hidden class is
    np.testing.assert_array_equal(hidden[~shirt], everything[~shirt])


# ------------------------------------------------------------------------------------------ the served page


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _call(client, *args, api_name: str):
    return client.submit(*args, api_name=api_name).result(timeout=CALL_TIMEOUT)


def _served_choices(client, elem_id: str) -> list[str]:
    props = next(c["props"] for c in client.config["components"] if c["props"].get("elem_id") == elem_id)
    return [value for _, value in props["choices"]]


def _read_rgb(path) -> np.ndarray:
    return cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)


@pytest.mark.slow  # a Gradio server in this process and two model loads: ~10 s on a busy machine
def test_the_served_page_filters_the_models_own_classes_and_keeps_its_keypoints(label_models, tmp_path):
    """Through the served page's API, as the browser calls it: the toggles list the model's classes, unticking one
    shows the photo exactly where it was, the pose files name the model's keypoints, and a 308 conversion is refused
    by the page (it is not one of the keypoint choices)."""
    client_module = require_module("gradio_client")
    require_module("gradio")
    from sapiens2.demo import launch

    options = demo_options({task: label_models[task] for task in ("seg", "pose")}, port=_free_port())
    app = launch(options, block=False)
    client = client_module.Client(f"http://127.0.0.1:{options.port}/", verbose=False)
    try:
        assert _served_choices(client, "seg-classes") == list(CLASSES)
        assert _served_choices(client, "keypoint-set") == [LABELS_FORMAT]
        photo = client_module.handle_file(str(PHOTO))
        out = _call(client, photo, ["seg", "pose"], LABELS_FORMAT, True, list(CLASSES), api_name="/on_run")
        assert "failed" not in out[0], out[0]  # outputs: status, files, the views ... (the page's state is not sent)
        files = {Path(path).name: Path(path) for path in out[1]}
        record = json.loads(files["astronaut_pose.json"].read_text())
        assert record["keypoint_names"] == list(KEYPOINTS)
        labels = cv2.imread(str(files["astronaut_seg.png"]), cv2.IMREAD_UNCHANGED)
        shirt = labels == CLASSES.index("shirt")
        assert 0 < shirt.sum() < shirt.size
        photo_rgb, shown = _read_rgb(PHOTO), _read_rgb(out[3]["value"])  # the seg view
        assert (shown[shirt] != photo_rgb[shirt]).any()
        hidden = _read_rgb(_call(client, [name for name in CLASSES if name != "shirt"], api_name="/on_classes"))
        np.testing.assert_array_equal(hidden[shirt], photo_rgb[shirt])  # filtering the class shows the photo
        np.testing.assert_array_equal(hidden[~shirt], shown[~shirt])
        with pytest.raises(Exception, match="coco17"):  # noqa: B017 - gradio_client's AppError, naming the value
            _call(client, "coco17", True, api_name="/on_pose_choice")
    finally:
        client.close()
        app.close()


@pytest.mark.slow  # a Gradio server in this process and a model load: ~8 s on a busy machine
def test_a_model_named_only_once_loaded_gives_the_toggles_its_names_after_the_run(label_models):
    """A ``.pth`` seg model of 5 classes cannot say its names before it loads: the page first offers the 29, and
    the run's answer gives the toggles the model's names (numbered: the file has none), which then filter."""
    client_module = require_module("gradio_client")
    require_module("gradio")
    from sapiens2.demo import launch
    from sapiens2.metadata import seg_metadata

    options = demo_options({"seg": label_models["seg_pth"]}, port=_free_port(), tasks=("seg",))
    app = launch(options, block=False)
    client = client_module.Client(f"http://127.0.0.1:{options.port}/", verbose=False)
    try:
        released = list(seg_metadata().class_names)
        assert _served_choices(client, "seg-classes") == released
        out = _call(client, client_module.handle_file(str(PHOTO)), ["seg"], "sapiens308", True, released,
                    api_name="/on_run")  # fmt: skip
        numbered = [f"class_{i}" for i in range(5)]
        toggles = out[-2]
        assert [value for _, value in toggles["choices"]] == numbered and toggles["value"] == numbered
        assert "class_4" in out[-3] and "Background" not in out[-3]  # the legend
        hidden = _call(client, numbered[1:], api_name="/on_classes")  # the new names are the page's choices now
        files = {Path(path).name: Path(path) for path in out[1]}
        labels = cv2.imread(str(files["astronaut_seg.png"]), cv2.IMREAD_UNCHANGED)
        np.testing.assert_array_equal(_read_rgb(hidden)[labels == 0], _read_rgb(PHOTO)[labels == 0])
    finally:
        client.close()
        app.close()


# ------------------------------------------------------------------------------------------ in a browser


def _picture(page, view: str) -> np.ndarray:
    """The RGB picture a result view shows, fetched as the browser received it."""
    source = page.get_attribute(f"#{view} img", "src")
    data = np.frombuffer(page.request.get(source).body(), np.uint8)
    return cv2.cvtColor(cv2.imdecode(data, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


def _toggle_names(page) -> list[str]:
    return [label.inner_text().strip() for label in page.locator("#seg-classes label").all()]


@pytest.mark.slow  # a Gradio server and headless Chromium: ~25 s on a busy machine
def test_in_a_browser_the_toggles_and_keypoint_set_are_the_models(label_models, tmp_path):
    """Headless Chromium on the page (``test_demo_browser``'s setup) with the 5-class seg model and a ``.pth`` pose
    model of 4 keypoints (which cannot say its names before it loads: the page offers the 308 until then): the seg
    toggles list the model's classes and unticking one shows the photo there; after the run the keypoint set is the
    model's own, fixed, saying why, and a page opened afterwards shows it at once."""
    require_module("gradio")
    sync_api = require_module("playwright.sync_api")
    from test_demo_browser import CHROMIUM_ARGS, WAIT_MS, require_chromium, run_and_wait, set_tasks, upload

    from sapiens2.demo import launch

    chromium = require_chromium()
    models = {"seg": label_models["seg"], "pose": label_models["pose_pth"]}
    options = demo_options(models, port=_free_port(), tasks=("seg", "pose"))
    app = launch(options, block=False)
    own = "The model's own 4 keypoints (keypoint_0, keypoint_1"  # numbered: the .pth names none
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(WAIT_MS)
            url = f"http://127.0.0.1:{options.port}/"
            page.goto(url)
            page.wait_for_selector("#run")
            radio = page.locator("#keypoint-set")
            assert "COCO 17" in radio.inner_text() and own not in radio.inner_text()

            upload(page, PHOTO)
            page.wait_for_selector("#view-photo img")
            set_tasks(page, ("seg", "pose"))
            run_and_wait(page)
            assert _toggle_names(page) == list(CLASSES)
            assert "right_sleeve" in page.inner_text("#seg-legend")
            page.wait_for_function("t => document.querySelector('#keypoint-set').innerText.includes(t)", arg=own)
            assert "do not apply" in radio.inner_text()
            assert radio.locator("input").count() == 1 and radio.locator("input").first.is_disabled()  # one choice
            shown, photo = _picture(page, "view-seg"), _read_rgb(PHOTO)
            before = page.get_attribute("#view-seg img", "src")
            page.locator("#seg-classes").get_by_label("shirt", exact=True).uncheck()
            page.wait_for_function("s => document.querySelector('#view-seg img').src !== s", arg=before)
            hidden = _picture(page, "view-seg")
            changed = (hidden != shown).any(axis=2)
            assert changed.any() and (hidden[changed] == photo[changed]).all()  # the photo where the shirt was

            second = browser.new_page(viewport={"width": 1400, "height": 1000})
            second.set_default_timeout(WAIT_MS)
            second.goto(url)
            second.wait_for_selector("#keypoint-set")
            second.wait_for_function("t => document.querySelector('#keypoint-set').innerText.includes(t)", arg=own)
            second.get_by_role("tab", name="Short video").click()
            assert own in second.locator("#video-keypoints").inner_text()  # the video tab's control too
            browser.close()
    finally:
        app.close()
