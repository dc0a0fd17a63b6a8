"""CVAT for images 1.1 (XML) both ways: skeletons as people, polygons and masks as class regions.

The structure is CVAT's own (docs.cvat.ai "XML annotation format", version 1.1, and the exporter in
cvat/apps/dataset_manager/formats/cvat.py): ``<annotations><version>1.1</version><meta><task|job|project>...
<labels><label>`` with ``name``, ``color``, ``type`` (``skeleton``, ``points`` with a ``parent``, ``polygon``,
``mask``, ``any``...) and, for a skeleton, ``svg`` (``<circle data-node-id data-label-name>`` per point,
``<line data-node-from data-node-to>`` per link); then ``<image id name width height>`` holding ``<skeleton
label>`` with one ``<points label outside occluded points="x,y">`` per keypoint, ``<polygon label points="x,y;...">``
and ``<mask label rle left top width height>`` (rle: see ``rle.py``), each with ``z_order``.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from ..io import atomic_write
from .records import BACKGROUND, AnnotationError, Annotations, ImageLabels, Person, Region
from .rle import cvat_rle_decode, cvat_rle_encode

__all__ = ["read_cvat", "write_cvat"]

_CLASS_TYPES = ("polygon", "mask")  # labels of these types are classes even when no shape uses them
_NOT_CLASSES = ("skeleton", "points", "rectangle", "polyline", "cuboid", "ellipse", "tag")


def _text(element: ET.Element | None, tag: str, default: str = "") -> str:
    found = None if element is None else element.find(tag)
    return default if found is None or found.text is None else found.text.strip()


def _hex_color(text: str) -> tuple[int, int, int] | None:
    match = re.fullmatch(r"#?([0-9a-fA-F]{6})", text.strip())
    return None if match is None else tuple(int(match.group(1)[i : i + 2], 16) for i in (0, 2, 4))  # type: ignore[return-value]


def _skeleton_layout(svg: str, sublabels: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Point names in node order and links as name pairs, from a skeleton label's svg (CVAT stores it escaped in
    ``<svg>``); the sublabels' order when the svg names no points."""
    try:
        root = ET.fromstring(f"<svg>{svg}</svg>")
    except ET.ParseError:
        return sublabels, []
    nodes: dict[str, str] = {}
    for circle in root.iter("circle"):
        node, name = circle.get("data-node-id"), circle.get("data-label-name")
        if node is not None and name in sublabels:
            nodes[node] = name
    names = [nodes[key] for key in sorted(nodes, key=lambda k: int(k) if k.isdigit() else k)]
    names += [name for name in sublabels if name not in names]
    links = []
    for line in root.iter("line"):
        start, end = nodes.get(line.get("data-node-from", "")), nodes.get(line.get("data-node-to", ""))
        if start and end:
            links.append((start, end))
    return names, links


def _points(text: str) -> np.ndarray:
    pairs = [pair.split(",") for pair in text.strip().split(";") if pair.strip()]
    return np.array([[float(x), float(y)] for x, y in pairs], dtype=np.float64).reshape(-1, 2)


