"""``sapiens2 distill --task pose``: the samples are person crops as ``Predictor("pose")`` makes them (the detector's
boxes, the top-down box policy and UDP crop), stored per image (every person of it, or none) through the bulk engine,
and the agreement is also measured end to end through ``Predictor``."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
import torch
from conftest import SHARED, require
from safetensors import safe_open

from sapiens2 import load_model
from sapiens2.cli import main
from sapiens2.data.transforms import letterbox
from sapiens2.distill.agreement import image_agreement
from sapiens2.distill.targets import decode_targets, encode_targets, find_people, people_of, record_samples
from sapiens2.distill.trainer import people_counts
from sapiens2.pose.topdown import normalize, person_crops
from sapiens2.predict import Predictor

DETECTOR = SHARED / "fixtures" / "detector" / "rtmdet_m_random_mmengine.pth"
SIZE = (64, 48)
STUDENT_SET = ("--set", "model.arch={embed_dims: 16, num_layers: 2, num_heads: 2, feedforward_channels: 32, "
               "num_tokenizer_layers: 0}", "--set", "model.head={deconv_out_channels: [8, 8], deconv_kernel_sizes: "
               "[4, 4], conv_out_channels: [8], conv_kernel_sizes: [1]}")  # fmt: skip


def crowd(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A (160, 256, 3) uint8 scene of three "people" (noisy upright blobs of colour, one small) on a textured
    background, and their (3, 4) xyxy boxes."""
    rng = np.random.default_rng(seed)
    image = rng.integers(60, 120, (160, 256, 3)).astype(np.float64)
    boxes = np.array([[10, 12, 70, 150], [100, 30, 150, 140], [200, 100, 224, 150]], np.float32)
    boxes[:, [0, 2]] += rng.integers(-6, 6)
    for (x1, y1, x2, y2), colour in zip(boxes.astype(int), rng.integers(0, 255, (3, 3)), strict=True):
        image[y1:y2, x1:x2] = colour + rng.normal(0, 20, (y2 - y1, x2 - x1, 3))
    return image.clip(0, 255).astype(np.uint8), boxes


