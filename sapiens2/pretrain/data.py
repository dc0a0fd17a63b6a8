"""Unlabelled pretraining images: an index of names built from folders, globs, manifests and WebDataset shards
(``sapiens2.data.collections``), decoded lazily per sample, so the corpus never has to fit in RAM or the disk cache.

The index holds only locations (a path/URL, or a tar file with the member's byte offset and size), so any sample can
be read by its number: the shared ``ResumableBatchSampler`` orders the epoch, workers decode in parallel, and a
resumed run reads exactly what the uninterrupted one would have. A sample that cannot be used (corrupt, short side
below ``min_short_side``, smaller than the global crop, rejected by the person filter) is skipped: the next index
takes its place and the skip is counted (``skipped`` in ``metrics.csv``) with one log line naming the file.
"""

from __future__ import annotations

import logging
import os
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import torch

from ..data.collections import CollectionError, Record, RecordError, decode_rgb, local_path, open_collection
from ..data.sources import IMAGE_EXTENSIONS
from .config import PretrainConfig, mask_grid
from .masking import draw_mask, mask_rng
from .views import make_views, views_rng

logger = logging.getLogger(__name__)

__all__ = ["ImageEntry", "PretrainDataset", "check_images", "largest_person_fraction", "list_images"]

# Consecutive unusable samples after which a worker stops with an error instead of skipping on.
MAX_CONSECUTIVE_SKIPS = 64


