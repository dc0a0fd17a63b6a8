"""``sapiens2 predict`` through its real entry point, on committed photos, with tiny random models."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import cv2
import numpy as np
import pytest
from conftest import DATA, SHARED, TINY_ARCH, TINY_HEADS, TINY_INPUT, require, zeros_png

from sapiens2.cli import main

PHOTO = DATA / "astronaut.png"


def model_flags(tiny_checkpoints, tasks):
    return [f"--model={task}={tiny_checkpoints[task]}" for task in tasks]


def run(tiny_checkpoints, tasks, inputs, out, *extra, input_size=(64, 48)):
    argv = [
        "predict",
        "--task",
        ",".join(tasks),
        *[str(i) for i in inputs],
        "-o",
        str(out),
        "--device",
        "cpu",
        "--input-size",
        *map(str, input_size),
        *model_flags(tiny_checkpoints, tasks),
        *extra,
    ]
    return main(argv)


def leftovers(folder):
    return [p for p in folder.rglob("*") if ".tmp" in p.name or p.name.startswith(".")]


def test_dense_tasks_write_their_files_for_a_real_photo(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "out"
    code = run(tiny_checkpoints, ["seg", "normal", "albedo", "matting"], [PHOTO], out, "--save-npy")
    assert code == 0, capsys.readouterr().err
    labels = cv2.imread(str(out / "astronaut_seg.png"), cv2.IMREAD_UNCHANGED)
    assert labels.shape == (512, 512) and labels.dtype == np.uint8 and labels.max() < 29
    assert np.load(out / "astronaut_seg.npy").shape == (512, 512)
    assert np.load(out / "astronaut_normal.npy").shape == (512, 512, 3)
    assert cv2.imread(str(out / "astronaut_albedo.png")).shape == (512, 512, 3)
    rgba = cv2.imread(str(out / "astronaut_cutout.png"), cv2.IMREAD_UNCHANGED)
    assert rgba.shape == (512, 512, 4)
    assert cv2.imread(str(out / "astronaut_alpha.png"), cv2.IMREAD_UNCHANGED).shape[:2] == (512, 512)
    written = {p.name for p in out.iterdir()}
    assert any(name.startswith("astronaut_seg_overlay") for name in written)
    assert not leftovers(out)
    summary = capsys.readouterr().out
    assert "1 images" in summary and "seg: ms/image" in summary


def test_pointmap_writes_points_depth_ply_and_focal(tiny_checkpoints, tmp_path):
    out = tmp_path / "out"
    assert run(tiny_checkpoints, ["pointmap"], [PHOTO], out, input_size=TINY_INPUT["pointmap"]) == 0
    points = np.load(out / "astronaut_pointmap.npy")
    assert points.shape == (512, 512, 3) and points.dtype == np.float32
    assert np.load(out / "astronaut_depth.npy").shape == (512, 512)
    header = (out / "astronaut.ply").read_bytes()[:300].decode("ascii", "replace")
    assert header.startswith("ply") and "element vertex" in header
    focal = json.loads((out / "astronaut_focal.json").read_text())
    assert focal["focal_length_px"] is None or focal["focal_length_px"] > 0
    assert focal["path"] == str(PHOTO)  # the source image, not null


def test_mask_from_seg_blanks_the_background(tiny_checkpoints, tmp_path):
    out = tmp_path / "out"
    assert (
        run(tiny_checkpoints, ["normal"], [PHOTO], out, "--mask-from", "seg", f"--model=seg={tiny_checkpoints['seg']}")
        == 0
    )
    labels = cv2.imread(str(out / "astronaut_seg.png"), cv2.IMREAD_UNCHANGED)
    normals = np.load(out / "astronaut_normal.npy")
    background = labels == 0
    assert background.any()
    blanked = ~np.isfinite(normals[background]).all(axis=-1) | (normals[background] == 0).all(axis=-1)
    assert blanked.all()


def make_bad_folder(root):
    """A folder of good and bad inputs, nested, as users have them."""
    (root / "day1" / "sub").mkdir(parents=True)
    shutil.copy(PHOTO, root / "day1" / "good.png")
    image = cv2.imread(str(PHOTO))
    cv2.imwrite(str(root / "day1" / "sub" / "gray.jpg"), cv2.cvtColor(image, cv2.COLOR_BGR2GRAY))
    cv2.imwrite(str(root / "rgba.png"), cv2.cvtColor(image, cv2.COLOR_BGR2BGRA))
    cv2.imwrite(str(root / "deep16.png"), image.astype(np.uint16) * 257)
    cv2.imwrite(str(root / "tiny.png"), image[:3, :2])
    (root / "notes.txt").write_text("not an image, not picked up from a folder")
    (root / "fake.jpg").write_text("a text file with an image name")
    (root / "empty.png").write_bytes(b"")
    data = (root / "day1" / "good.png").read_bytes()
    (root / "truncated.png").write_bytes(data[: len(data) // 2])


def test_bad_inputs_cost_one_line_each_and_the_run_goes_on(tiny_checkpoints, tmp_path, capsys):
    make_bad_folder(tmp_path / "in")
    out = tmp_path / "out"
    code = run(tiny_checkpoints, ["seg"], [tmp_path / "in", tmp_path / "missing.jpg"], out)
    captured = capsys.readouterr()
    assert code == 1
    errors = [line for line in captured.err.splitlines() if line.startswith("sapiens2 predict: error:")]
    assert len(errors) == 4, captured.err
    for name in ("fake.jpg", "empty.png", "truncated.png", "missing.jpg"):
        assert sum(name in line for line in errors) == 1
    for stem in ("day1/good", "day1/sub/gray", "rgba", "deep16", "tiny"):  # mirrored layout
        assert (out / f"{stem}_seg.png").exists(), stem
    assert not (out / "fake_seg.png").exists() and not leftovers(out)
    assert "4 inputs failed" in captured.out


def test_skip_existing_resumes_only_what_is_missing(tiny_checkpoints, tmp_path, capsys):
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("a.png", "b.png", "c.png"):
        shutil.copy(PHOTO, inputs / name)
    out = tmp_path / "out"
    assert run(tiny_checkpoints, ["seg"], [inputs], out) == 0
    (out / "b_seg.png").unlink()
    before = (out / "a_seg.png").stat().st_mtime_ns
    capsys.readouterr()
    assert run(tiny_checkpoints, ["seg"], [inputs], out, "--skip-existing") == 0
    assert (out / "b_seg.png").exists() and (out / "a_seg.png").stat().st_mtime_ns == before
    assert "2 images skipped" in capsys.readouterr().out


def test_skip_existing_redoes_outputs_that_another_input_or_an_edit_now_claims(tiny_checkpoints, tmp_path, capsys):
    """``--skip-existing`` skips an output only when it was written from the same bytes (``_bulk/sources.jsonl``),
    as bulk mode's ledger does. Here ``b.jpg`` arrives beside ``b.png``: sorted first, it takes the name ``b`` (and
    ``b.png`` becomes ``b_png``), so ``b_seg.png`` exists but holds ``b.png``'s labels; and ``c.png`` is edited in
    place. Both are done again; ``a.png``, unchanged, is skipped."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    photo, camera = cv2.imread(str(PHOTO)), cv2.imread(str(DATA / "camera.png"))
    for name, image in (("a.png", photo), ("b.png", photo), ("c.png", photo)):
        cv2.imwrite(str(inputs / name), image)
    out = tmp_path / "out"
    assert run(tiny_checkpoints, ["seg"], [inputs], out) == 0
    stamp = (out / "a_seg.png").stat().st_mtime_ns
    cv2.imwrite(str(inputs / "b.jpg"), camera)  # a different picture that now owns the name b
    cv2.imwrite(str(inputs / "c.png"), camera[:, ::-1])  # an edit of c.png
    capsys.readouterr()
    assert run(tiny_checkpoints, ["seg"], [inputs], out, "--skip-existing") == 0
    printed = capsys.readouterr().out
    assert "1 images skipped" in printed and "2 images done again" in printed, printed
    fresh = tmp_path / "fresh"  # what a run into an empty folder writes for the same inputs
    assert run(tiny_checkpoints, ["seg"], [inputs], fresh) == 0
    for stem in ("a", "b", "b_png", "c"):
        got, expected = (cv2.imread(str(folder / f"{stem}_seg.png"), cv2.IMREAD_UNCHANGED) for folder in (out, fresh))
        assert np.array_equal(got, expected), stem
    assert (out / "a_seg.png").stat().st_mtime_ns == stamp
    capsys.readouterr()
    assert run(tiny_checkpoints, ["seg"], [inputs], out, "--skip-existing") == 0
    assert "4 images skipped" in capsys.readouterr().out  # now every output is recorded with its input