class Recorder:
    """A pose network for ``Predictor``: the tiny model's heatmaps, keeping every batch it is given."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.inputs = model.eval(), []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.inputs.append(x.clone())
        with torch.no_grad():
            return self.model(x)


def predictor_inputs(model, images, boxes=None, detector=None) -> list[torch.Tensor]:
    """What ``Predictor("pose")`` feeds the network per image (no flip test): (S, 3, H, W) normalised crops."""
    recorder = Recorder(model)
    predictor = Predictor("pose", recorder, input_size=SIZE, detector=detector, flip_test=False, batch_size=1)
    per_image = []
    for index, image in enumerate(images):
        recorder.inputs.clear()
        predictor(image, boxes=None if boxes is None else boxes[index])
        per_image.append(torch.cat(recorder.inputs) if recorder.inputs else torch.zeros(0))
    return per_image


def test_person_crops_of_given_boxes_are_predictors_crops_bit_for_bit(tiny_checkpoints):
    image, boxes = crowd(0)
    [fed] = predictor_inputs(load_model("pose", tiny_checkpoints["pose"]), [image], [boxes])
    crops = person_crops(image, boxes, SIZE)[0]
    assert crops.shape == (3, *SIZE, 3) and torch.equal(normalize(crops), fed)
    # Negative control: the whole image (what distillation fed before) is not what Predictor feeds for any person.
    whole = normalize(letterbox(image, SIZE)[0])
    assert not any(torch.equal(whole[0], crop) for crop in fed)


def test_an_image_without_people_gives_a_record_of_none_and_is_counted():
    image, boxes = crowd(1)
    scores = np.array([[0.9], [0.2], [0.8]], np.float32)  # the second below predict's 0.3: not a person
    detections = [np.concatenate([boxes, scores], axis=1), np.zeros((0, 5), np.float32)]
    found = find_people([image, image], lambda images: detections)
    assert [len(boxes) for boxes in found] == [2, 0]  # Predictor would fall back to the whole image for the second
    assert np.array_equal(found[0][:, :4], boxes[[0, 2]])
    crops, kept = people_of([image], lambda images: detections[:1], SIZE)[0]
    record = encode_targets(crops[:0], {"output": torch.zeros(0, 308, 16, 12)}, "uint8", kept[:0])
    assert decode_targets(record)["image"].shape == (0, *SIZE, 3)
    assert people_counts([2, 0, 1]) == {"images": 3, "people": 3, "images_without_people": 1}


@pytest.mark.slow
def test_stored_samples_are_predictors_crops_of_the_detectors_people(tiny_checkpoints, tmp_path, capsys):
    """The teacher's pass with the real (random-weight) detector: each image's record holds every person Predictor
    crops, bit for bit, with the teacher's heatmaps of that crop; a rerun computes nothing again."""
    require(DETECTOR)
    folder = tmp_path / "images"
    folder.mkdir()
    images = [crowd(seed)[0] for seed in range(3)]
    for index, image in enumerate(images):
        cv2.imwrite(str(folder / f"scene_{index}.png"), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    argv = ["distill", str(folder), "--task", "pose", "--teacher", str(tiny_checkpoints["pose"]), *STUDENT_SET,
            "--input-size", *map(str, SIZE), "--device", "cpu", "--detector", str(DETECTOR), "--store", "fp16",
            "--steps", "1", "-o", str(tmp_path / "run"), "--teacher-only"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert "3 computed" in capsys.readouterr().out
    teacher = load_model("pose", tiny_checkpoints["pose"])
    fed = predictor_inputs(teacher, images, detector=str(DETECTOR))
    counts = []
    for index, inputs in enumerate(fed):
        record = tmp_path / "run" / "teacher" / f"scene_{index}.teacher.safetensors"
        stored = decode_targets(record.read_bytes())
        counts.append(record_samples(record))
        assert counts[-1] == len(inputs) == len(stored["image"])
        assert torch.equal(normalize(stored["image"].numpy()), inputs)  # Predictor's crops, bit for bit
        with torch.no_grad():
            expected = teacher(inputs)
        assert torch.allclose(stored["teacher"], expected, atol=2e-3 * float(expected.abs().max()))
    assert sum(counts) > len(images)  # several people per image
    assert main(argv) == 0 and "0 computed, 3 kept" in capsys.readouterr().out  # exactly once


def test_agreement_through_predictor_is_one_for_the_teacher_itself_and_lower_for_another(tiny_checkpoints):
    teacher = load_model("pose", tiny_checkpoints["pose"])
    other = load_model("pose", tiny_checkpoints["pose"])
    with torch.no_grad():
        for parameter in other.decode_head.parameters():
            parameter.add_(torch.randn_like(parameter) * parameter.std().nan_to_num(0.1))
    people = [crowd(seed) for seed in range(2)]
    same = image_agreement(teacher, load_model("pose", tiny_checkpoints["pose"]), people, input_size=SIZE)
    assert same == {"image_pck@0.05": 1.0, "image_error": 0.0, "image_people": 6.0}
    apart = image_agreement(other, teacher, people, input_size=SIZE)
    assert apart["image_pck@0.05"] < 0.9 and apart["image_error"] > 0.01  # negative control


def test_a_pose_run_counts_its_people_and_measures_agreement_through_predictor(tiny_checkpoints, tmp_path, capsys):
    """Online and stored alike (``--detector none``: each image is one person, cropped as Predictor crops it)."""
    folder = tmp_path / "images"
    folder.mkdir()
    for seed in range(5):
        cv2.imwrite(str(folder / f"scene_{seed}.png"), crowd(seed)[0])
    common = ["distill", str(folder), "--task", "pose", "--teacher", str(tiny_checkpoints["pose"]), *STUDENT_SET,
              "--steps", "1", "--input-size", *map(str, SIZE), "--device", "cpu", "--batch-size", "2", "--detector",
              "none", "--set", "schedule.warmup_steps=0", "--set", "precision=fp32", "--set", "data.num_workers=0",
              "--set", "progress_bar=false"]  # fmt: skip
    for mode in ([], ["--online"]):
        out = tmp_path / f"run{len(mode)}"
        assert main([*common, "-o", str(out), *mode]) == 0, capsys.readouterr().err
        assert "people: 5 found in 5 images, 0 images without people" in capsys.readouterr().out
        report = json.loads((out / "agreement.json").read_text())
        assert report["people"] == 5 and report["after"]["image_people"] == 1.0
        assert 0 <= report["after"]["image_pck@0.05"] <= 1 and np.isfinite(report["before"]["image_error"])
    with safe_open(str(tmp_path / "run0" / "teacher" / "scene_0.teacher.safetensors"), "np") as file:
        stored = file.get_tensor("image")
    assert np.array_equal(stored, person_crops(cv2.imread(str(folder / "scene_0.png"))[..., ::-1].copy(),
                                               np.array([[0, 0, 255, 159]]), SIZE)[0])  # fmt: skip


def test_a_detector_that_is_not_there_is_one_line_naming_the_flag(tiny_checkpoints, tmp_path, capsys):
    folder = tmp_path / "images"
    folder.mkdir()
    cv2.imwrite(str(folder / "scene.png"), crowd(0)[0])
    missing = tmp_path / "rtmdet_m.pth"
    argv = ["distill", str(folder), "--task", "pose", "--teacher", str(tiny_checkpoints["pose"]), *STUDENT_SET,
            "--steps", "1", "--detector", str(missing), "-o", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"sapiens2 distill: error: --detector {missing}: no such file; give a local rtmdet_m.pth, rtmdet "
                     "(downloaded once) or none (each image is one person)"]  # fmt: skip
    assert not (tmp_path / "run").exists()