def read_cvat(path: str | os.PathLike, *, skeleton: str | None = None) -> Annotations:
    """Read a CVAT for images 1.1 XML export.

    Args:
        path: the ``annotations.xml``.
        skeleton: the skeleton label to read as the keypoint set (needed when the export has several).

    Returns:
        ``Annotations``: the skeleton's points (in the skeleton's node order) and links, the class list (labels of
        type polygon/mask, or of type any used by a polygon or mask; ``background`` first), the images.
        Problems with single shapes or images are lines in ``problems``; those shapes are left out.

    Raises:
        AnnotationError: the file cannot be read, is not well-formed XML, or is not a CVAT for images export.
    """
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as error:
        raise AnnotationError(f"{path}: not well-formed XML ({error})") from None
    except OSError as error:
        raise AnnotationError(f"{path}: cannot read ({error.strerror or error})") from None
    if root.tag != "annotations" or root.find("meta") is None:
        raise AnnotationError(f"{path}: not a CVAT for images export (no <annotations><meta>)")
    if root.find("track") is not None:
        raise AnnotationError(f"{path}: a CVAT for video export (tracks); export the task as 'CVAT for images 1.1'")
    labels_element = next(root.find("meta").iter("labels"), None)
    labels = [] if labels_element is None else labels_element.findall("label")
    kinds = {_text(label, "name"): _text(label, "type", "any") for label in labels}
    parents = {_text(label, "name"): _text(label, "parent") for label in labels}
    colors = {_text(label, "name"): _hex_color(_text(label, "color")) for label in labels}
    images = root.findall("image")
    skeletons = [name for name, kind in kinds.items() if kind == "skeleton"]
    used = [s.get("label", "") for image in images for s in image.iter("skeleton")]
    used_skeletons = [name for name in dict.fromkeys(used) if name in skeletons]
    problems = [f"{path}: skeleton label {name!r} is not among the task's skeleton labels; its skeletons are left out"
                for name in dict.fromkeys(used) if name not in skeletons]  # fmt: skip
    if skeleton is not None and skeleton not in skeletons:
        known = ", ".join(skeletons) or "none"
        raise AnnotationError(f"{path}: no skeleton label {skeleton!r}; its skeletons: {known}")
    if skeleton is None and len(used_skeletons) > 1:
        raise AnnotationError(
            f"{path}: {len(used_skeletons)} skeleton labels are used ({', '.join(used_skeletons)}); choose one"
        )
    chosen = skeleton or (used_skeletons[0] if used_skeletons else skeletons[0] if len(skeletons) == 1 else None)
    keypoint_names: list[str] = []
    links: list[tuple[str, str]] = []
    if chosen is not None:
        sublabels = [name for name, parent in parents.items() if parent == chosen]
        svg = next((_text(label, "svg") for label in labels if _text(label, "name") == chosen), "")
        keypoint_names, links = _skeleton_layout(svg, sublabels)
    shape_labels = {shape.get("label") for image in images for tag in ("polygon", "mask") for shape in image.iter(tag)}
    classes = [
        name
        for name, kind in kinds.items()
        if not parents[name] and kind not in _NOT_CLASSES and (kind in _CLASS_TYPES or name in shape_labels)
    ]
    background = next((name for name in classes if name.lower() == BACKGROUND), None)
    if classes:
        classes = [background or BACKGROUND, *(name for name in classes if name != background)]
    annotations = Annotations(
        keypoint_names=tuple(keypoint_names),
        skeleton=tuple(links),
        class_names=tuple(classes),
        skeleton_label=chosen or "person",
        palette=tuple(colors.get(name) or (0, 0, 0) for name in classes) if classes else None,
        problems=problems,
    )
    for image in images:
        labelled = _read_image(path, image, annotations, chosen)
        if labelled is not None:
            annotations.images.append(labelled)
    return annotations


def _read_image(path: Path, image: ET.Element, annotations: Annotations, chosen: str | None) -> ImageLabels | None:
    name = image.get("name", "")
    where = f"{path}: image {name or image.get('id', '?')!r}"
    try:
        width, height = int(image.get("width", "")), int(image.get("height", ""))
    except ValueError:
        annotations.problems.append(f"{where}: no width and height attributes; left out")
        return None
    labelled = ImageLabels(name, width, height)
    index = {n: i for i, n in enumerate(annotations.keypoint_names)}
    for shape in image.iter("skeleton"):
        if shape.get("label") != chosen:
            continue
        keypoints = np.zeros((len(index), 3), dtype=np.float64)
        for point in shape.findall("points"):
            label = point.get("label", "")
            if label not in index:
                annotations.problems.append(
                    f"{where}: point label {label!r} is not in the skeleton {chosen!r} "
                    f"({', '.join(annotations.keypoint_names)}); that point is left out"
                )
                continue
            try:
                xy = _points(point.get("points", ""))[0]
            except (ValueError, IndexError):
                annotations.problems.append(f"{where}: point {label!r} has no readable coordinates; left out")
                continue
            visibility = 0 if point.get("outside") == "1" else 1 if point.get("occluded") == "1" else 2
            keypoints[index[label]] = (xy[0], xy[1], visibility)
        labelled.people.append(Person(keypoints))
    for shape in image:
        if shape.tag not in ("polygon", "mask"):
            continue
        label = shape.get("label", "")
        if label not in annotations.class_names:
            continue  # a polygon of a label that is no class (a skeleton's helper shape): not ours to read
        z_order = int(shape.get("z_order", "0") or 0)
        try:
            if shape.tag == "polygon":
                polygon = _points(shape.get("points", ""))
                if polygon.shape[0] < 3:
                    raise ValueError("a polygon needs at least 3 points")
                if not _overlaps(polygon, width, height):
                    raise ValueError(f"the polygon lies outside the {width} x {height} image")
                labelled.regions.append(Region(label, polygons=[polygon], z_order=z_order))
            else:
                box = [int(float(shape.get(key, ""))) for key in ("left", "top", "width", "height")]
                mask = cvat_rle_decode(shape.get("rle", ""), *box, (height, width))
                labelled.regions.append(Region(label, mask=mask, z_order=z_order))
        except ValueError as error:
            annotations.problems.append(f"{where}: {shape.tag} of {label!r}: {error}; left out")
    return labelled


def _overlaps(polygon: np.ndarray, width: int, height: int) -> bool:
    low, high = polygon.min(axis=0), polygon.max(axis=0)
    return bool(high[0] > 0 and high[1] > 0 and low[0] < width and low[1] < height)


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attributes: str) -> ET.Element:
    element = ET.SubElement(parent, tag, attributes)
    if text is not None:
        element.text = text
    return element


