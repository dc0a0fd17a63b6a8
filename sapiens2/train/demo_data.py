"""Tiny synthetic demo datasets of the five tasks, in the on-disk layouts that ``sapiens2.train.datasets`` reads.

Targets are synthetic but tied to the image (see ``make_demo_dataset``), so a small model can learn them: the demo
data exists for smoke tests, tutorials and the training tests, not as real training data.
"""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np

from sapiens2.data.io import read_image, save_json, save_npy, save_png
from sapiens2.metadata import NUM_KEYPOINTS, SAMPLE_IMAGE, keypoint_metadata
from sapiens2.train.datasets import TASK_DATASETS, PathLike

__all__ = ["make_demo_dataset"]

logger = logging.getLogger(__name__)


# COCO-17 joints of a person facing the camera, as fractions of the person box (the person's left is image right).
_DEMO_SKELETON = np.array(
    [(0.50, 0.08), (0.54, 0.06), (0.46, 0.06), (0.58, 0.07), (0.42, 0.07), (0.68, 0.22), (0.32, 0.22), (0.75, 0.38),
     (0.25, 0.38), (0.78, 0.52), (0.22, 0.52), (0.60, 0.55), (0.40, 0.55), (0.60, 0.75), (0.40, 0.75), (0.60, 0.95),
     (0.40, 0.95)]
)  # fmt: skip


def _demo_photos() -> list[np.ndarray]:
    """The packaged sample photo and a procedural picture, 512 x 512 RGB each: the same in every install."""
    rows, cols = np.mgrid[0:512, 0:512] / 512.0
    field = np.stack([np.sin(6 * rows + 2 * cols), np.cos(5 * cols - 3 * rows), np.sin(9 * rows * cols)], axis=2)
    picture = ((field + 1) * 127.5).astype(np.uint8)
    return [read_image(SAMPLE_IMAGE), picture]