@dataclass(frozen=True)
class ImageEntry:
    """Where an image's bytes are: a file/URL (``offset`` -1), or ``size`` bytes at ``offset`` of tar ``where``."""

    source: str
    where: str
    offset: int = -1
    size: int = 0
    error: str | None = None

    def read(self) -> np.ndarray:
        """Decode to RGB uint8 (H, W, 3). Raises ``RecordError`` naming the source."""
        if self.error is not None:
            raise RecordError(self.source, self.error)
        if self.offset < 0:
            return Record(self.source, self.source, self.source, self.where).load_rgb()
        try:
            with open(self.where, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read(self.size)
        except OSError as error:
            raise RecordError(self.source, f"cannot read ({error.strerror or error})") from None
        return decode_rgb(data, self.source)


def _index_tar(location: str) -> list[ImageEntry]:
    """Each WebDataset sample's first image member of a local tar, by byte offset (headers only are read)."""
    path = local_path(location)
    if path is None:
        raise ValueError(
            f"data.sources: remote tar shard {location!r}: pretraining reads shards by offset, so they must be local "
            "files; list remote images in a manifest of URLs instead"
        )
    entries, seen = [], set()
    try:
        with tarfile.open(path, mode="r:") as archive:
            for member in archive:
                if not member.isfile():
                    continue
                name = PurePosixPath(member.name)
                stem, _, extension = name.name.partition(".")
                sample = str(name.parent / stem)
                if "." + extension.lower() not in IMAGE_EXTENSIONS or sample in seen:
                    continue
                seen.add(sample)
                entries.append(ImageEntry(f"{location}:{member.name}", str(path), member.offset_data, member.size))
    except (tarfile.TarError, OSError) as error:
        entries.append(ImageEntry(location, str(path), error=f"broken tar shard ({error})"))
    return entries


def list_images(sources: Sequence[str], skip: str | os.PathLike | None = None) -> list[ImageEntry]:
    """The index of every image in ``sources`` (folders, globs, manifests, tar shards, files), in a stable order.

    Raises:
        ValueError: a source does not exist or cannot be opened (one line naming it).
    """
    try:
        collection = open_collection(list(sources), skip=skip)
        entries: list[ImageEntry] = []
        for shard in collection.shards():
            if shard.kind == "tar":
                entries += _index_tar(shard.where)
            else:
                entries += [ImageEntry(r.source, r.location or r.source, error=r.error) for r in shard]
    except CollectionError as error:
        raise ValueError(f"data.sources: {error}") from None
    return entries


def largest_person_fraction(detections: np.ndarray, image_shape: tuple[int, ...], min_score: float) -> float:
    """Area of the largest detected person box (score >= ``min_score``) over the image area; 0 without one.

    Args:
        detections: (N, 5) [x1, y1, x2, y2, score] in image pixels (``PersonDetector`` output).
    """
    kept = detections[detections[:, 4] >= min_score] if len(detections) else detections
    if not len(kept):
        return 0.0
    areas = (kept[:, 2] - kept[:, 0]).clip(0) * (kept[:, 3] - kept[:, 1]).clip(0)
    return float(areas.max() / (image_shape[0] * image_shape[1]))


def usable_problem(image: np.ndarray, config: PretrainConfig, detector: Callable | None = None) -> str | None:
    """Why an image cannot be used for pretraining, or None."""
    height, width = image.shape[:2]
    if min(height, width) < config.data.min_short_side:
        return f"short side {min(height, width)} px < data.min_short_side {config.data.min_short_side}"
    global_h, global_w = config.views.global_size
    if height < global_h and width < global_w:
        return f"{height}x{width} px is smaller than the global crop {global_h}x{global_w} (views.global_size)"
    if detector is not None:
        fraction = largest_person_fraction(detector([image])[0], image.shape, config.data.min_person_score)
        if fraction < config.data.min_person_area:
            return f"no prominent person (largest person box {fraction:.1%} of the image < data.min_person_area)"
    return None


def check_images(entries: Sequence[ImageEntry], config: PretrainConfig, detector: Callable | None = None) -> None:
    """Before any compute: refuse an empty index, or one whose probed images (the first ``data.probe_images``)
    are all unusable, in one message naming the first problems; log a count when only some are."""
    sources = ", ".join(config.data.sources)
    if not entries:
        raise ValueError(f"data.sources ({sources}) hold no images ({', '.join(sorted(IMAGE_EXTENSIONS))})")
    probe = entries[: config.data.probe_images]
    problems = []
    for entry in probe:
        try:
            problem = usable_problem(entry.read(), config, detector)
        except RecordError as error:
            problem = str(error)
        if problem is not None:
            problems.append(problem if entry.source in problem else f"{entry.source}: {problem}")
    if probe and len(problems) == len(probe):
        shown = "; ".join(problems[:3]) + (f"; ... ({len(problems)} in all)" if len(problems) > 3 else "")
        raise ValueError(f"data.sources ({sources}): none of the {len(probe)} images checked is usable: {shown}")
    if problems:
        logger.warning("%d of the first %d images are unusable and will be skipped, e.g. %s", len(problems),
                       len(probe), problems[0])  # fmt: skip


class PretrainDataset(torch.utils.data.Dataset):
    """Sample i of epoch e: the views and masks of image i (or of the next usable one), all drawn from
    (seed, epoch, i), so they do not depend on workers, processes or resumes.

    Items: ``globals`` (2, 3, H, W), ``locals`` (n_local, 3, h, w), ``masks`` (n_global_student, Hm, Wm) bool
    (True = removed; the mask grid is the patch grid, or the window grid of the 4K tokenizer), ``block``
    (n_global_student,) bool, ``skipped`` (unusable samples passed over to reach this one).
    """

    def __init__(
        self,
        entries: Sequence[ImageEntry],
        config: PretrainConfig,
        use_tokenizer: bool,
        detector_factory: Callable[[], Callable] | None = None,
    ) -> None:
        self.entries = list(entries)
        self.config = config
        self.grid = mask_grid(config.views.global_size, use_tokenizer)
        self.epoch = 0
        self._detector_factory = detector_factory  # the detector is made lazily, in each worker process
        self._detector: Callable | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _detect(self) -> Callable | None:
        if self._detector is None and self._detector_factory is not None:
            self._detector = self._detector_factory()
        return self._detector

    def __getitem__(self, index: int) -> dict[str, Any]:
        config = self.config
        for skipped in range(MAX_CONSECUTIVE_SKIPS):
            entry = self.entries[(index + skipped) % len(self.entries)]
            try:
                image = entry.read()
                problem = usable_problem(image, config, self._detect())
            except RecordError as error:
                problem = str(error)
            if problem is None:
                break
            logger.warning("skipping %s", problem if entry.source in problem else f"{entry.source}: {problem}")
        else:
            raise RuntimeError(
                f"{MAX_CONSECUTIVE_SKIPS} unusable images in a row from {entry.source}: check data.sources"
            )
        globals_, locals_ = make_views(image, config.views, views_rng(config.seed, self.epoch, index))
        masks, blocks = [], []
        for view in range(config.views.n_global_student):
            mask, block = draw_mask(self.grid, config.masking, mask_rng(config.seed, self.epoch, index, view))
            masks.append(torch.from_numpy(mask))
            blocks.append(block)
        return {
            "globals": globals_,
            "locals": locals_,
            "masks": torch.stack(masks),
            "block": torch.tensor(blocks),
            "skipped": torch.tensor(skipped),
        }


def person_detector_factory(path: str | None) -> Callable[[], Callable]:
    """A factory of the RTMDet-m person detector on the CPU (built in each worker on first use)."""

    def make() -> Callable:
        from ..pose.detector import PersonDetector

        return PersonDetector.from_checkpoint(path, device="cpu")

    return make


def build_dataset(
    config: PretrainConfig, use_tokenizer: bool, skip: str | os.PathLike | None = None
) -> PretrainDataset:
    """List ``data.sources``, check them (before any compute) and return the dataset."""
    entries = list_images(config.data.sources, skip=skip)
    factory = person_detector_factory(config.data.detector) if config.data.person_filter else None
    check_images(entries, config, factory() if factory is not None else None)
    return PretrainDataset(entries, config, use_tokenizer, factory)
