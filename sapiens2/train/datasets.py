"""Training datasets of the five Sapiens2 tasks over simple on-disk formats, with the official training pipelines
(DENSE.md §2.3, §3.2, §4.2, §5.2; POSE.md §3, §4.3). docs/data_formats.md has the same layouts with examples.

Every task reads ``root/images/<name>.{jpg,jpeg,png}``; ``<name>`` is the file stem and pairs an image with its
targets. An optional ``root/<split>.txt`` (one name per line, extension optional) restricts the split; otherwise
every image is used. Layouts (a missing or unreadable file raises an error naming it):

- seg: ``labels/<name>.png`` single-channel uint8 class ids (0-28, 255 = ignore), same size as the image; option
  ``label_map`` (a dict source id -> target id, or a ``seg29.json`` table name such as ``"dome34_to_29"``; unmapped
  ids become 255).
- normal: ``normals/<name>.npy`` (H, W, 3) float32 (x, y, z), or ``normals/<name>.png`` 16-bit RGB with
  n = 2 v / 65535 - 1 (8-bit: 2 v / 255 - 1; an all-zero pixel is "no normal").
- pointmap: ``pointmaps/<name>.npy`` (H, W, 3) float32 camera-frame points in metres (OpenCV frame: X right, Y down,
  Z forward), or ``depth/<name>.npy`` (H, W) float32 Z-depth in metres with ``intrinsics/<name>.json``
  ``{"fx", "fy", "cx", "cy"}`` in pixels (centres on integers). A pointmap without intrinsics gets them by a least
  squares pinhole fit (it must be a pinhole projection).
- albedo: ``albedo/<name>.png`` 8-bit RGB albedo (sRGB values, divided by 255).
- Dense tasks take an optional ``masks/<name>.png`` (channel 0 > 0 = valid). Without one, valid = finite, non-zero
  targets (normal: non-zero vector; pointmap: Z > 0; albedo: any channel > 0).
- pose: ``annotations.json`` in COCO style: ``images`` [{``id``, ``file_name`` (relative to ``images/``)}] and
  ``annotations`` [{``image_id``, ``keypoints`` (K x 3 numbers x, y, v; v > 0 = labelled), optional ``bbox``
  (x, y, w, h), ``iscrowd``}]. K = 308, or another format (option ``keypoint_format``: ``coco17``,
  ``coco_wholebody133``) mapped into the 308 ids with zero weight on the rest, or the K keypoints of a set of one's
  own in its name order (option ``keypoint_set``, ``sapiens2.labels``). One sample per person.

``dataset[i]`` is a dict of tensors that the default collate stacks; it is a pure function of
(seed, epoch, i): randomness comes from ``numpy.random.default_rng((seed, epoch, i))``. A sample failing the
reference's drop rule is re-augmented, then replaced by another index drawn from the same generator.
"""

from __future__ import annotations

import abc
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np
import torch

from sapiens2.data.io import read_image
from sapiens2.data.labelled import LabelledSet, fit_intrinsics, label_map_table
from sapiens2.data.transforms import normalize_to_tensor
from sapiens2.dense.pointmap import CANONICAL_FOCAL
from sapiens2.metadata import NUM_KEYPOINTS, KeypointMetadata, SegMetadata
from sapiens2.pose.codec import encode_heatmaps
from sapiens2.pose.keypoints import format_to_308_ids
from sapiens2.train import augment as aug

if TYPE_CHECKING:
    from sapiens2.eval.pose import PoseLabels

__all__ = [
    "AlbedoDataset",
    "NormalDataset",
    "PointmapDataset",
    "PoseDataset",
    "SegDataset",
    "TASK_DATASETS",
    "build_dataset",
    "fit_intrinsics",
    "label_map_table",
]

logger = logging.getLogger(__name__)

MAX_TRIES = 10
PathLike = str | os.PathLike


def _check_input_size(size: Any) -> tuple[int, int]:
    if len(size) != 2 or any(int(v) != v or v < 8 for v in size):
        raise ValueError(f"input_size must be (H, W) with two integers >= 8, got {size!r}")
    return int(size[0]), int(size[1])