@pytest.mark.slow  # 8-15 s: the default suite stays under 10 minutes
def test_a_run_killed_mid_write_leaves_no_temporary_after_the_next_run(tiny_checkpoints, tmp_path):
    """``sapiens2 predict`` killed with SIGKILL while it writes an output leaves that write's temporary file beside
    the outputs (``.<name>.<hex>.tmp<suffix>``); the next run into the folder removes it."""
    import signal
    import time

    inputs = tmp_path / "in"
    inputs.mkdir()
    big = cv2.resize(cv2.imread(str(PHOTO)), (3000, 2250))  # _normal.npy: 81 MB, written and fsync'd
    for index in range(6):
        cv2.imwrite(str(inputs / f"{index}.png"), np.roll(big, index * 50, axis=1))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "sapiens2", "predict", "--task", "normal", str(inputs), "-o", str(out),
               "--device", "cpu", "--input-size", "64", "48", f"--model={tiny_checkpoints['normal']}"]  # fmt: skip
    for _ in range(3):  # a write caught in the act: seen, then killed before its rename (almost always the first)
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 240
            while process.poll() is None and time.monotonic() < deadline and not leftovers(out):
                time.sleep(0.002)
            process.send_signal(signal.SIGKILL)
        finally:
            process.kill()
            process.wait(timeout=60)
        if leftovers(out):
            break
    assert leftovers(out), "no write was caught in the act"
    assert run(tiny_checkpoints, ["normal"], [inputs], out, "--skip-existing") == 0
    assert not leftovers(out)
    assert sorted(p.name for p in out.glob("*_normal.npy")) == [f"{index}_normal.npy" for index in range(6)]


