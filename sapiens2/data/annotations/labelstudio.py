"""Label Studio JSON both ways: keypointlabels as people, polygonlabels and brushlabels as class regions.

The structure is Label Studio's "JSON" export (labelstud.io/guide/export.html, "Label Studio JSON format"): a list
of tasks ``{"id", "data": {"image": URL}, "annotations": [{"result": [...], "was_cancelled", "ground_truth", ...}],
"predictions": [...]}``; each result region ``{"id", "type", "from_name", "to_name", "original_width",
"original_height", "image_rotation", "value": {...}}``, coordinates in percent of the image's width and height:
``keypointlabels`` ``{"x", "y", "width", "keypointlabels": [name]}``, ``polygonlabels`` ``{"points": [[x, y]...],
"polygonlabels": [name]}``, ``brushlabels`` ``{"format": "rle", "rle": [bytes], "brushlabels": [name]}`` (see
``rle.py``), ``rectanglelabels`` ``{"x", "y", "width", "height", "rotation", "rectanglelabels": [name]}``. A keypoint
drawn inside a selected rectangle carries the rectangle's id as ``parentID``: that is how people are told apart.
Pre-annotations go in ``predictions`` (``model_version``, ``score``; labelstud.io/guide/predictions.html).
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import numpy as np

from ..io import atomic_write, save_json
from .records import BACKGROUND, AnnotationError, Annotations, ImageLabels, Person, Region, read_json
from .rle import labelstudio_rle_decode, labelstudio_rle_encode

__all__ = ["labelstudio_config", "read_labelstudio", "read_labelstudio_config", "write_labelstudio"]

_UPLOAD_PREFIX = re.compile(r"^[0-9a-f]{8}-")  # Label Studio prefixes uploaded file names with 8 hex digits
KEYPOINT_SIZE = 0.5  # a keypoint's drawn size (``value.width``), percent of the image width


def read_labelstudio_config(path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """The keypoint names (``<KeyPointLabels>``) and class names (``<PolygonLabels>``/``<BrushLabels>``) of a Label
    Studio labeling config, in its order: what fixes the keypoint order and class ids of an import.

    Raises:
        AnnotationError: the file cannot be read or is not well-formed XML.
    """
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as error:
        raise AnnotationError(f"{path}: not a readable labeling config ({error})") from None
    keypoints = [label.get("value", "") for tag in root.iter("KeyPointLabels") for label in tag.iter("Label")]
    classes = [label.get("value", "") for name in ("PolygonLabels", "BrushLabels")
               for tag in root.iter(name) for label in tag.iter("Label")]  # fmt: skip
    return list(dict.fromkeys(keypoints)), list(dict.fromkeys(classes))


def _file_name(task: dict) -> str:
    data = task.get("data") or {}
    url = data.get("image") or next((v for v in data.values() if isinstance(v, str)), "")
    parsed = urlparse(url)
    local = parse_qs(parsed.query).get("d")  # /data/local-files/?d=folder/img.jpg
    if local:
        return unquote(local[0])
    return unquote(Path(parsed.path).name)


def upload_name(file_name: str) -> str | None:
    """The name a file had before Label Studio's upload prefixed it (``1a2b3c4d-img.jpg`` -> ``img.jpg``), or None."""
    name = Path(file_name).name
    return _UPLOAD_PREFIX.sub("", name) if _UPLOAD_PREFIX.match(name) else None


def _pick(task: dict, use_predictions: bool) -> dict | None:
    done = [a for a in task.get("annotations") or [] if not a.get("was_cancelled")]
    truth = [a for a in done if a.get("ground_truth")]
    if truth or done:
        return (truth or done)[-1]
    predictions = task.get("predictions") or []
    return predictions[-1] if use_predictions and predictions else None