class _TaskDataset(torch.utils.data.Dataset, abc.ABC):
    """Shared plumbing: names, split, per-(seed, epoch, index) generators, drop-and-retry, packing."""

    def __init__(
        self,
        root: PathLike,
        *,
        split: str = "train",
        input_size: tuple[int, int] = (1024, 768),
        augment: bool = True,
        seed: int = 0,
    ) -> None:
        self.root = Path(root)
        self.split = split
        self.input_size = _check_input_size(input_size)
        self.augment = augment
        self.seed = int(seed)
        self.epoch = 0
        if self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}")
        if not self.root.is_dir():
            raise FileNotFoundError(f"dataset root {str(self.root)!r} is not a folder")

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose random augmentations ``__getitem__`` draws (call before iterating each epoch).

        DataLoader workers hold copies of the dataset, so with ``persistent_workers=True`` the new epoch does not
        reach them; recreate the iterator (the default) after calling this.
        """
        if int(epoch) < 0:
            raise ValueError(f"epoch must be a non-negative integer, got {epoch}")
        self.epoch = int(epoch)

    def generator(self, index: int) -> np.random.Generator:
        """The random source of sample ``index`` in the current epoch."""
        return np.random.default_rng((self.seed, self.epoch, int(index)))

    def __len__(self) -> int:
        return len(self.names)

    @abc.abstractmethod
    def load(self, index: int) -> aug.Sample | None:
        """The un-augmented sample ``index`` at its native size (keys as in ``sapiens2.train.augment``).

        None means the loader rejects the sample's content (the reference then redraws, DENSE.md §1.1).
        """

    @abc.abstractmethod
    def transform(self, sample: aug.Sample, rng: np.random.Generator) -> aug.Sample:
        """Run the task's training pipeline (``augment=True``) or the plain resize (``augment=False``)."""

    def keep(self, sample: aug.Sample) -> bool:
        """The reference's drop rule on a transformed sample; dropped samples are redrawn (training only)."""
        return True

    @abc.abstractmethod
    def pack(self, sample: aug.Sample) -> dict[str, torch.Tensor]:
        """Transformed sample -> the tensors of the training interface, besides ``image`` and ``index``."""

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)} samples")
        rng = self.generator(index)
        source = index
        for attempt in range(MAX_TRIES):
            sample = self.load(source)
            if sample is not None:
                out = self.transform(sample, rng)
                if not self.augment or self.keep(out):
                    break
            # Half the retries re-augment the same sample, then other samples (the reference redraws an index).
            if sample is None or attempt >= MAX_TRIES // 2:
                source = int(rng.integers(len(self)))
        else:
            raise RuntimeError(
                f"{type(self).__name__}: {MAX_TRIES} draws around index {index} all failed the drop rule "
                "(too few or too many valid pixels); check the masks / labels of this dataset"
            )
        packed = {"image": normalize_to_tensor([out["image"]])[0], **self.pack(out)}
        packed["index"] = torch.tensor(index, dtype=torch.int64)
        return packed