def test_a_run_does_not_remove_the_temporaries_of_a_run_still_writing(tiny_checkpoints, tmp_path):
    """The output folder's lock (``bulk.ledger.output_lease``): while another run holds it, a new run leaves the
    temporary files there alone (they are that run's writes in progress); once it is gone they are removed."""
    from sapiens2.bulk.ledger import output_lease

    out = tmp_path / "out"
    planted = out / f".astronaut_seg.png.{'ab' * 6}.tmp.png"
    out.mkdir()
    planted.write_bytes(b"half a PNG")
    with output_lease(out, lambda: None):  # a run in progress (another open file: flock sees two holders)
        assert run(tiny_checkpoints, ["seg"], [PHOTO], out) == 0
        assert planted.exists()
    assert run(tiny_checkpoints, ["seg"], [PHOTO], out) == 0
    assert not planted.exists() and not leftovers(out)


def group_photo(path):
    """Three people side by side (flipped and scaled copies), as the detector fixture does."""
    image = cv2.imread(str(PHOTO))
    small = cv2.resize(image, (256, 256))
    canvas = np.zeros((512, 1280, 3), np.uint8)
    canvas[:, :512] = image
    canvas[:, 512:1024] = image[:, ::-1]
    canvas[128:384, 1024:1280] = small
    cv2.imwrite(str(path), canvas)
    return [[40, 20, 480, 510, 0.9], [552, 20, 990, 510, 0.8], [1030, 130, 1270, 380, 0.7]]