def read_labelstudio(
    path: str | os.PathLike,
    *,
    keypoint_names: list[str] | None = None,
    class_names: list[str] | None = None,
    use_predictions: bool = False,
) -> Annotations:
    """Read a Label Studio JSON export.

    Each task's ground-truth annotation is read, else its last one not cancelled (with ``use_predictions``, else its
    last prediction). Keypoints with the same ``parentID`` are one person (the rectangle with that id is its box);
    keypoints without one are one person per task.

    Args:
        path: the export (a JSON list of tasks).
        keypoint_names, class_names: the label set's order (a labeling config's, see ``read_labelstudio_config``);
            without them, the order in which the file first uses each name. A name outside given lists is a problem
            line and its region is left out.
        use_predictions: read a task's prediction when it has no annotation (pre-annotations read back).

    Raises:
        AnnotationError: the file cannot be read or is not a Label Studio JSON export.
    """
    path = Path(path)
    tasks = read_json(path)
    if isinstance(tasks, dict):
        tasks = [tasks]
    if not isinstance(tasks, list) or not all(isinstance(t, dict) and "data" in t for t in tasks):
        raise AnnotationError(f"{path}: not a Label Studio JSON export (a list of tasks with 'data')")
    fixed_keypoints, fixed_classes = keypoint_names is not None, class_names is not None
    keypoints, classes = list(keypoint_names or []), list(class_names or [])
    picked = [(task, _pick(task, use_predictions)) for task in tasks]
    if not fixed_keypoints or not fixed_classes:
        for _, annotation in picked:
            for result in (annotation or {}).get("result") or []:
                kind, value = result.get("type"), result.get("value") or {}
                names = value.get(kind) if isinstance(value.get(kind), list) else []
                target = keypoints if kind == "keypointlabels" and not fixed_keypoints else None
                if kind in ("polygonlabels", "brushlabels") and not fixed_classes:
                    target = classes
                for name in names if target is not None else []:
                    if name not in target:
                        target.append(name)
    background = next((name for name in classes if name.lower() == BACKGROUND), None)
    if classes:
        classes = [background or BACKGROUND, *(name for name in classes if name != background)]
    person_label = next((value.get("rectanglelabels", ["person"])[0] for _, a in picked
                         for r in (a or {}).get("result") or [] if r.get("type") == "rectanglelabels"
                         for value in [r.get("value") or {}]), "person")  # fmt: skip
    annotations = Annotations(tuple(keypoints), (), tuple(classes), skeleton_label=person_label)
    for task, annotation in picked:
        if annotation is None:
            continue
        image = _read_task(path, task, annotation, annotations)
        if image is not None:
            annotations.images.append(image)
    return annotations


def _read_task(path: Path, task: dict, annotation: dict, annotations: Annotations) -> ImageLabels | None:
    name = _file_name(task)
    where = f"{path}: task {task.get('id', '?')} ({name})"
    results = [r for r in annotation.get("result") or [] if isinstance(r, dict)]
    sized = next((r for r in results if "original_width" in r and "original_height" in r), None)
    if sized is None:
        if results:
            annotations.problems.append(f"{where}: its results give no original_width/original_height; left out")
        return None
    width, height = int(sized["original_width"]), int(sized["original_height"])
    image = ImageLabels(name, width, height)
    index = {n: i for i, n in enumerate(annotations.keypoint_names)}
    people: dict[str, Person] = {}
    boxes = {r.get("id"): r.get("value") or {} for r in results if r.get("type") == "rectanglelabels"}
    for result in results:
        kind, value = result.get("type"), result.get("value") or {}
        label = (value.get(kind) or [""])[0] if isinstance(value.get(kind), list) else ""
        try:
            if kind == "keypointlabels":
                if label not in index:
                    raise ValueError(f"keypoint label {label!r} is not in the keypoint set "
                                     f"({', '.join(annotations.keypoint_names)})")  # fmt: skip
                parent = str(result.get("parentID") or "")
                if parent not in people:
                    people[parent] = Person(np.zeros((len(index), 3)), box=_box(boxes.get(parent), width, height))
                x, y = float(value["x"]) * width / 100, float(value["y"]) * height / 100
                if people[parent].keypoints[index[label], 2] > 0:
                    raise ValueError(f"keypoint {label!r} appears twice in one person; link each person's "
                                     "keypoints to a rectangle (draw them with the rectangle selected)")  # fmt: skip
                people[parent].keypoints[index[label]] = (x, y, 2)
            elif kind in ("polygonlabels", "brushlabels"):
                if label not in annotations.class_names:
                    raise ValueError(f"class {label!r} is not in the class list ({', '.join(annotations.class_names)})")
                if kind == "polygonlabels":
                    points = np.asarray(value["points"], dtype=np.float64).reshape(-1, 2) * [width / 100, height / 100]
                    if points.shape[0] < 3:
                        raise ValueError("a polygon needs at least 3 points")
                    low, high = points.min(axis=0), points.max(axis=0)
                    if not (high[0] > 0 and high[1] > 0 and low[0] < width and low[1] < height):
                        raise ValueError(f"the polygon lies outside the {width} x {height} image")
                    image.regions.append(Region(label, polygons=[points]))
                else:
                    if value.get("format", "rle") != "rle":
                        raise ValueError(f"brush format {value.get('format')!r} is not rle")
                    image.regions.append(Region(label, mask=labelstudio_rle_decode(value["rle"], (height, width))))
        except (KeyError, TypeError, ValueError) as error:
            text = f"no {error}" if isinstance(error, KeyError) else str(error)
            annotations.problems.append(f"{where}: {kind} region {result.get('id', '?')}: {text}; left out")
    image.people.extend(people.values())
    return image


def _box(value: dict | None, width: int, height: int) -> np.ndarray | None:
    if not value:
        return None
    return np.array([value["x"] * width, value["y"] * height, value["width"] * width, value["height"] * height]) / 100


