"""Label sets as data: which keypoints a pose model predicts and which classes a seg model labels.

A label set is the released 308 keypoints / 29 classes (``metadata.keypoint_metadata()`` / ``seg_metadata()``) or a
set of your own, read from a small YAML/JSON file or a COCO file's ``categories``. Either way it is an instance of
the same types, ``KeypointMetadata`` and ``SegMetadata``, so every command takes the released sets and custom ones
through one path. A model file carries a custom set in its safetensors metadata (a JSON string under
``METADATA_KEY``); ``checkpoints.load_model`` reads it back onto the model (``labels_of(model)``), so ``predict``,
``eval``, ``export``, ``serve``, ``demo`` and ``video`` use its names, skeleton, palette, flip pairs and sigmas
without being told.

The file schema (``labels.yaml`` in a dataset folder; either section or both)::

    keypoints:
      names: [racket_tip, bar_end, left_wrist, right_wrist]        # required, unique
      flip_pairs: [[left_wrist, right_wrist]]                       # optional: else from left/right names
      skeleton: [[left_wrist, racket_tip], [right_wrist, bar_end]]  # optional, drawing only
      sigmas: {racket_tip: 0.05}                                     # optional: else the 308's, else 0.05
      colors: {racket_tip: [255, 0, 0]}                              # optional RGB: else the 308's, else a palette
    classes:
      names: [background, shirt, trousers, left_sleeve, right_sleeve]  # id = position; 0 = background
      palette: [[0, 0, 0], ...]                                         # optional, one RGB per class
      flip_pairs: [[left_sleeve, right_sleeve]]                         # optional: else from left/right names

The 308-specific fields of ``KeypointMetadata`` take these values for a custom set: ``groups`` and
``eval_subsets`` one group ``all`` of every keypoint (evaluated in the ``keypoints`` field), ``upper_body_ids`` /
``lower_body_ids`` the keypoints whose names are in the 308's half-body lists (the half-body augmentation needs
them), ``coco_wholebody_to_308`` empty, ``min_visible_keypoints`` 1. A custom ``SegMetadata`` has uniform
cross-entropy weights and no source-taxonomy ``label_maps``.
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .metadata import KeypointMetadata, SegMetadata, keypoint_metadata, seg_metadata

__all__ = [
    "DEFAULT_SIGMA",
    "LABEL_FILE",
    "METADATA_KEY",
    "LabelSet",
    "class_set",
    "default_label_set",
    "derived_flip_pairs",
    "is_released_set",
    "keypoint_set",
    "label_set_from_dict",
    "label_set_from_json",
    "labels_of",
    "matching_ids",
    "names_of",
    "output_count",
    "outputs_label_set",
    "read_label_set",
    "write_label_set",
]

DEFAULT_SIGMA = 0.05
"""OKS sigma of a keypoint the 308 does not have (about a COCO wrist's 0.062 and an elbow's 0.072, a little tighter:
set ``sigmas`` per name for points that are harder or easier to place)."""
METADATA_KEY = "labels"
"""The safetensors metadata key a model file keeps its (custom) label set under, as JSON."""
LABEL_FILE = "labels.yaml"
"""The label-set file ``sapiens2 train`` looks for in a dataset folder."""

# A fixed palette for names the released sets do not colour (tab20-like, then repeated).
_PALETTE = np.array(
    [
        [230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200], [245, 130, 48], [145, 30, 180],
        [70, 240, 240], [240, 50, 230], [210, 245, 60], [250, 190, 212], [0, 128, 128], [220, 190, 255],
        [170, 110, 40], [255, 250, 200], [128, 0, 0], [170, 255, 195], [128, 128, 0], [255, 215, 180],
        [0, 0, 128], [128, 128, 128],
    ],
    dtype=np.uint8,
)  # fmt: skip
# Left/right spellings a flip pair is derived from: (left, right) substrings, then prefixes and suffixes.
_SIDES = (("left", "right"), ("Left", "Right"), ("LEFT", "RIGHT"))
_AFFIXES = (("l_", "r_", "prefix"), ("L_", "R_", "prefix"), ("_l", "_r", "suffix"), ("_L", "_R", "suffix"))


@dataclass(frozen=True)
class LabelSet:
    """A keypoint set, a class list, or both (the sections of a label-set file).

    Attributes:
        keypoints: the keypoints of a pose model (None: the file has no ``keypoints`` section).
        classes: the classes of a seg model (None: no ``classes`` section).
    """

    keypoints: KeypointMetadata | None = None
    classes: SegMetadata | None = None

    def __deepcopy__(self, memo: dict) -> LabelSet:
        return self  # read-only data (frozen, read-only arrays): a model's copy shares it

    def for_task(self, task: str) -> KeypointMetadata | SegMetadata | None:
        """The part ``task`` uses: keypoints for pose, classes for seg, None for the other tasks."""
        return self.keypoints if task == "pose" else self.classes if task == "seg" else None

    def to_dict(self) -> dict[str, Any]:
        """The file schema as plain data (every field written out: names, pairs, skeleton, sigmas, colours)."""
        out: dict[str, Any] = {}
        if self.keypoints is not None:
            meta = self.keypoints
            names = meta.names
            out["keypoints"] = {
                "names": list(names),
                "flip_pairs": [[names[a], names[b]] for a, b in meta.flip_pairs],
                "skeleton": [[names[a], names[b]] for a, b in meta.skeleton_links.tolist()],
                "sigmas": {name: float(s) for name, s in zip(names, meta.sigmas, strict=True)},
                "colors": {name: [int(c) for c in rgb] for name, rgb in zip(names, meta.keypoint_colors, strict=True)},
            }
        if self.classes is not None:
            meta = self.classes
            names = meta.class_names
            out["classes"] = {
                "names": list(names),
                "palette": meta.palette.astype(int).tolist(),
                "flip_pairs": [[names[a], names[b]] for a, b in meta.hflip_swap_pairs],
            }
        return out

    def to_json(self) -> str:
        """``to_dict`` as compact JSON (what a model file's metadata holds)."""
        return json.dumps(self.to_dict(), separators=(",", ":"))


# --------------------------------------------------------------------------------------------------- building sets


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _unique_names(names: Iterable[Any], what: str) -> tuple[str, ...]:
    names = tuple(str(n) for n in names) if not isinstance(names, (str, bytes)) else ()
    if not names:
        raise ValueError(f"{what}.names must be a non-empty list of names")
    seen = {n for n in names if names.count(n) > 1}
    if seen:
        raise ValueError(f"{what}.names must be unique; repeated: {', '.join(sorted(seen))}")
    return names


def _pair_ids(pairs: Iterable[Sequence[Any]], names: tuple[str, ...], what: str) -> list[tuple[int, int]]:
    """Name (or id) pairs -> id pairs, each checked: two different known names, no name in two pairs."""
    out = []
    for pair in pairs:
        if isinstance(pair, (str, bytes)) or len(pair) != 2:
            raise ValueError(f"{what}: each entry must be a pair of names, got {pair!r}")
        ids = []
        for item in pair:
            if isinstance(item, (int, np.integer)) and not isinstance(item, bool) and 0 <= item < len(names):
                ids.append(int(item))
            elif str(item) in names:
                ids.append(names.index(str(item)))
            else:
                raise ValueError(f"{what}: unknown name {item!r} (names: {', '.join(names)})")
        if ids[0] == ids[1]:
            raise ValueError(f"{what}: a pair needs two different names, got {pair!r}")
        out.append((ids[0], ids[1]))
    return out


def _flip_ids(pairs: list[tuple[int, int]], count: int, what: str) -> tuple[np.ndarray, tuple[tuple[int, int], ...]]:
    """A flip permutation (an involution) and its sorted unordered pairs; a name in two pairs is refused."""
    flip = np.arange(count, dtype=np.int64)
    for a, b in pairs:
        if flip[a] != a or flip[b] != b:
            raise ValueError(f"{what}: a name appears in two flip pairs")
        flip[a], flip[b] = b, a
    return flip, tuple(sorted((min(a, b), max(a, b)) for a, b in pairs))


def _mirror_name(name: str) -> list[str]:
    """The names ``name`` would have on the other side (left <-> right spellings); empty if it has no side."""
    found = []
    for left, right in _SIDES:
        for a, b in ((left, right), (right, left)):
            if a in name:
                found.append(name.replace(a, b))
    for left, right, where in _AFFIXES:
        for a, b in ((left, right), (right, left)):
            if where == "prefix" and name.startswith(a):
                found.append(b + name[len(a) :])
            if where == "suffix" and name.endswith(a):
                found.append(name[: -len(a)] + b)
    return found


def derived_flip_pairs(names: Sequence[str]) -> list[tuple[int, int]]:
    """Left/right pairs found in the names (``left_x``/``right_x``, ``l_x``/``r_x``, ``x_left``/``x_right``,
    ``LeftX``/``RightX`` ...): id pairs, each once."""
    index = {name: i for i, name in enumerate(names)}
    pairs, used = [], set()
    for i, name in enumerate(names):
        if i in used:
            continue
        for other in _mirror_name(name):
            j = index.get(other)
            if j is not None and j != i and j not in used:
                pairs.append((i, j))
                used |= {i, j}
                break
    return pairs


def _colors(values: Any, names: tuple[str, ...], fallback: np.ndarray, what: str) -> np.ndarray:
    """(K, 3) uint8 from ``{name: rgb}`` or a list of RGB, the rest from ``fallback``."""
    colors = fallback.copy()
    if values is None:
        return colors
    items = values.items() if isinstance(values, Mapping) else zip(names, values, strict=False)
    if not isinstance(values, Mapping) and len(values) != len(names):
        raise ValueError(f"{what}: give one RGB colour per name ({len(names)}), got {len(values)}")
    for name, rgb in items:
        if name not in names:
            raise ValueError(f"{what}: unknown name {name!r}")
        rgb = np.asarray(rgb)
        if rgb.shape != (3,) or not np.all((rgb >= 0) & (rgb <= 255)):
            raise ValueError(f"{what}: colour of {name!r} must be three numbers 0-255, got {rgb.tolist()}")
        colors[names.index(name)] = rgb.astype(np.uint8)
    return colors


def keypoint_set(
    names: Sequence[str],
    *,
    flip_pairs: Iterable[Sequence[Any]] | None = None,
    skeleton: Iterable[Sequence[Any]] | None = None,
    sigmas: Mapping[str, float] | Sequence[float] | None = None,
    colors: Mapping[str, Sequence[int]] | Sequence[Sequence[int]] | None = None,
) -> KeypointMetadata:
    """A keypoint set as ``KeypointMetadata``; the 308 names in their order give the released set itself.

    Args:
        names: the K names, in the model's channel order.
        flip_pairs: left/right name (or id) pairs; None: derived from the names (``derived_flip_pairs``).
        skeleton: links as name (or id) pairs, for drawing; None: the 308's links between these names.
        sigmas: OKS sigmas by name (or a list of K); others: the 308's for a 308 name, else ``DEFAULT_SIGMA``.
        colors: RGB by name (or a list of K); others: the 308's for a 308 name, else a fixed palette.

    Raises:
        ValueError: repeated or unknown names, bad pairs, sigmas or colours (the field named).
    """
    names = _unique_names(names, "keypoints")
    released = keypoint_metadata()
    if names == released.names and flip_pairs is None and skeleton is None and sigmas is None and colors is None:
        return released
    count, known = len(names), {name: i for i, name in enumerate(released.names)}
    ids308 = [known.get(name, -1) for name in names]
    pairs = derived_flip_pairs(names) if flip_pairs is None else _pair_ids(flip_pairs, names, "keypoints.flip_pairs")
    flip, unordered = _flip_ids(pairs, count, "keypoints.flip_pairs")

    default_sigmas = np.array([released.sigmas[i] if i >= 0 else DEFAULT_SIGMA for i in ids308], dtype=np.float64)
    if sigmas is None:
        sigma_array = default_sigmas
    elif isinstance(sigmas, Mapping):
        sigma_array = default_sigmas.copy()
        for name, value in sigmas.items():
            if name not in names:
                raise ValueError(f"keypoints.sigmas: unknown name {name!r}")
            sigma_array[names.index(name)] = float(value)
    else:
        sigma_array = np.asarray(sigmas, dtype=np.float64).reshape(-1)
        if sigma_array.shape != (count,):
            raise ValueError(f"keypoints.sigmas: give one sigma per keypoint ({count}), got {sigma_array.size}")
    if not np.all(np.isfinite(sigma_array) & (sigma_array > 0)):
        raise ValueError("keypoints.sigmas must all be positive numbers")

    fallback = np.array(
        [released.keypoint_colors[i] if i >= 0 else _PALETTE[k % len(_PALETTE)] for k, i in enumerate(ids308)],
        dtype=np.uint8,
    ).reshape(count, 3)
    keypoint_colors = _colors(colors, names, fallback, "keypoints.colors")

    if skeleton is None:
        position = {i: k for k, i in enumerate(ids308) if i >= 0}
        kept = [
            (position[a], position[b], color)
            for (a, b), color in zip(released.skeleton_links.tolist(), released.skeleton_link_colors, strict=True)
            if a in position and b in position
        ]
        links = [(a, b) for a, b, _ in kept]
        link_colors = [color for _, _, color in kept]
    else:
        links = _pair_ids(skeleton, names, "keypoints.skeleton")
        link_colors = [keypoint_colors[a] for a, _ in links]

    half = {name: ids for name, ids in (("upper", released.upper_body_ids), ("lower", released.lower_body_ids))}
    everything = tuple(range(count))
    return KeypointMetadata(
        names=names,
        flip_indices=_frozen(flip),
        flip_pairs=unordered,
        keypoint_colors=_frozen(keypoint_colors),
        skeleton_links=_frozen(np.asarray(links, dtype=np.int64).reshape(-1, 2)),
        skeleton_link_colors=_frozen(np.asarray(link_colors, dtype=np.uint8).reshape(-1, 3)),
        sigmas=_frozen(sigma_array),
        groups=types.MappingProxyType({"all": everything}),
        eval_subsets=types.MappingProxyType({"all": ("keypoints", everything)}),
        upper_body_ids=tuple(k for k, i in enumerate(ids308) if i in half["upper"]),
        lower_body_ids=tuple(k for k, i in enumerate(ids308) if i in half["lower"]),
        coco_wholebody_to_308=(),
        min_visible_keypoints=1,
    )


def class_set(
    names: Sequence[str],
    *,
    palette: Sequence[Sequence[int]] | None = None,
    flip_pairs: Iterable[Sequence[Any]] | None = None,
) -> SegMetadata:
    """A class list as ``SegMetadata``; the 29 names in their order give the released set itself.

    Args:
        names: class names, id = position (0 is background by convention).
        palette: one RGB per class; None: the 29's colour for a name of the 29, else a fixed palette (black for id 0).
        flip_pairs: left/right name (or id) pairs a horizontal flip swaps; None: derived from the names.

    Raises:
        ValueError: repeated names, a wrong palette, bad pairs.
    """
    names = _unique_names(names, "classes")
    released = seg_metadata()
    if names == released.class_names and palette is None and flip_pairs is None:
        return released
    if len(names) > 255:
        raise ValueError(f"classes: at most 255 classes (255 is the ignore id), got {len(names)}")
    known = {name.lower(): i for i, name in enumerate(released.class_names)}
    fallback = np.zeros((len(names), 3), dtype=np.uint8)  # id 0 (background) black unless it is a name of the 29
    for k, name in enumerate(names):
        if name.lower() in known:
            fallback[k] = released.palette[known[name.lower()]]
        elif k:
            fallback[k] = _PALETTE[k % len(_PALETTE)]
    colors = _colors(palette, names, fallback, "classes.palette")
    pairs = derived_flip_pairs(names) if flip_pairs is None else _pair_ids(flip_pairs, names, "classes.flip_pairs")
    _, unordered = _flip_ids(pairs, len(names), "classes.flip_pairs")
    return SegMetadata(
        class_names=names,
        palette=_frozen(colors),
        ce_class_weights=(1.0,) * len(names),
        hflip_swap_pairs=unordered,
        label_maps=types.MappingProxyType({}),
    )


def default_label_set(task: str) -> LabelSet:
    """The released set of ``task``: the 308 keypoints (pose), the 29 classes (seg), empty for the other tasks."""
    if task == "pose":
        return LabelSet(keypoints=keypoint_metadata())
    if task == "seg":
        return LabelSet(classes=seg_metadata())
    return LabelSet()


def is_released_set(part: KeypointMetadata | SegMetadata | None) -> bool:
    """True for the released 308 keypoints or 29 classes (and None): what model files carry without saying."""
    if part is None:
        return True
    if isinstance(part, KeypointMetadata):
        return part is keypoint_metadata() or part.names == keypoint_metadata().names
    return part is seg_metadata() or part.class_names == seg_metadata().class_names


def matching_ids(names: Sequence[str], released: Sequence[str]) -> list[tuple[int, int]]:
    """(id in ``names``, id in ``released``) of every name the two share: the head channels a custom set takes
    from a released head (keypoint names exactly; class names ignoring case)."""
    position = {name.lower(): i for i, name in enumerate(released)}
    return [(k, position[name.lower()]) for k, name in enumerate(names) if name.lower() in position]


# --------------------------------------------------------------------------------------------------- reading files


def label_set_from_dict(data: Mapping[str, Any], source: str = "label set") -> LabelSet:
    """A LabelSet from the file schema as plain data (``LabelSet.to_dict`` inverts it).

    Raises:
        ValueError: naming ``source`` and the field at fault.
    """
    if not isinstance(data, Mapping) or not ({"keypoints", "classes"} & set(data)):
        raise ValueError(f"{source}: expected a 'keypoints' and/or 'classes' section")
    unknown = set(data) - {"keypoints", "classes"}
    if unknown:
        raise ValueError(f"{source}: unknown section(s) {', '.join(sorted(map(str, unknown)))}")
    try:
        keypoints = classes = None
        if data.get("keypoints") is not None:
            section = _section(data["keypoints"], "keypoints", ("names", "flip_pairs", "skeleton", "sigmas", "colors"))
            keypoints = keypoint_set(
                section.get("names") or (),
                flip_pairs=section.get("flip_pairs"),
                skeleton=section.get("skeleton"),
                sigmas=section.get("sigmas"),
                colors=section.get("colors"),
            )
        if data.get("classes") is not None:
            section = _section(data["classes"], "classes", ("names", "palette", "flip_pairs"))
            classes = class_set(
                section.get("names") or (), palette=section.get("palette"), flip_pairs=section.get("flip_pairs")
            )
    except (ValueError, TypeError) as error:
        raise ValueError(f"{source}: {error}") from None
    return LabelSet(keypoints=keypoints, classes=classes)


def _section(section: Any, what: str, fields: tuple[str, ...]) -> Mapping[str, Any]:
    if isinstance(section, list):  # a bare list of names
        return {"names": section}
    if not isinstance(section, Mapping):
        raise ValueError(f"{what} must be a mapping with 'names' (or a list of names)")
    unknown = [str(key) for key in section if key not in fields]
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {', '.join(unknown)}; fields: {', '.join(fields)}")
    return section


def label_set_from_json(text: str, source: str = "label set") -> LabelSet:
    """A LabelSet from ``LabelSet.to_json`` text (a model file's metadata)."""
    try:
        data = json.loads(text)
    except ValueError as error:
        raise ValueError(f"{source}: not valid JSON: {error}") from None
    return label_set_from_dict(data, source)


def _from_coco(data: Mapping[str, Any], source: str) -> LabelSet:
    """A COCO file's ``categories``: the first with ``keypoints`` gives the keypoint set (``skeleton`` 1-based id
    pairs; non-standard ``flip_pairs`` (name pairs) and ``sigmas`` (a list) honoured)."""
    categories = data.get("categories") or []
    with_keypoints = [c for c in categories if isinstance(c, Mapping) and c.get("keypoints")]
    if not with_keypoints:
        raise ValueError(f"{source}: COCO 'categories' hold no category with 'keypoints'")
    category = with_keypoints[0]
    names = list(category["keypoints"])
    skeleton = category.get("skeleton")
    try:
        if skeleton is not None:
            skeleton = [(int(a) - 1, int(b) - 1) for a, b in skeleton]
        keypoints = keypoint_set(
            names, flip_pairs=category.get("flip_pairs"), skeleton=skeleton, sigmas=category.get("sigmas")
        )
    except (ValueError, TypeError) as error:
        raise ValueError(f"{source}: COCO category {category.get('name', '?')!r}: {error}") from None
    return LabelSet(keypoints=keypoints)


def read_label_set(path: str | os.PathLike) -> LabelSet:
    """Read a label set: the YAML/JSON schema of this module, a COCO JSON's ``categories``, or an annotation tool's
    export (CVAT for images XML, Label Studio JSON; through ``sapiens2.data.annotations``); a dataset folder means its
    ``labels.yaml``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file cannot be read or does not hold a label set (one line naming it and the problem).
    """
    import yaml

    path = Path(path)
    if path.is_dir():
        path = path / LABEL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"label set {str(path)!r} does not exist")
    if path.suffix.lower() == ".xml":  # CVAT for images
        return _from_annotation_tool(path)
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path}: cannot read a label set: {reason}") from None
    if isinstance(data, list):  # a Label Studio export: a JSON array of tasks
        return _from_annotation_tool(path)
    if isinstance(data, Mapping) and "categories" in data and not ({"keypoints", "classes"} & set(data)):
        return _from_coco(data, str(path))
    return label_set_from_dict(data, str(path))


