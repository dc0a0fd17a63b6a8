"""An annotation tool's export -> our training layout (docs/data_formats.md) with its ``labels.yaml``.

``DIR/images/<name>`` (copied), ``DIR/annotations.json`` (COCO keypoints in the label set's order, when the export
has keypoints), ``DIR/labels/<stem>.png`` (class ids, when it has classes) and ``DIR/labels.yaml`` (the label set).
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..io import ImageReadError, atomic_write, read_file_bytes, read_image, save_json, save_png
from .coco import coco_dict, read_coco
from .cvat import read_cvat
from .labelstudio import read_labelstudio, read_labelstudio_config, upload_name
from .records import AnnotationError, Annotations, ImageLabels, read_json

__all__ = ["FORMATS", "ImportReport", "detect_format", "import_annotations", "open_export", "read_annotations"]

FORMATS = ("coco", "cvat", "labelstudio")
"""The annotation formats read and written: COCO, CVAT for images 1.1 (XML) and Label Studio JSON."""


@dataclass
class ImportReport:
    """What ``import_annotations`` wrote: counts, and one line per problem (what it names was left out)."""

    output: Path
    images: int = 0
    people: int = 0
    regions: int = 0
    problems: list[str] = field(default_factory=list)


def detect_format(path: str | os.PathLike) -> str:
    """``cvat``, ``labelstudio`` or ``coco`` for an export file, by its content.

    Raises:
        AnnotationError: a file that is none of them (the message says what was found).
    """
    path = Path(path)
    if path.suffix.lower() == ".xml":
        return "cvat"
    data = read_json(path)
    if isinstance(data, list) or (isinstance(data, dict) and "data" in data):
        return "labelstudio"
    if isinstance(data, dict) and "images" in data and "annotations" in data:
        return "coco"
    raise AnnotationError(f"{path}: neither COCO (images, annotations) nor a Label Studio export (a list of tasks)")


@contextmanager
def open_export(path: str | os.PathLike) -> Iterator[tuple[Path, Path | None]]:
    """The annotation file of an export and its images folder (``images/`` beside the file, None when there is
    none): a file as it is; a folder
    holding ``annotations.xml`` (CVAT for images) or one ``.json`` (at its top or in ``annotations/``: COCO,
    Label Studio) and maybe ``images/``; or a ``.zip`` of such a folder, unpacked to a temporary folder for the
    ``with`` block.

    Raises:
        AnnotationError: no such file, a bad zip, or a folder with no (or several) annotation files.
    """
    path = Path(path)
    if not path.exists():
        raise AnnotationError(f"{path}: no such file or folder")
    if path.is_file() and path.suffix.lower() == ".zip":
        with tempfile.TemporaryDirectory(prefix="sapiens2-export-") as folder:
            try:
                with zipfile.ZipFile(path) as archive:
                    archive.extractall(folder)  # zipfile drops absolute and '..' parts of member names
            except (zipfile.BadZipFile, OSError) as error:
                raise AnnotationError(f"{path}: not a readable zip ({error})") from None
            with open_export(folder) as (file, images):
                yield file, images
        return
    if path.is_file():
        yield path, (path.parent / "images") if (path.parent / "images").is_dir() else None
        return
    candidates = [path / "annotations.xml"] if (path / "annotations.xml").is_file() else []
    candidates = candidates or sorted([*path.glob("*.json"), *path.glob("annotations/*.json")])
    if len(candidates) != 1:
        found = ", ".join(p.name for p in candidates) or "none"
        raise AnnotationError(f"{path}: a folder export needs one annotations.xml or one .json file; found: {found}")
    yield candidates[0], (path / "images") if (path / "images").is_dir() else None


def read_annotations(
    path: str | os.PathLike,
    *,
    skeleton: str | None = None,
    label_config: str | os.PathLike | None = None,
    use_predictions: bool = False,
) -> Annotations:
    """Read an export file of any of the ``FORMATS`` (found by ``detect_format``).

    Args:
        skeleton: CVAT: the skeleton label to read, when there are several.
        label_config: Label Studio: its labeling config (XML), which fixes the keypoint order and class ids.
        use_predictions: Label Studio: read a task's prediction when it has no annotation.

    Raises:
        AnnotationError: the file cannot be read at all (one line naming it and the problem).
    """
    kind = detect_format(path)
    if kind == "cvat":
        return read_cvat(path, skeleton=skeleton)
    if kind == "coco":
        return read_coco(path)
    names = read_labelstudio_config(label_config) if label_config is not None else (None, None)
    return read_labelstudio(path, keypoint_names=names[0], class_names=names[1], use_predictions=use_predictions)


def _find_image(images: Path, file_name: str) -> Path | None:
    name = Path(file_name).name
    for candidate in (file_name, name, upload_name(name)):
        if candidate and (images / candidate).is_file():
            return images / candidate
    return None


def import_annotations(annotations: Annotations, images: str | os.PathLike, output: str | os.PathLike,
                       *, source: str = "the export") -> ImportReport:  # fmt: skip
    """Write ``annotations`` and the images they name into the training layout in ``output``.

    Each image is found in ``images`` by the export's path, its file name, or its name before Label Studio's upload
    prefix. An image that is missing or unreadable, whose size is not the export's, or whose file name another image
    already took, is a problem line and is left out; the rest goes on.

    Returns:
        An ``ImportReport`` (its ``problems`` begin with the reader's).
    """
    images, output = Path(images), Path(output)
    report = ImportReport(output, problems=list(annotations.problems))
    kept: list[ImageLabels] = []
    taken: dict[str, str] = {}
    for image in annotations.images:
        found = _find_image(images, image.file_name)
        if found is None:
            report.problems.append(f"{source}: image {image.file_name!r} is named in the export but not found in "
                                   f"{images}; left out")  # fmt: skip
            continue
        if found.name in taken or Path(found.name).stem in {Path(n).stem for n in taken}:
            report.problems.append(f"{found}: another image of the export is already named {found.name!r} (or has "
                                   f"its stem); left out")  # fmt: skip
            continue
        try:
            data = read_file_bytes(found)
            height, width = read_image(found, max_megapixels=None).shape[:2]
        except ImageReadError as error:
            report.problems.append(f"{error}; left out")
            continue
        if (width, height) != (image.width, image.height):
            report.problems.append(f"{found}: the export says {image.width} x {image.height} pixels, the file has "
                                   f"{width} x {height}; left out")  # fmt: skip
            continue
        taken[found.name] = image.file_name
        atomic_write(output / "images" / found.name, data)
        if annotations.class_names:
            save_png(output / "labels" / f"{found.stem}.png", image.label_map(annotations.class_names))
        kept.append(ImageLabels(found.name, width, height, image.people, image.regions))
        report.images += 1
        report.people += len(image.people)
        report.regions += len(image.regions)
    if annotations.keypoint_names:
        people = [ImageLabels(i.file_name, i.width, i.height, i.people) for i in kept]  # the classes are in labels/
        pose = Annotations(annotations.keypoint_names, annotations.skeleton, (), people, annotations.skeleton_label,
                           annotations.flip_pairs)  # fmt: skip
        save_json(output / "annotations.json", coco_dict(pose), indent=None)
    text = yaml.safe_dump(annotations.label_set(), sort_keys=False, allow_unicode=True, default_flow_style=None)
    atomic_write(output / "labels.yaml", f"# imported from {source} by sapiens2 labels import\n{text}".encode())
    return report