def test_pose_with_boxes_file_writes_json_picture_and_coco_results(tiny_checkpoints, tmp_path, capsys):
    boxes = group_photo(tmp_path / "group.png")
    coco_boxes = {
        "images": [{"id": 7, "file_name": "group.png"}],
        "annotations": [{"image_id": 7, "bbox": [x1, y1, x2 - x1, y2 - y1], "score": s} for x1, y1, x2, y2, s in boxes],
    }
    (tmp_path / "boxes.json").write_text(json.dumps(coco_boxes))
    out = tmp_path / "out"
    code = run(
        tiny_checkpoints, ["pose"], [tmp_path / "group.png"], out, "--boxes", str(tmp_path / "boxes.json"),
        "--keypoint-format", "coco17", "--coco-results", str(out / "results.json"),
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    pose = json.loads((out / "group_pose.json").read_text())
    assert pose["path"] == str(tmp_path / "group.png")  # the source image, not null
    text = json.dumps(pose)
    assert "left_shoulder" in text
    people = pose.get("people") or pose.get("instances") or pose.get("persons")
    assert people is not None and len(people) == 3
    assert any(p.name.startswith("group_pose.") and p.suffix in (".jpg", ".png") for p in out.iterdir())
    results = json.loads((out / "results.json").read_text())
    annotations = results["annotations"] if isinstance(results, dict) else results
    assert len(annotations) == 3 and all(len(a["keypoints"]) == 17 * 3 for a in annotations)


DETECTOR = SHARED / "fixtures" / "detector" / "rtmdet_m_random_mmengine.pth"


def test_pose_runs_the_person_detector_from_a_local_checkpoint(tiny_checkpoints, tmp_path, capsys):
    require(DETECTOR)
    group_photo(tmp_path / "group.png")
    out = tmp_path / "out"
    code = run(tiny_checkpoints, ["pose"], [tmp_path / "group.png"], out, "--detector", str(DETECTOR))
    assert code == 0, capsys.readouterr().err
    assert (out / "group_pose.json").exists()


def test_console_script_predict_end_to_end(tiny_checkpoints, tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "sapiens2", "predict", "--task", "seg", str(PHOTO), "-o", str(out),
               "--device", "cpu", "--input-size", "64", "48", f"--model={tiny_checkpoints['seg']}"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (out / "astronaut_seg.png").exists()


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main(["predict", "--task", "segm", str(PHOTO), "-o", str(tmp_path)]) == 2
    assert "did you mean 'seg'" in capsys.readouterr().err.lower()


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_cuda_device_without_cuda_is_refused_with_the_cli_option(tiny_checkpoints, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["predict", "--task", "seg", str(PHOTO), "-o", str(tmp_path / "out"), "--device", "cuda",
            "--input-size", "64", "48", f"--model={tiny_checkpoints['seg']}"]  # fmt: skip
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--device cpu" in line and "device='cpu'" not in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("size", [(100, 75), (1024, 8), (0, 768)])
def test_input_size_must_be_multiples_of_the_patch_size(size, tiny_checkpoints, tmp_path, capsys):
    assert run(tiny_checkpoints, ["seg"], [PHOTO], tmp_path / "out", input_size=size) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"sapiens2 predict: error: --input-size {size[0]} {size[1]}"), line
    assert "multiples of 16" in line, line
    assert not (tmp_path / "out").exists()


def test_input_size_is_documented_in_the_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--help"])
    assert exit_info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--input-size H W" in help_text and "multiples of 16" in help_text and "1024 768" in help_text


def test_pointmap_input_size_that_the_scale_head_cannot_take_is_refused_naming_the_option(
    tiny_checkpoints, tmp_path, capsys
):
    # The tiny pointmap head was built for 256x192: its scale MLP takes a 2x2 grid of 128-pixel cells.
    assert run(tiny_checkpoints, ["pointmap"], [PHOTO], tmp_path / "out", input_size=(64, 48)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("sapiens2 predict: error: --input-size 64 48") and "--input-size 256 192" in line, line
    assert not (tmp_path / "out").exists()


def test_4k_models_need_multiples_of_the_tokenizer_window(tmp_path, capsys):
    import torch
    from safetensors.torch import save_file

    from sapiens2 import build_model
    from sapiens2.models.zoo import get_arch

    torch.manual_seed(0)
    arch = dataclasses.replace(get_arch(TINY_ARCH | {"num_tokenizer_layers": 1}), use_tokenizer=True)
    model = build_model("seg", arch, input_size=(128, 128), **TINY_HEADS["seg"])
    assert model.backbone.tokenizer is not None
    path = tmp_path / "tiny_4k_seg.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    argv = ["predict", "--task", "seg", str(PHOTO), "-o", str(tmp_path / "out"), "--device", "cpu",
            "--input-size", "128", "80", f"--model={path}"]  # fmt: skip
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("sapiens2 predict: error: --input-size 128 80") and "multiples of 64" in line, line
    argv[-2:-1] = ["64"]
    assert main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "astronaut_seg.png").exists()


def offline_env(tmp_path):
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty_hf_home"), "OMP_NUM_THREADS": "1"}


def test_offline_person_detector_failure_names_the_detector_option(tiny_checkpoints, tmp_path):
    command = [sys.executable, "-m", "sapiens2", "predict", "--task", "pose", str(PHOTO), "-o", str(tmp_path / "out"),
               "--device", "cpu", "--input-size", "64", "48", f"--model={tiny_checkpoints['pose']}"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=offline_env(tmp_path))
    assert result.returncode != 0
    line = one_error_line(result.stderr)
    assert "rtmdet_m.pth" in line and "HF_HUB_OFFLINE" in line, line
    assert "--detector /path/to/rtmdet_m.pth" in line and "--detector none" in line, line
    assert "from_checkpoint" not in line and "None" not in line, line


def test_sample_predicts_on_the_packaged_photo(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["predict", "--task", "pose,seg", "--sample", "-o", str(out), "--device", "cpu", "--detector", "none",
            "--input-size", "64", "48", *model_flags(tiny_checkpoints, ["pose", "seg"])]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    from sapiens2.predict.run import SAMPLE_IMAGE

    assert SAMPLE_IMAGE.is_file() and SAMPLE_IMAGE.parent.name == "assets"
    stem = SAMPLE_IMAGE.stem
    pose = json.loads((out / f"{stem}_pose.json").read_text())
    assert pose["path"] == str(SAMPLE_IMAGE) and len(pose["instances"] if "instances" in pose else pose["people"]) == 1
    labels = cv2.imread(str(out / f"{stem}_seg.png"), cv2.IMREAD_UNCHANGED)
    assert labels.shape == cv2.imread(str(SAMPLE_IMAGE)).shape[:2]
    assert "1 images" in capsys.readouterr().out


def test_predict_needs_inputs_or_sample(tmp_path, capsys):
    assert main(["predict", "--task", "seg", "-o", str(tmp_path / "out")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "INPUT" in line and "--sample" in line, line


def test_sample_offline_fails_in_one_line_naming_the_model_option(tmp_path):
    command = [sys.executable, "-m", "sapiens2", "predict", "--task", "seg", "--sample", "-o", str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=offline_env(tmp_path))
    assert result.returncode != 0
    line = one_error_line(result.stderr)
    assert "facebook/sapiens2-seg-1b" in line and "HF_HUB_OFFLINE" in line, line
    assert "--model seg=/path/to/sapiens2_1b_seg.safetensors" in line, line
    assert "load_backbone" not in line and not (tmp_path / "out").exists(), line


def test_flags_parse_into_predict_options_and_predict_files_writes_what_the_cli_writes(tiny_checkpoints, tmp_path):
    from sapiens2 import PredictOptions, predict_files
    from sapiens2.cli import build_parser
    from sapiens2.cli.predict import options_from_args

    argv = ["predict", "--task", "seg, normal,seg", str(PHOTO), "-o", str(tmp_path / "cli"), "--model", "0.4b",
            "--model", "seg=a.safetensors", "--input-size", "64", "48", "--no-recursive", "--no-flip-test"]  # fmt: skip
    options = options_from_args(build_parser().parse_args(argv))
    assert options.tasks == ("seg", "normal", "seg") and options.inputs == (str(PHOTO),)
    assert options.model == "0.4b" and options.models == {"seg": "a.safetensors"}
    assert options.input_size == (64, 48) and not options.recursive and not options.flip_test
    assert run(tiny_checkpoints, ["seg", "normal"], [PHOTO], tmp_path / "cli") == 0
    models = {task: tiny_checkpoints[task] for task in ("seg", "normal")}
    api = PredictOptions(tasks=["seg", "normal"], inputs=[PHOTO], output=tmp_path / "api", models=models,
                         device="cpu", input_size=(64, 48))  # fmt: skip
    assert predict_files(api) == 0
    written = sorted(p.relative_to(tmp_path / "cli") for p in (tmp_path / "cli").rglob("*"))
    assert written == sorted(p.relative_to(tmp_path / "api") for p in (tmp_path / "api").rglob("*"))
    labels = [cv2.imread(str(tmp_path / side / "astronaut_seg.png"), cv2.IMREAD_UNCHANGED) for side in ("cli", "api")]
    assert np.array_equal(*labels)


def test_predict_files_names_python_options_in_its_messages(tmp_path, capsys):
    from sapiens2 import PredictOptions, predict_files

    assert predict_files(PredictOptions(tasks=["seg"], output=tmp_path, input_size=(100, 50), sample=True)) == 2
    err = capsys.readouterr().err  # from Python, no command: the package's name
    assert err.startswith("sapiens2: error: input_size=(100, 50): height and width must be multiples of 16"), err
    assert predict_files(PredictOptions(tasks=["seg"], output=tmp_path, batch_size=0, sample=True)) == 2
    assert capsys.readouterr().err == "sapiens2: error: batch_size must be >= 1\n"


@pytest.mark.parametrize(
    "boxes, message",
    [
        ({"a.png": [[1, 2, 3]]}, "box 0 of 'a.png' must be [x1, y1, x2, y2] or [x1, y1, x2, y2, score]"),
        ({"a.png": [[1, 2, 3, 4], [1, 2, 3, 4, 5, 6]]}, "box 1 of 'a.png' must be [x1, y1, x2, y2] or"),
        ({"a.png": [1, 2, 3, 4]}, "'a.png' must be a list of boxes [[x1, y1, x2, y2(, score)], ...], got [1, 2, 3, 4]"),
        ({"a.png": [["x", 2, 3, 4]]}, 'got ["x", 2, 3, 4]'),
        ({"a.png": [[1, 2, float("nan"), 4]]}, "(finite numbers, pixels), got [1, 2, NaN, 4]"),
        ({"images": [{"id": 1, "file_name": "a.png"}], "annotations": [{"image_id": 1, "bbox": [1, 2, 3]}]},
         "annotation 0 bbox must be [x, y, width, height]"),
    ],
)  # fmt: skip
def test_boxes_of_the_wrong_shape_are_one_line_naming_the_file(tmp_path, capsys, boxes, message):
    path = tmp_path / "boxes.json"
    path.write_text(json.dumps(boxes))
    argv = ["predict", "--task", "pose", str(PHOTO), "-o", str(tmp_path / "out"), "--boxes", str(path)]
    assert main([*argv, "--model", str(tmp_path / "no_model.safetensors")]) == 2  # refused before any model
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error, error
    assert error.startswith(f"sapiens2 predict: error: boxes file {path}: "), error


def test_pixel_bomb_is_refused_from_its_header_and_its_batch_goes_on(tiny_checkpoints, tmp_path, capsys):
    # The file: a 3 MB PNG of 32768x32000 RGB pixels (6 GB once decoded), in one batch with a photo.
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "bomb.png").write_bytes(zeros_png(32768, 32000, channels=3))
    shutil.copy(PHOTO, folder / "photo.png")
    out = tmp_path / "out"
    assert run(tiny_checkpoints, ["seg"], [folder], out, "--batch-size", "2") == 1
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert "bomb.png" in line and "32768x32000 pixels (1048.6 megapixels)" in line, line
    assert line.endswith("over the limit of 200 megapixels; raise the limit with --max-megapixels 1100"), line
    assert (out / "photo_seg.png").is_file() and not (out / "bomb_seg.png").exists()
    assert "1 images" in captured.out and "1 inputs failed" in captured.out
    # The limit is a flag; below a photo's size it refuses that too, in the flag's words.
    assert run(tiny_checkpoints, ["seg"], [PHOTO], tmp_path / "small", "--max-megapixels", "0.1") == 1
    assert "0.3 megapixels) is over the limit of 0.1 megapixels" in one_error_line(capsys.readouterr().err)
    with pytest.raises(SystemExit) as exited:
        run(tiny_checkpoints, ["seg"], [PHOTO], tmp_path / "small", "--max-megapixels", "0")
    assert exited.value.code == 2 and "--max-megapixels: must be a number > 0" in capsys.readouterr().err
    # NaN is no limit; infinity is (no limit) but no frame rate.
    for flag, value, problem in (("--max-megapixels", "nan", "a number > 0"), ("--fps", "inf", "a finite number > 0")):
        with pytest.raises(SystemExit) as exited:
            run(tiny_checkpoints, ["seg"], [PHOTO], tmp_path / "small", flag, value)
        assert exited.value.code == 2 and f"{flag}: must be {problem}, got {value!r}" in capsys.readouterr().err


_OUT_OF_MEMORY_RUN = """
import re, resource, sys
from pathlib import Path
from sapiens2.predict import PredictOptions, predict_files

photo, big, model, out = sys.argv[1:5]
def options(inputs, folder):
    return PredictOptions(tasks=["normal"], inputs=inputs, output=folder, models={"normal": model}, device="cpu",
                          input_size=(64, 48), batch_size=2)
assert predict_files(options([photo], Path(out) / "warm-up")) == 0
# Address space for what this process has used so far plus 160 MB: enough to read the 16-megapixel image (96 MB),
# not for its full-resolution normals (several 192 MB float32 arrays).
peak = int(re.search(r"VmPeak:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024
resource.setrlimit(resource.RLIMIT_AS, (peak + (160 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
sys.exit(predict_files(options([photo, big], Path(out) / "run")))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="address-space limit and /proc/self/status")
def test_an_image_that_exhausts_memory_fails_alone_not_its_whole_batch(tiny_checkpoints, tmp_path):
    (tmp_path / "big.png").write_bytes(zeros_png(4000, 4000))  # 16 megapixels: within --max-megapixels
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", _OUT_OF_MEMORY_RUN, str(PHOTO), str(tmp_path / "big.png"),
               str(tiny_checkpoints["normal"]), str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 1, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("sapiens2: error:")]
    assert len(errors) == 1 and "big.png: normal failed" in errors[0], result.stderr[-2000:]
    assert "allocate" in errors[0]
    assert (tmp_path / "run" / "astronaut_normal.npy").is_file(), "the photo of the same batch was blamed too"
    assert not (tmp_path / "run" / "big_normal.npy").exists()


def test_predictor_takes_the_detector_as_the_cli_does(tiny_checkpoints, tmp_path):
    from sapiens2 import Predictor

    for none in ("none", "None", None):  # the CLI's word and Python's value: no detector, the whole image
        predictor = Predictor("pose", tiny_checkpoints["pose"], detector=none, device="cpu", input_size=(64, 48))
        assert predictor.detector is None
    with pytest.raises(FileNotFoundError) as error:
        Predictor("pose", tiny_checkpoints["pose"], detector=tmp_path / "rtmdet_m.pth", device="cpu")
    message = str(error.value)
    assert message.startswith("detector=") and "no such file" in message and "'none'" in message, message
    assert "checkpoint not found: none" not in message and "to download it" not in message


def test_predictor_refuses_non_finite_boxes_in_one_line(tiny_checkpoints):
    from sapiens2 import Predictor

    pose = Predictor("pose", tiny_checkpoints["pose"], device="cpu", input_size=(64, 48), detector=None)
    image = np.zeros((40, 30, 3), np.uint8)
    with pytest.raises(ValueError, match=r"boxes must be finite numbers; box 1 is \[0.0, 0.0, nan, 20.0\]"):
        pose(image, boxes=[[0, 0, 10, 20], [0, 0, float("nan"), 20]])
    with pytest.raises(ValueError, match=r"boxes must be \(N, 4\) xyxy or \(N, 5\) xyxy\+score, got shape \(1, 3\)"):
        pose(image, boxes=[[0, 0, 10]])
