"""The packaged assets: typed, read-only views of ``assets/keypoints308.json`` (the 308 keypoints, POSE.md §1) and
``assets/seg29.json`` (the 29 body-part classes, DENSE.md §2.1), each parsed once on first use; the sample photo.
"""

from __future__ import annotations

import difflib
import functools
import json
import types
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

__all__ = ["NUM_KEYPOINTS", "SAMPLE_IMAGE", "KeypointMetadata", "SegMetadata", "keypoint_metadata", "seg_metadata"]

NUM_KEYPOINTS = 308
SAMPLE_IMAGE = Path(__file__).resolve().parent / "assets" / "astronaut.jpg"
"""The packaged sample photo (512 x 512 RGB, public domain; ``assets/README.md``)."""


def _read_asset(name: str) -> dict:
    return json.loads((resources.files("sapiens2") / "assets" / name).read_text(encoding="utf-8"))


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class KeypointMetadata:
    """Everything the pipeline needs about the 308 keypoints (arrays are read-only; ids index the 308 axis).

    Attributes:
        names: 308 names in id order.
        flip_indices: (308,) int64 horizontal-flip permutation (an involution; face pairs are positional mirrors,
            never derive them from names, POSE.md §1.2).
        flip_pairs: 146 unordered (i, j) pairs, i < j.
        keypoint_colors: (308, 3) uint8 RGB.
        skeleton_links: (65, 2) int64 id pairs (body, feet, hands; no face links).
        skeleton_link_colors: (65, 3) uint8 RGB.
        sigmas: (308,) float64 OKS constants.
        groups: group name (body/foot/face/left_hand/right_hand/extra) -> ids in the config's order (body is
            in COCO-17 order).
        eval_subsets: xtcocotools iouType -> (json field, ids), POSE.md §6.
        upper_body_ids, lower_body_ids: the half-body augmentation lists (51 and 12 ids).
        coco_wholebody_to_308: the 53 name-matched (COCO-WholeBody index, 308 id) pairs of the reference.
        min_visible_keypoints: the training datasets' threshold (8).
    """

    names: tuple[str, ...]
    flip_indices: np.ndarray
    flip_pairs: tuple[tuple[int, int], ...]
    keypoint_colors: np.ndarray
    skeleton_links: np.ndarray
    skeleton_link_colors: np.ndarray
    sigmas: np.ndarray
    groups: Mapping[str, tuple[int, ...]]
    eval_subsets: Mapping[str, tuple[str, tuple[int, ...]]]
    upper_body_ids: tuple[int, ...]
    lower_body_ids: tuple[int, ...]
    coco_wholebody_to_308: tuple[tuple[int, int], ...]
    min_visible_keypoints: int

    def index(self, name: str) -> int:
        """Id of a keypoint name; unknown names raise ValueError with the closest matches."""
        try:
            return self.names.index(name)
        except ValueError:
            close = difflib.get_close_matches(name, self.names, n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ValueError(f"unknown keypoint name {name!r}{hint}") from None


@functools.cache
def keypoint_metadata() -> KeypointMetadata:
    """Load the 308-keypoint metadata from the package's ``assets/keypoints308.json`` (once; cached).

    Raises:
        ValueError: if the asset is inconsistent (wrong count, flip map not an involution).
    """
    data = _read_asset("keypoints308.json")
    names = tuple(data["names"])
    flip = np.asarray(data["flip_indices"], dtype=np.int64)
    if len(names) != NUM_KEYPOINTS or flip.shape != (NUM_KEYPOINTS,) or not np.array_equal(flip[flip], np.arange(308)):
        raise ValueError("assets/keypoints308.json is corrupt: expected 308 names and an involutive flip map")
    return KeypointMetadata(
        names=names,
        flip_indices=_frozen(flip),
        flip_pairs=tuple((int(a), int(b)) for a, b in data["flip_pairs"]),
        keypoint_colors=_frozen(np.asarray(data["keypoint_colors"], dtype=np.uint8)),
        skeleton_links=_frozen(np.asarray(data["skeleton_links"], dtype=np.int64)),
        skeleton_link_colors=_frozen(np.asarray(data["skeleton_link_colors"], dtype=np.uint8)),
        sigmas=_frozen(np.asarray(data["sigmas"], dtype=np.float64)),
        groups=types.MappingProxyType({name: tuple(group["ids"]) for name, group in data["groups"].items()}),
        eval_subsets=types.MappingProxyType(
            {name: (sub["json_field"], tuple(sub["ids"])) for name, sub in data["eval_subsets"].items()}
        ),
        upper_body_ids=tuple(data["upper_body_ids"]),
        lower_body_ids=tuple(data["lower_body_ids"]),
        coco_wholebody_to_308=tuple((int(a), int(b)) for a, b in data["coco_wholebody_to_308"]),
        min_visible_keypoints=int(data["dataset_meta"]["min_visible_keypoints"]),
    )


@dataclass(frozen=True)
class SegMetadata:
    """The 29-class body-part segmentation taxonomy of the released seg models (arrays are read-only).

    Attributes:
        class_names: 29 names in id order (0 = Background).
        palette: (29, 3) uint8 RGB colour of each id.
        ce_class_weights: the 29 cross-entropy class weights of the released seg configs.
        hflip_swap_pairs: the 8 (left id, right id) pairs a horizontal flip swaps.
        label_maps: official source taxonomy name (``dome34_to_29``, ``shutterstock52_to_29``,
            ``internal33_to_29``) -> {source id: target id}; source ids not listed map to 255 (ignore).
    """

    class_names: tuple[str, ...]
    palette: np.ndarray
    ce_class_weights: tuple[float, ...]
    hflip_swap_pairs: tuple[tuple[int, int], ...]
    label_maps: Mapping[str, Mapping[int, int]]


@functools.cache
def seg_metadata() -> SegMetadata:
    """Load the 29-class metadata from the package's ``assets/seg29.json`` (once; cached)."""
    data = _read_asset("seg29.json")
    tables = {name: table for name, table in data["source_mappings"].items() if not name.startswith("_")}
    return SegMetadata(
        class_names=tuple(data["class_names"]),
        palette=_frozen(np.asarray(data["palette_rgb"], dtype=np.uint8)),
        ce_class_weights=tuple(float(w) for w in data["ce_class_weights"]),
        hflip_swap_pairs=tuple((int(a), int(b)) for a, b in data["hflip_swap_pairs"]),
        label_maps=types.MappingProxyType(
            {
                name: types.MappingProxyType({row["source_id"]: row["target_id"] for row in table["rows"]})
                for name, table in tables.items()
            }
        ),
    )