def _from_annotation_tool(path: Path) -> LabelSet:
    """A CVAT for images XML or a Label Studio JSON export, read by ``sapiens2.data.annotations`` (which imports
    nothing of this module); its label set comes back as the file schema, as plain data."""
    from .data.annotations import read_annotations

    return label_set_from_dict(read_annotations(path).label_set(), str(path))


def write_label_set(labels: LabelSet, path: str | os.PathLike) -> Path:
    """Write ``labels`` in the file schema (JSON for a ``.json`` path, else YAML); ``read_label_set`` reads it back
    to the same set."""
    import yaml

    from .data.io import atomic_write

    path = Path(path)
    data = labels.to_dict()
    if path.suffix.lower() == ".json":
        text = json.dumps(data, indent=2)
    else:
        text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    return atomic_write(path, text.encode("utf-8"))


# ------------------------------------------------------------------------------------------------------ on models


def labels_of(model: Any, task: str | None = None) -> LabelSet:
    """The label set of a model: what its file carried (``model.labels``, set by ``load_model``), else the released
    set of its task when the head has its size, else numbered names (``keypoint_0`` ..., ``class_0`` ...).

    ``model`` is a ``TaskModel``, an exported network with a ``labels`` attribute, or anything with ``task``.
    """
    carried = getattr(model, "labels", None)
    task = task or getattr(model, "task", None)
    if isinstance(carried, LabelSet) and carried.for_task(task) is not None:
        return carried
    return outputs_label_set(task, output_count(model, task))


def outputs_label_set(task: str | None, count: int | None) -> LabelSet:
    """The label set of a ``task`` head of ``count`` outputs whose file names none: the released set when the head
    has its size (or ``count`` is None: not known), else numbered names (``keypoint_0`` ..., ``class_0`` ...)."""
    released = default_label_set(task)
    part = released.for_task(task)
    if part is None or count is None or count == len(names_of(part)):
        return released
    if task == "pose":
        return LabelSet(keypoints=keypoint_set([f"keypoint_{i}" for i in range(count)], flip_pairs=()))
    return LabelSet(classes=class_set([f"class_{i}" for i in range(count)], flip_pairs=()))


def output_count(model: Any, task: str | None) -> int | None:
    """Output channels of a pose/seg head (keypoints / classes), None when the model does not say."""
    head = getattr(model, "decode_head", None)
    layer = getattr(head, {"pose": "conv_pose", "seg": "conv_seg"}.get(task or "", ""), None)
    return int(layer.out_channels) if layer is not None else None


def names_of(part: KeypointMetadata | SegMetadata) -> tuple[str, ...]:
    """The names of a keypoint set or a class list."""
    return part.names if isinstance(part, KeypointMetadata) else part.class_names
