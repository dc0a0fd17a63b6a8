"""Synthetic data for the distillation tests: images of coloured rectangles whose labels are their colours, and a
tiny seg teacher trained on them briefly with the training loop (so its outputs depend on the image)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import torch

from sapiens2.data.transforms import normalize_to_tensor

PALETTE = np.array([[200, 40, 40], [40, 180, 60], [50, 60, 210], [220, 200, 60]], dtype=np.uint8)
SIZE = (128, 96)  # (H, W): an 8 x 6 token grid
TEACHER = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}
STUDENT = {"embed_dims": 24, "num_layers": 2, "num_heads": 2, "feedforward_channels": 48, "num_tokenizer_layers": 0}
SEG_TEACHER_HEAD = {"deconv_out_channels": [16, 8, 8, 8], "deconv_kernel_sizes": [4, 4, 4, 4],
                    "conv_out_channels": [8], "conv_kernel_sizes": [1], "num_classes": 4}  # fmt: skip
SEG_STUDENT_HEAD = {"deconv_out_channels": [12, 8, 8, 8], "deconv_kernel_sizes": [4, 4, 4, 4],
                    "conv_out_channels": [8], "conv_kernel_sizes": [1], "num_classes": 4}  # fmt: skip


def scene(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A (128, 96, 3) uint8 image of 2-4 rectangles of palette colours over a palette background, with noise, and
    its (128, 96) labels (the palette index of each pixel)."""
    height, width = SIZE
    labels = np.full((height, width), rng.integers(4), dtype=np.int64)
    for _ in range(rng.integers(2, 5)):
        y0, x0 = rng.integers(0, height - 32), rng.integers(0, width - 24)
        labels[y0 : y0 + rng.integers(32, 80), x0 : x0 + rng.integers(24, 64)] = rng.integers(4)
    image = PALETTE[labels].astype(np.float64) + rng.normal(0, 12, (height, width, 3))
    return image.clip(0, 255).astype(np.uint8), labels


def write_images(folder: Path, count: int, seed: int, draw=None) -> Path:
    """``count`` pictures of ``draw`` (``scene`` by default) as PNG files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for index in range(count):
        image, _ = (draw or scene)(rng)
        cv2.imwrite(str(folder / f"image_{index:03d}.png"), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    return folder


def train_teacher(
    task: str, folder: Path, head: dict, dataset: torch.utils.data.Dataset, steps: int, warmup: int
) -> Path:
    """A tiny ``task`` teacher (``TEACHER`` arch, ``head``) trained briefly with the training loop on ``dataset``;
    returns its model file."""
    from sapiens2.train.config import config_from_dict
    from sapiens2.train.trainer import fit

    config = config_from_dict({
        "task": task, "output_dir": str(folder), "steps": steps, "precision": "fp32", "log_every": 50,
        "eval_every": 0, "checkpoint_every": 0, "progress_bar": False, "device": "cpu",
        "model": {"arch": TEACHER, "head": head},
        "data": {"root": "-", "input_size": list(SIZE), "batch_size": 8, "num_workers": 0},
        "optimizer": {"lr": 2e-3}, "schedule": {"warmup_steps": warmup},
    })  # fmt: skip
    return fit(config, train_dataset=dataset)["model"]


class SegScenes(torch.utils.data.Dataset):
    """Labelled scenes for the teacher's training (the trainer's item contract: image + labels)."""

    def __init__(self, count: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.items = [scene(rng) for _ in range(count)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        image, labels = self.items[index]
        return {"image": normalize_to_tensor([image])[0], "labels": torch.from_numpy(labels)}


def train_seg_teacher(folder: Path, steps: int = 150) -> Path:
    """A tiny seg teacher (4 classes) trained briefly on labelled scenes; returns its model file."""
    return train_teacher("seg", folder, SEG_TEACHER_HEAD, SegScenes(64, seed=100), steps, warmup=5)


POSE_TEACHER_HEAD = {"deconv_out_channels": [16, 16], "deconv_kernel_sizes": [4, 4], "conv_out_channels": [16],
                     "conv_kernel_sizes": [1], "out_channels": 4}  # fmt: skip
POSE_STUDENT_HEAD = {"deconv_out_channels": [12, 12], "deconv_kernel_sizes": [4, 4], "conv_out_channels": [12],
                     "conv_kernel_sizes": [1], "out_channels": 4}  # fmt: skip


def dots(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A (128, 96, 3) uint8 "person crop": four discs of the palette colours (keypoint k has colour k) on a grey,
    noisy background, and their (4, 2) (x, y) centres in pixels."""
    height, width = SIZE
    image = np.full((height, width, 3), 110, dtype=np.float64) + rng.normal(0, 12, (height, width, 3))
    centres = np.stack([rng.uniform(8, width - 8, 4), rng.uniform(8, height - 8, 4)], axis=1)
    rows, cols = np.mgrid[0:height, 0:width]
    for colour, (x, y) in zip(PALETTE, centres, strict=True):
        image[(cols - x) ** 2 + (rows - y) ** 2 <= 36] = colour
    return image.clip(0, 255).astype(np.uint8), centres


def as_predictor_crop(image: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``image`` and its (K, 2) points as ``Predictor("pose")`` without a detector feeds the image to the network:
    the whole-image box's crop (``pose.topdown``: padding 1.25, the UDP warp) and the points warped with it."""
    from sapiens2.pose.topdown import box_to_center_scale, person_crops, udp_warp_matrix

    height, width = image.shape[:2]
    box = np.array([[0, 0, width - 1, height - 1]], np.float32)
    crops, _, _ = person_crops(image, box, SIZE)
    center, scale = box_to_center_scale(box[0], aspect=SIZE[1] / SIZE[0])
    matrix = udp_warp_matrix(center, scale, SIZE).astype(np.float64)
    return crops[0], centres @ matrix[:, :2].T + matrix[:, 2]


class PoseDots(torch.utils.data.Dataset):
    """Labelled dot crops for the pose teacher (image, Gaussian heatmaps at 1/4 size, keypoint weights): each dots
    picture as the network sees it in ``Predictor`` and in ``sapiens2 distill --detector none`` (the whole-image
    box's crop), so that the teacher is trained on the inputs it teaches on."""

    def __init__(self, count: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.items = [as_predictor_crop(*dots(rng)) for _ in range(count)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        image, centres = self.items[index]
        height, width = SIZE[0] // 4, SIZE[1] // 4
        rows, cols = np.mgrid[0:height, 0:width]
        grid = centres / 4 - 0.375  # pixel centres at 1/4 scale
        maps = np.exp(-((cols - grid[:, :1, None]) ** 2 + (rows - grid[:, 1:, None]) ** 2) / (2 * 1.5**2))
        return {"image": normalize_to_tensor([image])[0], "heatmaps": torch.from_numpy(maps).float(),
                "keypoint_weights": torch.ones(4)}  # fmt: skip


def train_pose_teacher(folder: Path, steps: int = 600) -> Path:
    """A tiny 4-keypoint pose teacher trained briefly on dot crops; returns its model file."""
    return train_teacher("pose", folder, POSE_TEACHER_HEAD, PoseDots(128, seed=200), steps, warmup=10)