class _DenseDataset(_TaskDataset):
    """Image + per-pixel target folders + optional masks, read by ``sapiens2.data.labelled.LabelledSet``."""

    task = ""

    def __init__(self, root: PathLike, *, labelled: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self.labelled = LabelledSet(self.task, self.root, split=self.split, **(labelled or {}))
        self.names = self.labelled.names

    def _keep_valid(self, mask: np.ndarray) -> bool:
        valid = int(mask.sum())
        return valid >= 16 and valid / mask.size <= 0.96  # DENSE.md §3.2 step 9, §4.2 step 7, §5.2 step 6

    def _geometric(self, sample: aug.Sample, rng: np.random.Generator) -> aug.Sample:
        """Random scale, continuous crop and flip, each p = 0.3 (DENSE.md §3.2 steps 3-5), then letterbox."""
        if rng.random() < 0.3:
            factor = rng.uniform(0.5, 2.0)
            height, width = sample["image"].shape[:2]
            size = (max(1, round(height * factor)), max(1, round(width * factor)))
            sample = aug.resize_sample(sample, size, intrinsics_factor=factor)
        if rng.random() < 0.3:
            box = aug.random_continuous_crop(*sample["image"].shape[:2], rng)
            if box is not None:
                sample = aug.crop_sample(sample, box)
        if rng.random() < 0.3:
            sample = aug.hflip(sample)
        return aug.letterbox_sample(sample, self.input_size)

    def _mask_tensor(self, sample: aug.Sample) -> torch.Tensor:
        return torch.from_numpy(sample["mask"].astype(np.float32))[None]


class SegDataset(_DenseDataset):
    """Body-part segmentation: ``images/`` + ``labels/<name>.png`` (DENSE.md §2.3 pipeline).

    Args:
        root: dataset folder.
        label_map: remap of the stored ids (see :func:`label_map_table`).
        num_classes: classes of the head (ids must be below it or 255).
        classes: a class list of one's own (``sapiens2.labels``): its size is ``num_classes`` and its flip pairs
            are swapped by the horizontal flip (default: the 29 classes' 8 pairs).
        background_dir: optional folder of ``.jpg`` backgrounds for ``SegRandomBackground`` (p = 0.8).
        split, input_size, augment, seed: see :func:`build_dataset`.
    """

    task = "seg"

    def __init__(
        self,
        root: PathLike,
        *,
        label_map: Mapping[int, int] | str | None = None,
        num_classes: int = 29,
        background_dir: PathLike | None = None,
        classes: SegMetadata | None = None,
        **kwargs: Any,
    ) -> None:
        if classes is not None:  # a class list of one's own (sapiens2.labels): its size and flip pairs
            num_classes = len(classes.class_names)
        self.swap_pairs = None if classes is None else classes.hflip_swap_pairs
        labelled = {"label_map": label_map, "num_classes": num_classes}
        super().__init__(root, labelled=labelled, **kwargs)
        self.label_table = self.labelled.label_table
        self.num_classes = num_classes
        self.backgrounds = sorted(Path(background_dir).glob("*.jpg")) if background_dir else []
        if background_dir and not self.backgrounds:
            raise FileNotFoundError(f"background_dir {str(background_dir)!r} holds no .jpg files")

    def load(self, index: int) -> aug.Sample:
        return self.labelled.read(self.names[index])

    def transform(self, sample: aug.Sample, rng: np.random.Generator) -> aug.Sample:
        out_h, out_w = self.input_size
        if not self.augment:
            return self._stretch(sample, self.input_size)
        if self.backgrounds and rng.random() < 0.8:
            background = read_image(self.backgrounds[int(rng.integers(len(self.backgrounds)))])
            sample = aug.replace_background(sample, background)
        # SegRandomResize: fit into the box (H r, W r), r ~ U(0.4, 2.0), keeping the aspect (DENSE.md §2.3 step 2).
        ratio = rng.uniform(0.4, 2.0)
        height, width = sample["image"].shape[:2]
        fit = min(int(out_w * ratio) / width, int(out_h * ratio) / height)
        sample = self._stretch(sample, (max(1, round(height * fit)), max(1, round(width * fit))))
        if rng.random() < 0.3:
            sample = aug.seg_random_crop(sample, self.input_size, rng)
        if rng.random() < 0.3:
            sample["image"] = aug.random_gaussian_blur(sample["image"], rng)
        if rng.random() < 0.3:
            sample["image"] = aug.random_gaussian_noise(sample["image"], rng)
        if rng.random() < 0.5:
            sample = aug.rotate_sample(sample, rng.uniform(-60.0, 60.0))
        if rng.random() < 0.5:
            sample = aug.hflip(sample, self.swap_pairs)
        sample["image"] = aug.photometric_distortion(sample["image"], rng)
        return self._stretch(sample, self.input_size)

    @staticmethod
    def _stretch(sample: aug.Sample, size_hw: tuple[int, int]) -> aug.Sample:
        """Resize ignoring aspect; image AREA when the width shrinks, else CUBIC; labels nearest (§2.3 step 9)."""
        width = sample["image"].shape[1]
        interpolation = cv2.INTER_AREA if size_hw[1] < width else cv2.INTER_CUBIC
        return aug.resize_sample(sample, size_hw, image_interpolation=interpolation)

    def keep(self, sample: aug.Sample) -> bool:
        labels = sample["labels"]
        return float(((labels > 0) & (labels != 255)).mean()) >= 0.01  # SegPackInputs (DENSE.md §2.3 step 10)

    def pack(self, sample: aug.Sample) -> dict[str, torch.Tensor]:
        return {"labels": torch.from_numpy(sample["labels"].astype(np.int64))}


class NormalDataset(_DenseDataset):
    """Surface normals: ``images/`` + ``normals/<name>.{npy,png}`` (+ ``masks/``) (DENSE.md §3.2 pipeline)."""

    task = "normal"

    def load(self, index: int) -> aug.Sample:
        return self.labelled.read(self.names[index])

    def transform(self, sample: aug.Sample, rng: np.random.Generator) -> aug.Sample:
        if not self.augment:
            return aug.normal_targets(aug.letterbox_sample(sample, self.input_size))
        sample = dict(sample, image=aug.photometric_distortion(sample["image"], rng))
        if rng.random() < 0.2:
            sample["image"] = aug.random_down_up_sample(sample["image"], rng, (0.1, 0.7))
        sample = self._geometric(sample, rng)
        if rng.random() < 0.3:
            sample["image"] = aug.random_gaussian_blur(sample["image"], rng)
        if rng.random() < 0.3:
            sample["image"] = aug.random_gaussian_noise(sample["image"], rng)
        if rng.random() < 0.3:
            sample["image"] = aug.solarize(sample["image"])
        return aug.normal_targets(sample)

    def keep(self, sample: aug.Sample) -> bool:
        return self._keep_valid(sample["mask"])

    def pack(self, sample: aug.Sample) -> dict[str, torch.Tensor]:
        gt = torch.from_numpy(np.ascontiguousarray(sample["normal"].transpose(2, 0, 1), dtype=np.float32))
        return {"gt_normal": gt, "mask": self._mask_tensor(sample)}


class PointmapDataset(_DenseDataset):
    """Pointmap: ``images/`` + ``pointmaps/<name>.npy`` or ``depth/<name>.npy`` + ``intrinsics/<name>.json``.

    The canonical target is generated from depth + K after augmentation (DENSE.md §4.2), so it is consistent with the
    image by construction. Option ``canonical_focal`` (default 768 pixels at the network input).
    """

    task = "pointmap"

    def __init__(self, root: PathLike, *, canonical_focal: float = CANONICAL_FOCAL, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self.canonical_focal = float(canonical_focal)

    def load(self, index: int) -> aug.Sample:
        sample = self.labelled.read(self.names[index])
        return {key: sample[key] for key in ("image", "depth", "mask", "K")}  # points are regenerated from depth + K

    def transform(self, sample: aug.Sample, rng: np.random.Generator) -> aug.Sample:
        if not self.augment:
            return aug.pointmap_targets(aug.letterbox_sample(sample, self.input_size), self.canonical_focal)
        sample = dict(sample, image=aug.photometric_distortion(sample["image"], rng))
        return aug.pointmap_targets(self._geometric(sample, rng), self.canonical_focal)

    def keep(self, sample: aug.Sample) -> bool:
        mask = sample["mask"]
        return self._keep_valid(mask) and float(sample["pointmap"][..., 2][mask].min()) >= 0.04  # §4.2 step 7

    def pack(self, sample: aug.Sample) -> dict[str, torch.Tensor]:
        return {
            "gt_pointmap": torch.from_numpy(np.ascontiguousarray(sample["pointmap"].transpose(2, 0, 1))),
            "mask": self._mask_tensor(sample),
            "gt_mean_depth": torch.tensor([sample["mean_depth"]], dtype=torch.float32),
            "scale": torch.tensor([sample["scale"]], dtype=torch.float32),
            "original_K": torch.from_numpy(sample["K"].astype(np.float32)),
        }


class AlbedoDataset(_DenseDataset):
    """Albedo: ``images/`` + ``albedo/<name>.png`` (+ ``masks/``) (DENSE.md §5.2 pipeline; no colour jitter)."""

    task = "albedo"

    def load(self, index: int) -> aug.Sample | None:
        name = self.names[index]
        sample = self.labelled.read(name)
        albedo, mask = sample["albedo"], sample["mask"]
        # Loader rejection: near-uniform albedo inside the mask (DENSE.md §5.1) -> redraw in training.
        if self.augment and (mask.sum() < 16 or albedo[mask].std(axis=0).max() < 0.02):
            logger.debug("albedo sample %s rejected: too few valid pixels or near-uniform albedo", name)
            return None
        return sample

    def transform(self, sample: aug.Sample, rng: np.random.Generator) -> aug.Sample:
        if not self.augment:
            return aug.letterbox_sample(sample, self.input_size)
        sample = self._geometric(sample, rng)
        if rng.random() < 0.2:
            sample["image"] = aug.random_gaussian_noise(sample["image"], rng)
        return sample

    def keep(self, sample: aug.Sample) -> bool:
        return self._keep_valid(sample["mask"])

    def pack(self, sample: aug.Sample) -> dict[str, torch.Tensor]:
        gt = torch.from_numpy(np.ascontiguousarray(sample["albedo"].transpose(2, 0, 1), dtype=np.float32))
        return {"gt_albedo": gt, "mask": self._mask_tensor(sample)}


class PoseDataset(_TaskDataset):
    """Top-down 308-keypoint pose: ``annotations.json`` (COCO style) + ``images/``; one sample per person.

    Targets (POSE.md §3): UDP Gaussian heatmaps (K, H/4, W/4), sigma 6, and per-keypoint weights (visible after the
    crop and inside the input). Pipeline (POSE.md §4.3): box -> centre/scale (padding 1.25), flip (p 0.5), half-body,
    box jitter and rotation, UDP warp, photometric distortion (p 0.8), blur / median blur (p 0.1 each), one
    coarse dropout hole.

    Args:
        root: dataset folder.
        annotations: annotation file name under ``root``.
        keypoint_format: joint layout of the annotations' ``keypoints`` (mapped into 308 ids).
        keypoint_set: a keypoint set of one's own (``sapiens2.labels``): the annotations hold its K keypoints in
            its name order (``keypoint_format`` is not read); its flip pairs flip and its half-body lists zoom.
        box: ``"auto"`` (the annotation ``bbox`` when present, else the tight box of the labelled keypoints, which is
            what the official training uses, POSE.md §4.2), ``"bbox"`` or ``"keypoints"``.
        split, input_size, augment, seed: see :func:`build_dataset`.

    Without augmentation (validation) items also carry what maps the crop back to the image: ``center`` (2,) and
    ``scale`` (2,) float32, the crop's box centre and aspect-fixed size in image pixels (what
    :func:`sapiens2.pose.topdown.heatmaps_to_image_keypoints` takes), and ``annotation`` int64, the person's
    position in the annotations file (0-based); :meth:`labels` is the ground truth to score them against.
    """

    def __init__(
        self,
        root: PathLike,
        *,
        annotations: str = "annotations.json",
        keypoint_format: str = "sapiens308",
        box: str = "auto",
        keypoint_set: KeypointMetadata | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(root, **kwargs)
        if self.input_size[0] % 4 or self.input_size[1] % 4:
            raise ValueError(f"pose input_size {self.input_size} must be divisible by 4 (heatmaps are 1/4 size)")
        if box not in ("auto", "bbox", "keypoints"):
            raise ValueError(f"box must be 'auto', 'bbox' or 'keypoints', got {box!r}")
        self.box = box
        self.annotations = annotations
        self.keypoint_format = keypoint_format
        # A keypoint set of one's own (sapiens2.labels): the annotations hold its keypoints in its name order.
        self.keypoint_set = keypoint_set
        self.num_keypoints = NUM_KEYPOINTS if keypoint_set is None else len(keypoint_set.names)
        if keypoint_set is None:
            self.ids = format_to_308_ids(keypoint_format)
        else:
            self.ids = np.arange(self.num_keypoints)
            keypoint_format = "the label set"
        path = self.root / annotations
        try:
            data = json.loads(path.read_text())
            images = {image["id"]: image["file_name"] for image in data["images"]}
            records = list(data["annotations"])
        except FileNotFoundError:
            raise FileNotFoundError(f"pose annotations {str(path)!r} do not exist") from None
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path} is not COCO-style JSON with 'images' and 'annotations': {error}") from None
        split_file = self.root / f"{self.split}.txt"
        listed = None
        if split_file.is_file():
            listed = {line.strip() for line in split_file.read_text().splitlines() if line.strip()}
        self.instances = []
        for number, record in enumerate(records):
            file_name = images.get(record.get("image_id"))
            if file_name is None:
                raise ValueError(f"{path}: annotation {number} refers to unknown image_id {record.get('image_id')!r}")
            if listed is not None and file_name not in listed and Path(file_name).stem not in listed:
                continue
            raw = np.asarray(record.get("keypoints", []), dtype=np.float64)
            if raw.size != 3 * len(self.ids):
                raise ValueError(
                    f"{path}: annotation {number} has {raw.size} keypoint numbers, expected {3 * len(self.ids)} "
                    f"({len(self.ids)} x (x, y, v) for keypoint_format={keypoint_format!r})"
                )
            if record.get("iscrowd", 0) or not (raw.reshape(-1, 3)[:, 2] > 0).any():
                continue  # crowd or unlabelled instances are skipped, as the reference (POSE.md §4.2)
            self.instances.append((self.root / "images" / file_name, raw.reshape(-1, 3), record.get("bbox"), number))
        self.names = [f"{path.stem}#{i}" for i, (path, *_) in enumerate(self.instances)]
        if not self.instances:
            raise ValueError(f"{path} holds no usable (labelled, non-crowd) person in split {self.split!r}")

    def load(self, index: int) -> aug.Sample:
        image_path, raw, bbox, number = self.instances[index]
        image = read_image(image_path)
        height, width = image.shape[:2]
        keypoints = np.zeros((self.num_keypoints, 2))
        visible = np.zeros(self.num_keypoints, dtype=np.float32)
        mapped = self.ids >= 0
        keypoints[self.ids[mapped]] = raw[mapped, :2]
        visible[self.ids[mapped]] = raw[mapped, 2] > 0
        x, y = keypoints[:, 0], keypoints[:, 1]
        visible *= (x > 0) & (x < width) & (y > 0) & (y < height)  # outside the image -> unlabelled (§4.2)
        keypoints[visible == 0] = 0.0
        if bbox is not None and self.box != "keypoints":
            bx, by, bw, bh = (float(v) for v in bbox)
            box = np.clip([bx, by, bx + bw, by + bh], 0, [width - 1, height - 1] * 2)
        elif self.box == "bbox":
            raise ValueError(f"box='bbox' but a person in {image_path} has no 'bbox'")
        elif visible.any():
            seen = keypoints[visible > 0]
            box = np.clip(np.concatenate([seen.min(axis=0), seen.max(axis=0)]), 0, [width, height] * 2)
        else:
            box = np.array([0, 0, width, height], dtype=np.float64)
        center = np.array([(box[0] + box[2]) / 2, (box[1] + box[3]) / 2], dtype=np.float32)
        scale = np.array([box[2] - box[0], box[3] - box[1]], dtype=np.float32) * np.float32(1.25)
        sample = {"image": image, "keypoints": keypoints, "visible": visible, "center": center, "scale": scale}
        return sample | {"annotation": number}

    def transform(self, sample: aug.Sample, rng: np.random.Generator) -> aug.Sample:
        angle = 0.0
        if self.augment:
            flip = None if self.keypoint_set is None else self.keypoint_set.flip_indices
            if rng.random() < 0.5:
                sample = aug.hflip(sample, flip_indices=flip)
            half = aug.pose_half_body(sample["keypoints"], sample["visible"], rng, keypoint_set=self.keypoint_set)
            if half is not None:
                sample = dict(sample, center=half[0], scale=half[1])
            center, scale, angle = aug.pose_random_box(sample["center"], sample["scale"], rng)
            sample = dict(sample, center=center, scale=scale)
        sample = aug.pose_warp(sample, angle, self.input_size)
        if self.augment:
            image = sample["image"]
            if rng.random() < 0.8:
                image = aug.photometric_distortion(image, rng)
            if rng.random() < 0.1:
                image = aug.random_blur(image, rng)
            if rng.random() < 0.1:
                image = aug.random_median_blur(image, rng)
            sample["image"] = aug.coarse_dropout(image, rng)
        height, width = self.input_size
        heatmaps, weights = encode_heatmaps(
            sample["keypoints"], sample["visible"], input_size=self.input_size, heatmap_size=(height // 4, width // 4)
        )
        return dict(sample, heatmaps=heatmaps, keypoint_weights=weights * sample["visible"])

    def pack(self, sample: aug.Sample) -> dict[str, torch.Tensor]:
        packed = {
            "heatmaps": torch.from_numpy(sample["heatmaps"]),
            "keypoint_weights": torch.from_numpy(sample["keypoint_weights"].astype(np.float32)),
        }
        if not self.augment:  # the crop is the plain box warp (no flip, jitter or rotation): it maps back
            packed["center"] = torch.from_numpy(np.asarray(sample["center"], dtype=np.float32))
            packed["scale"] = torch.from_numpy(np.asarray(sample["scale"], dtype=np.float32))
            packed["annotation"] = torch.tensor(sample["annotation"], dtype=torch.int64)
        return packed

    def labels(self) -> PoseLabels:
        """The split's ground truth as ``sapiens2 eval`` reads it (:func:`sapiens2.eval.pose.read_pose_labels`)."""
        from sapiens2.eval.pose import read_pose_labels

        return read_pose_labels(
            self.root,
            self.split,
            keypoint_format=self.keypoint_format,
            annotations=self.annotations,
            keypoint_set=self.keypoint_set,
        )


TASK_DATASETS: dict[str, type[_TaskDataset]] = {
    "seg": SegDataset,
    "normal": NormalDataset,
    "pointmap": PointmapDataset,
    "albedo": AlbedoDataset,
    "pose": PoseDataset,
}


def build_dataset(
    task: str,
    root: PathLike,
    *,
    split: str = "train",
    input_size: tuple[int, int] = (1024, 768),
    augment: bool = True,
    seed: int = 0,
    **options: Any,
) -> torch.utils.data.Dataset:
    """The training (or, with ``augment=False``, evaluation) dataset of ``task`` over the layout in this module.

    Example:
        >>> dataset = build_dataset("seg", "data/my_seg", input_size=(1024, 768), label_map="dome34_to_29")
        >>> sample = dataset[0]  # {"image": (3, 1024, 768) float32, "labels": (1024, 768) int64, "index": ()}

    Args:
        task: ``seg``, ``normal``, ``pointmap``, ``albedo`` or ``pose``.
        root: the dataset folder.
        split: name of an optional ``root/<split>.txt`` list of image names.
        input_size: network input (H, W).
        augment: run the official training pipeline; False gives the deterministic resize only.
        seed: base seed; sample i of epoch e draws from ``default_rng((seed, e, i))`` (see ``set_epoch``).
        **options: task options (seg: ``label_map``, ``num_classes``, ``background_dir``; pointmap:
            ``canonical_focal``; pose: ``annotations``, ``keypoint_format``, ``box``, ``keypoint_set``; seg also
            ``classes``: the label set of one's own, ``sapiens2.labels``).

    Returns:
        A map-style dataset whose items are dicts of tensors that the default collate stacks: ``image`` (3, H, W)
        float32 normalised RGB, ``index`` int64 and the task's targets (``labels``; ``gt_normal``, ``mask``;
        ``gt_pointmap``, ``mask``, ``gt_mean_depth``, ``scale``, ``original_K``; ``gt_albedo``, ``mask``;
        ``heatmaps``, ``keypoint_weights``), named as the arguments of ``sapiens2.train.losses``.
    """
    if task not in TASK_DATASETS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASK_DATASETS)}")
    return TASK_DATASETS[task](root, split=split, input_size=input_size, augment=augment, seed=seed, **options)
