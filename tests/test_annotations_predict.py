"""``sapiens2 predict --export-labels cvat|labelstudio|coco``: the run's pose and seg results as one pre-annotation
file, read back by our reader to the same keypoints (those above the threshold) and label maps as the run's own
``_pose.json`` and ``_seg.png``; a resumed run writes the file of a single run."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from test_cli_predict import group_photo, run

from sapiens2.cli import main
from sapiens2.data.annotations import read_annotations
from sapiens2.predict.label_export import EXPORT_FILES
from sapiens2.predict.visualize import KEYPOINT_THRESHOLD
from sapiens2.predict.writers import read_pose_json


def _inputs(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    group_photo(folder / "a.png")
    small = cv2.resize(cv2.imread(str(folder / "a.png")), (320, 128))
    cv2.imwrite(str(folder / "b.png"), small)
    return folder


def _check_against_run_outputs(out, labels, names, *, exact_masks: bool) -> None:
    assert [image.file_name for image in labels.images] == names
    for image in labels.images:
        stem = image.file_name.rsplit(".", 1)[0]
        pose, _ = read_pose_json(out / f"{stem}_pose.json")
        assert labels.keypoint_names == pose.keypoint_names and len(image.people) == len(pose)
        for person, points, scores in zip(image.people, pose.keypoints, pose.scores, strict=True):
            inside = np.all((points >= 0) & (points <= [image.width, image.height]), axis=1)
            labelled = (scores >= KEYPOINT_THRESHOLD) & inside  # the tools take no point outside the image
            np.testing.assert_array_equal(person.keypoints[:, 2] > 0, labelled)
            np.testing.assert_allclose(person.keypoints[labelled, :2], points[labelled], atol=0.005)
        seg = cv2.imread(str(out / f"{stem}_seg.png"), cv2.IMREAD_UNCHANGED)
        got = image.label_map(labels.class_names)
        if exact_masks:
            np.testing.assert_array_equal(got, seg)
        else:  # outlines leave out the holes of a region (another class's pixels inside it stay drawn above)
            assert (got == seg).mean() > 0.99


def test_predict_exports_cvat_pre_annotations_that_read_back_to_the_runs_outputs(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "out"
    code = run(tiny_checkpoints, ["pose", "seg"], [_inputs(tmp_path)], out, "--detector", "none",
               "--export-labels", "cvat", "--export-masks", "rle")  # fmt: skip
    assert code == 0, capsys.readouterr().err
    labels = read_annotations(out / EXPORT_FILES["cvat"])
    assert labels.problems == [] and len(labels.keypoint_names) == 308 and len(labels.skeleton) > 0
    assert labels.class_names[0] == "Background" and len(labels.class_names) == 29
    _check_against_run_outputs(out, labels, ["a.png", "b.png"], exact_masks=True)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["labelstudio", "coco"])
def test_predict_exports_label_studio_and_coco_pre_annotations(fmt, tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "out"
    code = run(tiny_checkpoints, ["pose", "seg"], [_inputs(tmp_path)], out, "--detector", "none",
               "--keypoint-format", "coco17", "--export-labels", fmt)  # fmt: skip
    assert code == 0, capsys.readouterr().err
    config = out / "labelstudio_config.xml" if fmt == "labelstudio" else None
    labels = read_annotations(out / EXPORT_FILES[fmt], label_config=config, use_predictions=True)
    assert labels.problems == [] and len(labels.keypoint_names) == 17
    _check_against_run_outputs(out, labels, ["a.png", "b.png"], exact_masks=False)
    if fmt == "labelstudio":
        from test_annotations import _label_studio_errors

        assert _label_studio_errors(config, out / EXPORT_FILES[fmt]) == []  # Label Studio's own SDK
        tasks = json.loads((out / EXPORT_FILES[fmt]).read_text())
        assert [t["data"]["image"] for t in tasks] == ["/data/local-files/?d=a.png", "/data/local-files/?d=b.png"]
        assert all(t["predictions"][0]["model_version"] == "sapiens2" for t in tasks)


@pytest.mark.parametrize(("tasks", "redo"), [(["pose", "seg"], "b_pose.json"), (["seg"], "a_seg.png")])
def test_a_resumed_run_exports_the_labels_of_a_single_run(tasks, redo, tiny_checkpoints, tmp_path, capsys):
    folder, out = _inputs(tmp_path), tmp_path / "out"
    argv = ["--detector", "none", "--batch-size", "1", "--export-labels", "cvat", "--export-masks", "rle"]
    assert run(tiny_checkpoints, tasks, [folder], out, *argv) == 0
    single = (out / EXPORT_FILES["cvat"]).read_bytes()
    (out / redo).unlink()  # as if the first run had stopped before it (and written its export on the way out)
    assert run(tiny_checkpoints, tasks, [folder], out, *argv, "--skip-existing") == 0, capsys.readouterr()
    assert (out / EXPORT_FILES["cvat"]).read_bytes() == single  # the rest read back from the run's files, in order


def test_export_labels_needs_pose_or_seg_and_image_files(tmp_path, capsys):
    argv = ["predict", "--task", "normal", str(tmp_path), "-o", str(tmp_path / "out"), "--export-labels", "cvat"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "sapiens2 predict: error: --export-labels cvat writes pose and seg labels; add one of those tasks"
    )
    manifest = tmp_path / "list.txt"
    manifest.write_text("a.png\n")
    assert (
        main(["predict", "--task", "seg", str(manifest), "-o", str(tmp_path / "out"), "--export-labels", "coco"]) == 2
    )
    assert "is not available in bulk mode" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_interrupted_run_writes_the_labels_of_the_images_it_finished(tiny_checkpoints, tmp_path, monkeypatch):
    import sapiens2.predict.run as predict_run

    calls, process = [], predict_run._process_batch

    def interrupt_the_second_batch(run_state, batch):
        calls.append(batch)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the second image runs
        process(run_state, batch)

    monkeypatch.setattr(predict_run, "_process_batch", interrupt_the_second_batch)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run(tiny_checkpoints, ["pose"], [_inputs(tmp_path)], out, "--detector", "none", "--batch-size", "1",
            "--export-labels", "coco")  # fmt: skip
    labels = read_annotations(out / EXPORT_FILES["coco"])
    assert [image.file_name for image in labels.images] == ["a.png"] and len(labels.images[0].people) == 1