def _skeleton_svg(names: tuple[str, ...], links: tuple[tuple[str, str], ...]) -> str:
    """A skeleton label's svg as CVAT's editor stores it: points on a circle in a 100 x 100 box, links as lines."""
    angles = np.linspace(0, 2 * np.pi, num=max(len(names), 1), endpoint=False)
    centres = {name: (50 + 40 * np.cos(a), 50 + 40 * np.sin(a)) for name, a in zip(names, angles, strict=True)}
    node = {name: i + 1 for i, name in enumerate(names)}
    parts = []
    for start, end in links:
        (x1, y1), (x2, y2) = centres[start], centres[end]
        parts.append(f'<line x1="{x1:.3f}" y1="{y1:.3f}" x2="{x2:.3f}" y2="{y2:.3f}" stroke="black" '
                     f'data-type="edge" data-node-from="{node[start]}" stroke-width="0.5" '
                     f'data-node-to="{node[end]}"></line>')  # fmt: skip
    for name in names:
        x, y = centres[name]
        parts.append(f'<circle r="1.5" stroke="black" fill="#b3b3b3" cx="{x:.3f}" cy="{y:.3f}" stroke-width="0.1" '
                     f'data-type="element node" data-element-id="{node[name]}" data-node-id="{node[name]}" '
                     f'data-label-name="{name}"></circle>')  # fmt: skip
    return "".join(parts)


def _color(annotations: Annotations, index: int) -> str:
    if annotations.palette is not None and index < len(annotations.palette):
        return "#{:02x}{:02x}{:02x}".format(*annotations.palette[index])
    return "#{:02x}{:02x}{:02x}".format(*(int(v) for v in np.random.default_rng(index).integers(0, 256, 3)))


def write_cvat(annotations: Annotations, path: str | os.PathLike, *, source: str = "auto", task: str = "") -> Path:
    """Write ``annotations`` as a CVAT for images 1.1 XML file (atomically), for CVAT's "Upload annotations".

    The task's labels in CVAT must carry the same names: the skeleton label (``skeleton_label``) with the keypoints
    as its points, and the classes (``polygon`` or ``mask`` labels, as the regions are). Keypoints with visibility 0
    are written ``outside="1"``, 1 ``occluded="1"``. Shapes are marked ``source`` (``auto`` for a model's).

    Returns:
        ``path``.
    """
    root = ET.Element("annotations")
    _sub(root, "version", "1.1")
    meta = _sub(root, "meta")
    task_element = _sub(meta, "task")
    _sub(task_element, "name", task or Path(path).stem)
    _sub(task_element, "size", str(len(annotations.images)))
    _sub(task_element, "mode", "annotation")
    labels = _sub(task_element, "labels")
    names = annotations.keypoint_names
    if names:
        label = _sub(labels, "label")
        _sub(label, "name", annotations.skeleton_label)
        _sub(label, "color", "#d12345")
        _sub(label, "type", "skeleton")
        _sub(label, "attributes")
        _sub(label, "svg", _skeleton_svg(names, annotations.skeleton))
        for index, name in enumerate(names):
            point = _sub(labels, "label")
            _sub(point, "name", name)
            _sub(point, "color", _color(annotations, index) if not annotations.class_names else "#b3b3b3")
            _sub(point, "type", "points")
            _sub(point, "attributes")
            _sub(point, "parent", annotations.skeleton_label)
    has_masks = any(region.mask is not None for image in annotations.images for region in image.regions)
    for index, name in enumerate(annotations.class_names):
        label = _sub(labels, "label")
        _sub(label, "name", name)
        _sub(label, "color", _color(annotations, index))
        _sub(label, "type", "mask" if has_masks else "polygon")
        _sub(label, "attributes")
    # No <dumped> time: the same results give the same bytes (a resumed run writes the file of a single run).
    for number, image in enumerate(annotations.images):
        element = _sub(root, "image", id=str(number), name=image.file_name, width=str(image.width),
                       height=str(image.height))  # fmt: skip
        for person in image.people:
            skeleton = _sub(element, "skeleton", label=annotations.skeleton_label, source=source, z_order="0")
            for name, (x, y, visibility) in zip(names, person.keypoints, strict=True):
                _sub(skeleton, "points", label=name, source=source, outside=str(int(visibility == 0)),
                     occluded=str(int(visibility == 1)), points=f"{x:.2f},{y:.2f}")  # fmt: skip
        for region in image.regions:
            common = {"label": region.label, "source": source, "occluded": "0"}
            if region.mask is not None:
                encoded = cvat_rle_encode(region.mask)
                if encoded is not None:
                    box = {key: str(value) for key, value in encoded.items()}
                    _sub(element, "mask", **common, **box, z_order=str(region.z_order))
                continue
            for polygon in region.polygons or []:
                text = ";".join(f"{x:.2f},{y:.2f}" for x, y in polygon)
                _sub(element, "polygon", **common, points=text, z_order=str(region.z_order))
    ET.indent(root, space="  ")
    data = b'<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode").encode("utf-8") + b"\n"
    return atomic_write(path, data)