def _demo_sphere(height: int, width: int, shift: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Ray-trace a sphere (radius 0.45 m, 2 m ahead) through a pinhole K: depth, normals, mask, K."""
    focal = 1.2 * max(height, width)
    intrinsics = np.array([[focal, 0, (width - 1) / 2], [0, focal, (height - 1) / 2], [0, 0, 1]])
    rows, cols = np.indices((height, width), dtype=np.float64)
    rays = np.stack([(cols - intrinsics[0, 2]) / focal, (rows - intrinsics[1, 2]) / focal, np.ones_like(rows)], 2)
    centre, radius = np.array([shift, 0.0, 2.0]), 0.45
    a, b = (rays**2).sum(axis=2), -2 * rays @ centre
    disc = b**2 - 4 * a * (centre @ centre - radius**2)
    mask = disc > 0
    depth = np.where(mask, (-b - np.sqrt(np.maximum(disc, 0))) / (2 * a), 0.0)
    normals = np.where(mask[..., None], (rays * depth[..., None] - centre) / radius, 0.0)
    return depth.astype(np.float32), normals.astype(np.float32), mask, intrinsics


def _shade(photo: np.ndarray, normals: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Paint a Lambertian-shaded surface over the photo so the targets can be learned from the image."""
    light = np.array([-0.35, -0.45, -0.82]) / np.linalg.norm([-0.35, -0.45, -0.82])
    shade = np.clip(normals @ light, 0, 1)[..., None]
    painted = 0.3 * photo + 0.7 * 255 * (0.15 + 0.85 * shade)
    return np.where(mask[..., None], painted, photo).clip(0, 255).astype(np.uint8)


def _write_demo_sample(task: str, root: Path, name: str, photo: np.ndarray, rng: np.random.Generator) -> dict | None:
    """Write the image and targets of one demo sample; returns the pose annotation (pose only)."""
    height, width = photo.shape[:2]
    image = photo
    rows, cols = np.indices((height, width))
    ellipse = ((cols - width / 2) / (0.35 * width)) ** 2 + ((rows - 0.55 * height) / (0.42 * height)) ** 2
    if task == "seg":
        grey = photo.mean(axis=2)
        labels = np.where(cols < width / 2, 20, 11).astype(np.uint8)  # Right_/Left_Upper_Arm by image half
        labels[grey < 70] = 4  # Hair
        labels[grey > 170] = 23  # Upper_Clothing
        labels[ellipse > 1] = 0
        labels[(ellipse > 0.95) & (ellipse <= 1)] = 255  # an ignored rim
        save_png(root / "labels" / f"{name}.png", labels)
    elif task in ("normal", "pointmap"):
        depth, normals, mask, intrinsics = _demo_sphere(height, width, rng.uniform(-0.3, 0.3))
        image = _shade(photo, normals, mask)
        save_png(root / "masks" / f"{name}.png", mask.astype(np.uint8) * 255)
        odd = int(name[-1]) % 2
        if task == "normal" and odd:  # both normal encodings: 16-bit PNG and .npy
            save_png(root / "normals" / f"{name}.png", np.round((normals + 1) * 32767.5).astype(np.uint16))
        elif task == "normal":
            save_npy(root / "normals" / f"{name}.npy", normals)
        elif odd:  # both pointmap encodings: XYZ points and depth + intrinsics
            rays = np.stack(
                [(cols - intrinsics[0, 2]) / intrinsics[0, 0], (rows - intrinsics[1, 2]) / intrinsics[1, 1]]
            )
            points = np.stack([rays[0] * depth, rays[1] * depth, depth], axis=2).astype(np.float32)
            save_npy(root / "pointmaps" / f"{name}.npy", points)
        else:
            save_npy(root / "depth" / f"{name}.npy", depth)
            fx, fy, cx, cy = intrinsics[0, 0], intrinsics[1, 1], intrinsics[0, 2], intrinsics[1, 2]
            save_json(root / "intrinsics" / f"{name}.json", {"fx": fx, "fy": fy, "cx": cx, "cy": cy})
    elif task == "albedo":
        mask = ellipse <= 1
        albedo = (cv2.medianBlur(photo, 5) // 32) * 32 + 16  # piecewise-flat colours
        shading = 0.45 + 0.55 * np.clip(1 - ellipse, 0, 1) ** 0.5
        image = np.where(mask[..., None], albedo * shading[..., None], photo).astype(np.uint8)
        save_png(root / "albedo" / f"{name}.png", np.where(mask[..., None], albedo, 0).astype(np.uint8))
        save_png(root / "masks" / f"{name}.png", mask.astype(np.uint8) * 255)
    if task != "pose":
        save_png(root / "images" / f"{name}.png", image)
        return None
    box = np.array([0.25 * width, 0.08 * height, 0.5 * width, 0.87 * height])  # x, y, w, h
    joints = box[:2] + (_DEMO_SKELETON + rng.uniform(-0.02, 0.02, _DEMO_SKELETON.shape)) * box[2:]
    image = photo.copy()
    body = keypoint_metadata().groups["body"]  # the 308 ids of the COCO-17 joints, in COCO order
    for link in ((5, 7), (7, 9), (6, 8), (8, 10), (5, 6), (11, 12), (11, 13), (13, 15), (12, 14), (14, 16)):
        cv2.line(image, *(tuple(int(v) for v in joints[j]) for j in link), (255, 255, 255), 2)
    for j, (x, y) in enumerate(joints):
        # One colour per joint type, the same on both sides: a mirrored person's left is the original's right
        # (POSE.md §4.3 flip), so side-specific colours would contradict the flip augmentation.
        colour = cv2.cvtColor(np.uint8([[[(j + 1) // 2 * 20, 220, 230]]]), cv2.COLOR_HSV2RGB)[0, 0]
        cv2.circle(image, (int(x), int(y)), max(3, width // 80), tuple(int(c) for c in colour), -1)
    keypoints = np.zeros((NUM_KEYPOINTS, 3))
    keypoints[list(body), :2], keypoints[list(body), 2] = joints, 2
    save_png(root / "images" / f"{name}.png", image)
    return {"file_name": f"{name}.png", "keypoints": keypoints.reshape(-1).round(2).tolist(), "bbox": box.tolist()}


def make_demo_dataset(task: str, root: PathLike, num_images: int = 4) -> Path:
    """Write a tiny valid ``task`` dataset in the ``sapiens2.train.datasets`` layout, from the sample photo.

    Targets are synthetic but tied to the image, so a small model's loss falls on them: seg labels from brightness
    and image side inside an ellipse; normals and pointmaps of a ray-traced sphere painted onto the photo with
    Lambertian shading (both file encodings of each task, alternating); albedo = flattened photo colours times a
    smooth shading; pose = a COCO-17 stick figure drawn on the photo (the 17 body ids of the 308 labelled).

    Example:
        >>> from sapiens2.train.datasets import build_dataset
        >>> root = make_demo_dataset("seg", "/tmp/demo_seg")
        >>> dataset = build_dataset("seg", root, input_size=(64, 48))

    Args:
        task: one of ``seg``, ``normal``, ``pointmap``, ``albedo``, ``pose``.
        root: folder to create (existing files of the same names are overwritten).
        num_images: images to write (alternating the sample photo and a procedural picture, with mirrored and
            portrait-cropped variants).

    Returns:
        ``root`` as a Path.
    """
    if task not in TASK_DATASETS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASK_DATASETS)}")
    if num_images < 1:
        raise ValueError(f"num_images must be >= 1, got {num_images}")
    root = Path(root)
    photos = _demo_photos()
    records = []
    for i in range(num_images):
        photo = photos[i % len(photos)]
        if (i // 2) % 2:
            photo = photo[:, ::-1]
        if i % 2:
            photo = photo[:, photo.shape[1] // 8 : photo.shape[1] * 7 // 8]  # a portrait variant
        name = f"demo_{i:03d}"
        record = _write_demo_sample(task, root, name, np.ascontiguousarray(photo), np.random.default_rng(i))
        if record is not None:
            height, width = photo.shape[:2]
            records.append((name, width, height, record))
    if task == "pose":
        images = [
            {"id": i, "file_name": r["file_name"], "width": w, "height": h} for i, (_, w, h, r) in enumerate(records)
        ]
        # Annotation ids from 1: COCO tools (pycocotools' COCOeval) read id 0 as "no match".
        annotations = [
            {"id": i + 1, "image_id": i, "category_id": 1, "iscrowd": 0, "num_keypoints": 17, "bbox": r["bbox"],
             "area": float(r["bbox"][2] * r["bbox"][3]), "keypoints": r["keypoints"]}
            for i, (_, _, _, r) in enumerate(records)
        ]  # fmt: skip
        categories = [{"id": 1, "name": "person", "supercategory": "person"}]
        save_json(root / "annotations.json", {"images": images, "annotations": annotations, "categories": categories})
    logger.info("wrote a %d-image %s demo dataset to %s", num_images, task, root)
    return root
