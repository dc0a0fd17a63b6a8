"""Annotation tools' files both ways: read training labels from COCO, CVAT for images 1.1 (XML) and Label Studio
JSON exports (keypoints as skeletons, classes as polygons or RLE masks) into the training layout, and write
pre-annotations in the same formats.

    >>> from sapiens2.data.annotations import import_annotations, open_export, read_annotations
    >>> with open_export("task.zip") as (file, images):
    ...     report = import_annotations(read_annotations(file), images, "dataset/")

Everything here is plain data (``Annotations``): ``sapiens2.predict`` turns its results into it; ``sapiens2 labels
import`` is the command. Datumaro (CVAT's dataset framework) is not used: its 1.13 pins pandas 2.3, pyarrow 25 and
OpenCV < 5 below what sapiens2 runs with; its CVAT reader knows no ``<skeleton>`` (how CVAT exports keypoints; CVAT
reads its own with an extractor of its own) and stops at the first missing image; it reads no Label Studio export.
The tools' own code checks ours in the tests.
"""

from .coco import coco_dict, read_coco, write_coco
from .cvat import read_cvat, write_cvat
from .labelstudio import labelstudio_config, read_labelstudio, read_labelstudio_config, write_labelstudio
from .layout import FORMATS, ImportReport, detect_format, import_annotations, open_export, read_annotations
from .records import BACKGROUND, AnnotationError, Annotations, ImageLabels, Person, Region
from .rle import mask_to_polygons, polygons_to_mask

__all__ = [
    "BACKGROUND",
    "FORMATS",
    "AnnotationError",
    "Annotations",
    "ImageLabels",
    "ImportReport",
    "Person",
    "Region",
    "coco_dict",
    "detect_format",
    "import_annotations",
    "labelstudio_config",
    "mask_to_polygons",
    "open_export",
    "polygons_to_mask",
    "read_annotations",
    "read_coco",
    "read_cvat",
    "read_labelstudio",
    "read_labelstudio_config",
    "write_annotations",
    "write_coco",
    "write_cvat",
    "write_labelstudio",
]


def write_annotations(annotations: Annotations, path, fmt: str, **options):
    """Write ``annotations`` in ``fmt`` (one of ``FORMATS``) with that writer's ``options``; returns the path."""
    writers = {"coco": write_coco, "cvat": write_cvat, "labelstudio": write_labelstudio}
    if fmt not in writers:
        raise ValueError(f"unknown annotation format {fmt!r}; choose from {', '.join(FORMATS)}")
    return writers[fmt](annotations, path, **options)