def labelstudio_config(annotations: Annotations) -> str:
    """A Label Studio labeling config for these annotations: the image, the person rectangle, the keypoints and the
    classes (polygons, or brush masks when the regions are masks), under the names ``write_labelstudio`` uses."""
    lines = ["<View>", '  <Image name="image" value="$image" zoom="true"/>']
    if annotations.keypoint_names:
        lines.append('  <RectangleLabels name="person" toName="image">')
        lines.append(f'    <Label value="{_attr(annotations.skeleton_label)}"/>')
        lines.append("  </RectangleLabels>")
        lines.append('  <KeyPointLabels name="keypoints" toName="image" smart="false">')
        lines += [f'    <Label value="{_attr(name)}"/>' for name in annotations.keypoint_names]
        lines.append("  </KeyPointLabels>")
    if annotations.class_names:
        brush = any(r.mask is not None for image in annotations.images for r in image.regions)
        tag = "BrushLabels" if brush else "PolygonLabels"
        lines.append(f'  <{tag} name="classes" toName="image">')
        for index, name in enumerate(annotations.class_names):  # class 0 too: the ids stay the positions
            color = (
                ""
                if annotations.palette is None
                else ' background="#{:02x}{:02x}{:02x}"'.format(*annotations.palette[index])
            )
            lines.append(f'    <Label value="{_attr(name)}"{color}/>')
        lines.append(f"  </{tag}>")
    return "\n".join([*lines, "</View>", ""])


def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")


def write_labelstudio(
    annotations: Annotations,
    path: str | os.PathLike,
    *,
    model_version: str = "sapiens2",
    image_root: str = "/data/local-files/?d=",
    config_path: str | os.PathLike | None = None,
) -> Path:
    """Write ``annotations`` as Label Studio tasks with pre-annotations (``predictions``), atomically.

    Per image one task ``{"data": {"image": image_root + file_name}, "predictions": [{"model_version", "score",
    "result"}]}``: per person a ``rectanglelabels`` box (``person``) and its labelled keypoints (``keypointlabels``,
    ``parentID`` = the box, ``score`` the keypoint's); per class region its polygons (``polygonlabels``) or mask
    (``brushlabels``). The task's score is the mean of its region scores. With ``config_path`` the matching labeling
    config (``labelstudio_config``) is written there too.

    Returns:
        ``path``.
    """
    tasks = []
    for number, image in enumerate(annotations.images):
        results, scores = [], []
        size = {"original_width": image.width, "original_height": image.height, "image_rotation": 0}
        percent = np.array([100 / image.width, 100 / image.height])
        for person_number, person in enumerate(image.people):
            labelled = person.keypoints[:, 2] > 0
            if not labelled.any():
                continue
            box_id = f"p{number}_{person_number}"
            box = person.box if person.box is not None else _tight_box(person.keypoints[labelled, :2])
            (x, y), (w, h) = box[:2] * percent, box[2:] * percent
            region = {"id": box_id, "type": "rectanglelabels", "from_name": "person", "to_name": "image", **size,
                      "value": {"x": x, "y": y, "width": w, "height": h, "rotation": 0,
                                "rectanglelabels": [annotations.skeleton_label]}}  # fmt: skip
            if person.score is not None:
                region["score"] = float(person.score)
                scores.append(float(person.score))
            results.append(region)
            for k in np.flatnonzero(labelled):
                px, py = person.keypoints[k, :2] * percent
                point = {"id": f"{box_id}_k{k}", "type": "keypointlabels", "from_name": "keypoints",
                         "to_name": "image", **size, "parentID": box_id,
                         "value": {"x": px, "y": py, "width": KEYPOINT_SIZE,
                                   "keypointlabels": [annotations.keypoint_names[k]]}}  # fmt: skip
                if person.scores is not None:
                    point["score"] = float(person.scores[k])
                results.append(point)
        for region_number, region in enumerate(image.regions):
            base = {"type": "", "from_name": "classes", "to_name": "image", **size}
            if region.score is not None:
                base["score"] = float(region.score)
                scores.append(float(region.score))
            if region.mask is not None:
                if region.mask.any():
                    value = {"format": "rle", "rle": labelstudio_rle_encode(region.mask), "brushlabels": [region.label]}
                    results.append({**base, "id": f"r{number}_{region_number}", "type": "brushlabels", "value": value})
                continue
            for part, polygon in enumerate(region.polygons or []):
                value = {"points": (polygon * percent).tolist(), "closed": True, "polygonlabels": [region.label]}
                results.append({**base, "id": f"r{number}_{region_number}_{part}", "type": "polygonlabels",
                                "value": value})  # fmt: skip
        prediction = {"model_version": model_version, "score": float(np.mean(scores)) if scores else 0.0,
                      "result": results}  # fmt: skip
        tasks.append({"data": {"image": image_root + image.file_name}, "predictions": [prediction]})
    if config_path is not None:
        atomic_write(config_path, labelstudio_config(annotations).encode("utf-8"))
    return save_json(path, tasks, indent=None)


def _tight_box(points: np.ndarray) -> np.ndarray:
    low, high = points.min(axis=0), points.max(axis=0)
    return np.array([low[0], low[1], max(high[0] - low[0], 1.0), max(high[1] - low[1], 1.0)])
