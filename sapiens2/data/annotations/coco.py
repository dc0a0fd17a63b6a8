"""COCO both ways: keypoint annotations as people, instance ``segmentation`` (polygons or RLE) as class regions.

The structure is COCO's (cocodataset.org/#format-data, as CVAT's "COCO Keypoints 1.0" / "COCO 1.0" exports write
it): ``images`` ``{id, file_name, width, height}``, ``categories`` ``{id, name, keypoints?, skeleton? (1-based index
pairs)}``, ``annotations`` ``{id, image_id, category_id, keypoints? [x, y, v] * K, num_keypoints, bbox [x, y, w, h],
segmentation? [[x0, y0, x1, y1, ...], ...] | {size, counts}, area, iscrowd}``. The first category with
``keypoints`` is the keypoint set; the other categories are the classes in id order (``background`` first), but for
categories only boxes use. Non-standard fields
honoured: a keypoint category's ``flip_pairs`` (name pairs), an annotation's ``score`` and ``keypoint_scores``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..io import save_json
from .records import BACKGROUND, AnnotationError, Annotations, ImageLabels, Person, Region, read_json
from .rle import coco_rle_decode, coco_rle_encode

__all__ = ["coco_dict", "read_coco", "write_coco"]


def _load(path: Path) -> dict:
    data = read_json(path)
    if not isinstance(data, dict) or not all(isinstance(data.get(key), list) for key in ("images", "annotations")):
        raise AnnotationError(f"{path}: not a COCO file (no 'images' and 'annotations' lists)")
    return data


def read_coco(path: str | os.PathLike) -> Annotations:
    """Read a COCO keypoints and/or instances file (see the module docstring for what is read).

    Raises:
        AnnotationError: the file cannot be read or is not COCO.
    """
    path = Path(path)
    data = _load(path)
    categories = sorted((c for c in data.get("categories") or [] if isinstance(c, dict)), key=lambda c: c.get("id", 0))
    keypoint_category = next((c for c in categories if c.get("keypoints")), None)
    names = tuple(str(n) for n in keypoint_category["keypoints"]) if keypoint_category else ()
    skeleton: tuple[tuple[str, str], ...] = ()
    flip_pairs = None
    if keypoint_category:
        skeleton = tuple((names[a - 1], names[b - 1]) for a, b in keypoint_category.get("skeleton") or []
                         if 0 < a <= len(names) and 0 < b <= len(names))  # fmt: skip
        if keypoint_category.get("flip_pairs"):
            flip_pairs = tuple((str(a), str(b)) for a, b in keypoint_category["flip_pairs"])
    class_categories = [c for c in categories if c is not keypoint_category]
    items = [a for a in data["annotations"] if isinstance(a, dict)]
    used, segmented = (
        {a.get("category_id") for a in items},
        {a.get("category_id") for a in items if a.get("segmentation")},
    )
    # Classes: categories with masks or polygons, and those no annotation uses (a class absent from these images
    # keeps its id); not those only boxes use.
    class_categories = [c for c in class_categories if c.get("id") in segmented or c.get("id") not in used]
    classes = [str(c.get("name")) for c in class_categories]
    background = next((name for name in classes if name.lower() == BACKGROUND), None)
    if classes:
        classes = [background or BACKGROUND, *(name for name in classes if name != background)]
    class_of = {c.get("id"): str(c.get("name")) for c in class_categories}
    annotations = Annotations(
        keypoint_names=names,
        skeleton=skeleton,
        class_names=tuple(classes),
        skeleton_label=str(keypoint_category.get("name", "person")) if keypoint_category else "person",
        flip_pairs=flip_pairs,
    )
    images: dict[int, ImageLabels] = {}
    for image in data["images"]:
        try:
            images[image["id"]] = ImageLabels(str(image["file_name"]), int(image["width"]), int(image["height"]))
        except (KeyError, TypeError, ValueError):
            annotations.problems.append(f"{path}: image entry {image!r:.80} lacks id, file_name, width or height")
    for number, item in enumerate(data["annotations"]):
        where = f"{path}: annotation {item.get('id', number) if isinstance(item, dict) else number}"
        try:
            image = images[item["image_id"]]
        except (KeyError, TypeError):
            annotations.problems.append(f"{where}: its image_id names no image of the file; left out")
            continue
        try:
            if keypoint_category is not None and item.get("category_id") == keypoint_category.get("id"):
                _read_person(item, image, len(names))
            elif item.get("category_id") in class_of and item.get("segmentation"):
                _read_region(item, image, class_of[item["category_id"]])
        except (KeyError, TypeError, ValueError) as error:
            annotations.problems.append(f"{where}: {error}; left out")
    annotations.images.extend(images.values())
    return annotations


def _read_person(item: dict, image: ImageLabels, count: int) -> None:
    if item.get("iscrowd"):
        return  # a crowd region is no person (the training skips crowds too)
    values = np.asarray(item.get("keypoints") or [], dtype=np.float64)
    if values.size != 3 * count:
        raise ValueError(f"{values.size} keypoint numbers, the keypoint set needs {3 * count}")
    keypoints = values.reshape(count, 3)
    keypoints[:, 2] = np.clip(np.round(keypoints[:, 2]), 0, 2)
    box = np.asarray(item["bbox"], dtype=np.float64) if item.get("bbox") else None
    scores = np.asarray(item["keypoint_scores"], dtype=np.float64) if item.get("keypoint_scores") else None
    score = float(item["score"]) if item.get("score") is not None else None
    image.people.append(Person(keypoints, scores=scores, box=box, score=score))


def _read_region(item: dict, image: ImageLabels, label: str) -> None:
    segmentation = item["segmentation"]
    score = float(item["score"]) if item.get("score") is not None else None
    if isinstance(segmentation, dict):
        if [int(v) for v in segmentation.get("size", [])] != [image.height, image.width]:
            raise ValueError(f"the RLE size {segmentation.get('size')} is not the image's [{image.height}, "
                             f"{image.width}]")  # fmt: skip
        image.regions.append(Region(label, mask=coco_rle_decode(segmentation), score=score))
        return
    polygons = [np.asarray(p, dtype=np.float64).reshape(-1, 2) for p in segmentation]
    if any(p.shape[0] < 3 for p in polygons):
        raise ValueError("a polygon needs at least 3 points")
    low, high = np.min([p.min(axis=0) for p in polygons], axis=0), np.max([p.max(axis=0) for p in polygons], axis=0)
    if not (high[0] > 0 and high[1] > 0 and low[0] < image.width and low[1] < image.height):
        raise ValueError(f"the polygon lies outside the {image.width} x {image.height} image")
    image.regions.append(Region(label, polygons=polygons, score=score))


def coco_dict(annotations: Annotations) -> dict:
    """``annotations`` as a COCO dict: the keypoint category (id 1, ``skeleton`` 1-based) and the classes (ids from 2,
    class 0 too so that the list survives a round trip), people with ``bbox`` (theirs, else the tight box of their
    labelled keypoints), ``num_keypoints`` and, for predictions, ``score`` and ``keypoint_scores``; regions as
    ``segmentation`` polygons (``iscrowd`` 0) or compressed RLE (``iscrowd`` 1, as CVAT writes masks)."""
    names = annotations.keypoint_names
    categories, class_ids = [], {}
    if names:
        index = {name: i + 1 for i, name in enumerate(names)}
        links = [[index[a], index[b]] for a, b in annotations.skeleton]
        label = annotations.skeleton_label
        category = {"id": 1, "name": label, "supercategory": label, "keypoints": list(names), "skeleton": links}
        if annotations.flip_pairs is not None:
            category["flip_pairs"] = [list(pair) for pair in annotations.flip_pairs]
        categories.append(category)
    for offset, name in enumerate(annotations.class_names):
        class_ids[name] = 2 + offset
        categories.append({"id": 2 + offset, "name": name, "supercategory": ""})
    images, items = [], []
    for image_id, image in enumerate(annotations.images, start=1):
        images.append({"id": image_id, "file_name": image.file_name, "width": image.width, "height": image.height})
        for person in image.people:
            labelled = person.keypoints[:, 2] > 0
            box = person.box
            if box is None and labelled.any():
                low, high = person.keypoints[labelled, :2].min(axis=0), person.keypoints[labelled, :2].max(axis=0)
                box = np.concatenate([low, high - low])
            item = {"image_id": image_id, "category_id": 1, "keypoints": person.keypoints.ravel().tolist(),
                    "num_keypoints": int(labelled.sum()), "iscrowd": 0, "segmentation": [],
                    "bbox": [] if box is None else [float(v) for v in box],
                    "area": 0.0 if box is None else float(box[2] * box[3])}  # fmt: skip
            if person.score is not None:
                item["score"] = float(person.score)
            if person.scores is not None:
                item["keypoint_scores"] = [float(s) for s in person.scores]
            items.append(item)
        for region in image.regions:
            pixels = region.pixels((image.height, image.width))
            rows, cols = np.flatnonzero(pixels.any(axis=1)), np.flatnonzero(pixels.any(axis=0))
            if rows.size == 0:
                continue
            box = [float(cols[0]), float(rows[0]), float(cols[-1] - cols[0] + 1), float(rows[-1] - rows[0] + 1)]
            if region.mask is not None:
                segmentation, crowd = coco_rle_encode(region.mask), 1
            else:
                segmentation, crowd = [p.ravel().tolist() for p in region.polygons or []], 0
            item = {"image_id": image_id, "category_id": class_ids[region.label], "segmentation": segmentation,
                    "area": float(pixels.sum()), "bbox": box, "iscrowd": crowd}  # fmt: skip
            if region.score is not None:
                item["score"] = float(region.score)
            items.append(item)
    for number, item in enumerate(items, start=1):
        item["id"] = number
    return {"info": {"description": "written by sapiens2"}, "images": images, "categories": categories,
            "annotations": items}  # fmt: skip


def write_coco(annotations: Annotations, path: str | os.PathLike) -> Path:
    """Write ``annotations`` as a COCO file (``coco_dict``), atomically; returns ``path``."""
    return save_json(path, coco_dict(annotations), indent=None)
