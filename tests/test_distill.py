"""``sapiens2 distill``: the student archs in the loader and benchmark, stored teacher outputs, pairs that cannot
work (one line each through the CLI), a tiny trained teacher distilled into a smaller student on synthetic images
(agreement rises from chance to >= 0.8 on held-out images), and a SIGKILLed run that resumes bit for bit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SHARED, require
from distill_synth import (
    POSE_STUDENT_HEAD,
    SEG_STUDENT_HEAD,
    SIZE,
    STUDENT,
    dots,
    train_pose_teacher,
    train_seg_teacher,
    write_images,
)
from safetensors.torch import load_file, save_file

from sapiens2 import build_model, load_model
from sapiens2.cli import main
from sapiens2.distill import distill, load_distill_config
from sapiens2.distill.targets import decode_targets, encode_targets
from sapiens2.train.trainer import find_checkpoints

REPO = Path(__file__).resolve().parents[1]
STUDENT_SET = ("--set", "model.arch={embed_dims: 16, num_layers: 2, num_heads: 2, feedforward_channels: 32, "
               "num_tokenizer_layers: 0}")  # fmt: skip
POSE_HEAD_SET = ("--set", "model.head={deconv_out_channels: [8, 8], deconv_kernel_sizes: [4, 4], conv_out_channels: "
                 "[8], conv_kernel_sizes: [1]}")  # fmt: skip


def fast_values(out: Path, **extra) -> dict:
    """A CPU distillation that takes seconds: fp32, no bar, no evaluation."""
    values = {
        "output_dir": str(out), "precision": "fp32", "log_every": 2, "eval_every": 0, "progress_bar": False,
        "device": "cpu", "optimizer": {"lr": 3e-3}, "schedule": {"warmup_steps": 1},
        "data": {"input_size": list(SIZE), "batch_size": 4, "num_workers": 0},
    }  # fmt: skip
    for key, value in extra.items():
        values[key] = values.get(key, {}) | value if isinstance(value, dict) else value
    return values


@pytest.mark.parametrize("student", [pytest.param("sapiens2_student_20m", marks=pytest.mark.slow), "student_5m"])
def test_student_arch_files_load_by_shape_and_benchmark_by_name(student, tmp_path, capsys):
    model = build_model("seg", student, input_size=(64, 48))
    path = tmp_path / "student.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    loaded = load_model("seg", path)
    assert loaded.backbone.arch.name == model.backbone.arch.name  # the table names the file's arch
    x = torch.randn(1, 3, 64, 48)
    with torch.inference_mode():
        assert torch.equal(loaded(x), model.eval()(x))
    argv = ["benchmark", "--task", "seg", "--model", student, "--input-size", "64", "48", "--iters", "1"]
    assert main([*argv, "--warmup", "0"]) == 0
    assert "sapiens2_student" in capsys.readouterr().out


def test_stored_outputs_round_trip_within_quantisation_and_their_size(tmp_path):
    torch.manual_seed(0)
    image = np.random.default_rng(0).integers(0, 255, (128, 96, 3), dtype=np.uint8)
    outputs = {"output": torch.randn(29, 128, 96) * 5, "features": torch.randn(48, 32)}
    for store, bound in (("uint8", None), ("fp16", 1e-2)):
        data = encode_targets(image[None], {k: v[None] for k, v in outputs.items()}, store)
        back = decode_targets(data)
        assert np.array_equal(back["image"][0].numpy(), image)
        error = (back["teacher"][0] - outputs["output"]).abs().amax(dim=(1, 2))
        span = outputs["output"].amax(dim=(1, 2)) - outputs["output"].amin(dim=(1, 2))
        assert bool((error <= (span / 510 * 1.001 if bound is None else bound)).all())
        values = 29 * 128 * 96 * (1 if store == "uint8" else 2) + image.size + 48 * 32 * 2
        assert values < len(data) < values + 1024  # the header is all that is added


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return write_images(tmp_path_factory.mktemp("scenes") / "images", 8, seed=3)


def test_pairs_that_cannot_work_get_one_line_each_and_leave_nothing(images, tiny_checkpoints, tmp_path, capsys):
    common = [str(images), "--steps", "2", "--device", "cpu", "--input-size", "64", "48"]
    common += ["--set", "schedule.warmup_steps=1", "--set", "data.num_workers=0", "--set", "precision=fp32"]
    cases = [
        (["--task", "seg", "--teacher", str(tiny_checkpoints["pose"]), *STUDENT_SET],
         "is a pose model but the student learns seg"),
        (["--task", "seg", "--teacher", str(tiny_checkpoints["seg"]), "--student", "student_5m"],
         "is bigger than its teacher"),
        (["--task", "pose", "--teacher", str(tiny_checkpoints["pose"]), *STUDENT_SET, *POSE_HEAD_SET,
          "--set", "model.head.out_channels=17", "--detector", "none"],
         "predicts 308 keypoints but the student 17"),
    ]  # fmt: skip
    for index, (argv, message) in enumerate(cases):
        out = tmp_path / f"run{index}"
        assert main(["distill", *common, "-o", str(out), *argv]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("sapiens2 distill: error: ") and message in lines[0], lines
        assert not out.exists()  # refused before the teacher computed anything
    # The negative control: the same student with the teacher's 308 keypoints is accepted and runs.
    out = tmp_path / "good"
    argv = ["--task", "pose", "--teacher", str(tiny_checkpoints["pose"]), *STUDENT_SET, *POSE_HEAD_SET,
            "--detector", "none"]  # fmt: skip
    assert main(["distill", *common, "-o", str(out), *argv, "--batch-size", "2", "--holdout", "0.25"]) == 0
    report = json.loads((out / "agreement.json").read_text())
    assert report["task"] == "pose" and 0 <= report["after"]["pck@0.05"] <= 1
    assert load_model("pose", out / "model.safetensors").decode_head.conv_pose.out_channels == 308


@pytest.mark.parametrize("task", ["seg", "pose", "normal", "pointmap", "albedo", "matting"])
def test_every_task_distils_from_stored_outputs_into_a_loadable_student(task, images, tiny_checkpoints, tmp_path):
    from conftest import TINY_HEADS, TINY_INPUT

    size = list(TINY_INPUT.get(task, (64, 48)))
    section = {"teacher": str(tiny_checkpoints[task]), "images": [str(images)], "store": "fp16", "detector": "none"}
    values = fast_values(tmp_path / task, task=task, steps=2, model={"arch": STUDENT, "head": TINY_HEADS[task]},
                         distill=section)  # fmt: skip
    values["data"]["input_size"] = size
    summary = distill(load_distill_config(None, values=values))
    after = summary["agreement"]["after"]
    assert after["images"] == 1 and all(np.isfinite(v) for v in after.values()), after
    assert len(list((tmp_path / task / "teacher").glob("*.teacher.safetensors"))) == 8
    student = load_model(task, summary["model"])
    assert student.backbone.arch.embed_dims == STUDENT["embed_dims"]


def test_online_distillation_trains_without_storing_and_writes_the_table(images, tiny_checkpoints, tmp_path):
    values = fast_values(tmp_path / "online", task="normal", steps=3, model={"arch": STUDENT, "head": {
        "upsample_channels": [8, 8, 8, 8], "conv_out_channels": [8], "conv_kernel_sizes": [3]}},
        distill={"teacher": str(tiny_checkpoints["normal"]), "images": [str(images)], "online": True,
                 "feature_loss": 0.5})  # fmt: skip
    values["data"]["input_size"] = [64, 48]
    summary = distill(load_distill_config(None, values=values))
    assert not (tmp_path / "online" / "teacher").exists()
    assert summary["agreement"]["after"]["angular_error_deg"] >= 0
    names = set(load_file(str(summary["model"])))
    assert names and not any(name.startswith("feature_projection.") for name in names)


@pytest.mark.slow
def test_seg_student_agreement_with_a_trained_teacher_rises_from_chance_to_over_0_8(tmp_path):
    teacher = train_seg_teacher(tmp_path / "teacher")
    images = write_images(tmp_path / "images", 64, seed=1)
    values = fast_values(tmp_path / "student", task="seg", steps=500, checkpoint_every=0, optimizer={"lr": 6e-3},
                         model={"arch": STUDENT, "head": SEG_STUDENT_HEAD}, data={"batch_size": 8},
                         distill={"teacher": str(teacher), "images": [str(images)], "holdout": 0.25,
                                  "teacher_batch_size": 8})  # fmt: skip
    summary = distill(load_distill_config(None, values=values))
    before, after = summary["agreement"]["before"], summary["agreement"]["after"]
    # The teacher's outputs depend on the image: its argmax on the held-out images is not one class.
    labels = torch.cat([item["teacher"].argmax(0).flatten() for item in _held_out(tmp_path / "student")])
    assert labels.bincount(minlength=4).max() / labels.numel() < 0.6
    assert before["pixel_agreement"] < 0.4  # chance (4 classes) for the student at its initial weights
    assert after["pixel_agreement"] >= 0.8, after
    print(f"seg agreement on {int(after['images'])} held-out images: {before['pixel_agreement']:.4f} -> "
          f"{after['pixel_agreement']:.4f} (mIoU {before['mIoU']} -> {after['mIoU']})")  # fmt: skip


@pytest.mark.slow
def test_pose_student_agreement_with_a_trained_teacher_rises_from_chance_to_over_0_8(tmp_path):
    teacher = train_pose_teacher(tmp_path / "teacher")
    images = write_images(tmp_path / "images", 384, seed=1, draw=dots)
    values = fast_values(tmp_path / "student", task="pose", steps=6000, checkpoint_every=0, log_every=100,
                         optimizer={"lr": 6e-3}, model={"arch": STUDENT, "head": POSE_STUDENT_HEAD},
                         data={"batch_size": 8}, distill={"teacher": str(teacher), "images": [str(images)],
                                                          "holdout": 0.25, "teacher_batch_size": 8,
                                                          "detector": "none"})  # fmt: skip
    summary = distill(load_distill_config(None, values=values))
    before, after = summary["agreement"]["before"], summary["agreement"]["after"]
    # The teacher's outputs depend on the image: each keypoint's heatmap peak moves from image to image.
    heatmaps = torch.stack([item["teacher"] for item in _held_out(tmp_path / "student")])  # (N, 4, h, w)
    peaks = heatmaps.flatten(2).argmax(dim=2)  # (N, 4)
    # (The whole-image box's crop pads by 1.25: the discs lie in the middle 80 % of each side.)
    assert all(len(set(peaks[:, k].tolist())) > len(peaks) // 3 for k in range(peaks.shape[1]))
    assert before["pck@0.05"] < 0.1  # chance for the student at its initial weights
    assert after["pck@0.05"] >= 0.8, after
    # End to end through Predictor (flip test, decoding to image pixels): the student follows the teacher there too.
    assert after["image_pck@0.05"] > before["image_pck@0.05"] and after["image_error"] < before["image_error"]
    print(f"pose agreement on {int(after['images'])} held-out images: PCK@0.05 {before['pck@0.05']:.4f} -> "
          f"{after['pck@0.05']:.4f}; through Predictor {before['image_pck@0.05']:.4f} -> "
          f"{after['image_pck@0.05']:.4f} (error {before['image_error']:.4f} -> "
          f"{after['image_error']:.4f})")  # fmt: skip


def _held_out(run: Path) -> list[dict]:
    from sapiens2.distill.targets import TargetDataset, stored_items
    from sapiens2.distill.trainer import split_holdout

    items = [(path, 0) for _, path in stored_items(run / "teacher")]  # one sample each (pose: --detector none)
    _, held = split_holdout(len(items), 0.25, 0)
    return list(TargetDataset([items[i] for i in held]))


@pytest.mark.slow
@pytest.mark.parametrize("task", ["seg", "pose"])
def test_sigkilled_distillation_resumes_to_bit_identical_weights(task, images, tiny_checkpoints, tmp_path):
    """Pose: every person the (random-weight) detector finds in the scenes is a sample, several per image."""
    if task == "seg":
        head = ("--set", "model.head={deconv_out_channels: [8, 8, 8, 8], deconv_kernel_sizes: [4, 4, 4, 4], "
                "conv_out_channels: [8], conv_kernel_sizes: [1]}")  # fmt: skip
    else:
        head = (*POSE_HEAD_SET, "--detector", str(require(SHARED / "fixtures/detector/rtmdet_m_random_mmengine.pth")))
    argv = [str(images), "--task", task, "--teacher", str(tiny_checkpoints[task]), *STUDENT_SET, *head,
            "--input-size", "64", "48", "--steps", "40",
            "--batch-size", "2", "--device", "cpu", "--feature-loss", "0.5",
            "--set", "checkpoint_every=4", "--set", "keep_checkpoints=0", "--set", "precision=fp32",
            "--set", "schedule.warmup_steps=2", "--set", "progress_bar=false"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "sapiens2", "distill", *argv]
    straight = subprocess.run([*command, "-o", str(tmp_path / "straight")], env=env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = tmp_path / "killed"
    process = subprocess.Popen([*command, "-o", str(killed)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 240
    while not find_checkpoints(killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert find_checkpoints(killed), "no checkpoint appeared before the deadline"
    assert not (killed / "model.safetensors").exists(), "the run finished before it was killed"
    resumed = subprocess.run([*command, "-o", str(killed), "--resume"], env=env, capture_output=True, text=True,
                             timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    one, two = load_file(str(tmp_path / "straight" / "model.safetensors")), load_file(str(killed / "model.safetensors"))
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    assert (killed / "metrics.csv").read_text() == (tmp_path / "straight" / "metrics.csv").read_text()
    # Negative control: a run with another seed ends elsewhere, so the equality above is not vacuous.
    other = subprocess.run([*command, "-o", str(tmp_path / "other"), "--set", "seed=1"], env=env, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert other.returncode == 0, other.stderr[-3000:]
    three = load_file(str(tmp_path / "other" / "model.safetensors"))
    assert not all(torch.equal(one[k], three[k]) for k in one)
    if task == "pose":
        report = json.loads((killed / "agreement.json").read_text())
        assert report["people"] > 2 * report["images"], report  # several people per image
        assert report == json.loads((tmp_path / "straight" / "agreement.json").read_text())
