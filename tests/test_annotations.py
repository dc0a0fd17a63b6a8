"""Annotation tools both ways (sapiens2.data.annotations, ``sapiens2 labels import``): realistic CVAT for images 1.1
and Label Studio exports (tests/data/annotations, README there) of a 4-keypoint set and a 5-class set read into the
training layout; every writer read back by our reader; the RLE codecs against the tools' own code."""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from conftest import label_studio_python, require_module
from hypothesis import given, settings
from hypothesis import strategies as st

from sapiens2.cli import main
from sapiens2.data.annotations import (
    AnnotationError,
    Annotations,
    ImageLabels,
    Person,
    Region,
    read_annotations,
    read_coco,
    read_cvat,
    read_labelstudio,
    write_annotations,
)
from sapiens2.data.annotations.rle import (
    coco_rle_decode,
    coco_rle_encode,
    cvat_rle_decode,
    cvat_rle_encode,
    labelstudio_rle_decode,
    labelstudio_rle_encode,
    mask_to_polygons,
    polygons_to_mask,
)

DATA = Path(__file__).parent / "data" / "annotations"
CVAT = DATA / "cvat_racket" / "annotations.xml"
LABEL_STUDIO = DATA / "labelstudio_racket.json"
LABEL_STUDIO_CONFIG = DATA / "labelstudio_racket_config.xml"
KEYPOINTS = ("racket_tip", "bar_end", "left_wrist", "right_wrist")
CLASSES = ("background", "shirt", "trousers", "left_sleeve", "right_sleeve")
SIZE = (64, 96)  # (H, W) of both images

# The CVAT documentation's own <mask> example (a 13 x 15 disc), the export's right_sleeve at left 50, top 20.
CVAT_DOC_RLE = "3, 5, 7, 7, 5, 9, 3, 11, 2, 11, 2, 12, 1, 12, 1, 26, 1, 12, 1, 12, 2, 11, 3, 9, 5, 7, 7, 5, 3"


def box(rows: slice, cols: slice) -> np.ndarray:
    mask = np.zeros(SIZE, dtype=bool)
    mask[rows, cols] = True
    return mask


def write_images(folder: Path, *names: str) -> Path:
    """The exports' images: 96 x 64 PNGs."""
    folder.mkdir(parents=True, exist_ok=True)
    for number, name in enumerate(names):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        image = np.full((*SIZE, 3), 40 * number, np.uint8)
        cv2.imwrite(str(folder / name), image)
    return folder


# ---------------------------------------------------------------------------------------------------- reading exports


def test_cvat_export_gives_the_skeleton_in_node_order_the_classes_and_the_pixels_each_shape_covers():
    labels = read_cvat(CVAT)
    assert labels.problems == []
    assert labels.keypoint_names == KEYPOINTS and labels.skeleton_label == "racket_player"
    assert labels.skeleton == (("left_wrist", "racket_tip"), ("right_wrist", "bar_end"))
    assert labels.class_names == CLASSES  # no background label in the task: class 0 added
    assert labels.label_set() == {
        "keypoints": {"names": list(KEYPOINTS), "skeleton": [["left_wrist", "racket_tip"], ["right_wrist", "bar_end"]]},
        "classes": {"names": list(CLASSES), "palette": [[0, 0, 0], [36, 179, 83], [184, 61, 245], [255, 106, 77],
                                                         [42, 125, 209]]},
    }  # fmt: skip
    first, second = labels.images
    np.testing.assert_array_equal(first.people[0].keypoints,
                                  [[70.5, 12.25, 2], [60, 30, 1], [40.25, 20.75, 2], [30, 22, 2]])  # fmt: skip
    assert [person.keypoints[3, 2] for person in second.people] == [2, 0]  # outside="1": not labelled
    # Polygons cover the pixels whose centres they hold (a (10, 10)-(30, 20) rectangle: 20 x 10 pixels); the
    # sleeve (z_order 1) is drawn over the shirt.
    expected = np.zeros(SIZE, np.uint8)
    expected[10:20, 10:30] = 1
    expected[20:40, 10:30] = 2
    expected[10:16, 28:36] = 3
    np.testing.assert_array_equal(first.label_map(CLASSES), expected)
    # Masks: CVAT's row-major RLE inside the box, its documented example and a full 4 x 3 block.
    sleeve = second.label_map(CLASSES)
    np.testing.assert_array_equal(sleeve == 3, box(slice(5, 8), slice(5, 9)))
    disc = (sleeve == 4)[20:35, 50:63]
    assert disc.sum() == sum(int(n) for n in CVAT_DOC_RLE.split(", ")[1::2]) and (sleeve == 4).sum() == disc.sum()
    assert disc[0].tolist() == [False] * 3 + [True] * 5 + [False] * 5  # row-major: "3, 5" is row 0's first runs
    assert disc[7].all() and all(np.diff(row.astype(int)).clip(0).sum() <= 1 for row in disc)  # one run a row


def test_cvat_masks_decode_as_the_cvat_sdk_does():
    masks = require_module("cvat_sdk.masks")
    mask = cvat_rle_decode(CVAT_DOC_RLE, 50, 20, 13, 15, SIZE)
    runs = [int(n) for n in CVAT_DOC_RLE.split(", ")]
    np.testing.assert_array_equal(masks.decode_mask([*runs, 50, 20, 62, 34], image_width=96, image_height=64), mask)
    encoded = cvat_rle_encode(mask)
    assert masks.encode_mask(mask)[:-4] == [int(n) for n in encoded["rle"].split(", ")]
    assert masks.encode_mask(mask)[-4:] == [encoded["left"], encoded["top"], 62, 34]


def test_label_studio_export_groups_keypoints_by_their_rectangle_and_reads_percent_polygons_and_brushes():
    labels = read_labelstudio(LABEL_STUDIO)  # without the config: names in the order the export first uses them
    assert labels.keypoint_names == KEYPOINTS and labels.class_names == ("background", "shirt", "right_sleeve")
    labels = read_annotations(LABEL_STUDIO, label_config=LABEL_STUDIO_CONFIG)
    assert labels.problems == [] and labels.class_names == CLASSES and labels.skeleton_label == "racket_player"
    first, second = labels.images
    assert (first.file_name, second.file_name) == ("5f1c2a9e-court_000.png", "court/court_001.png")
    np.testing.assert_allclose(first.people[0].keypoints,
                               [[70.5, 12.25, 2], [60, 30, 2], [40.25, 20.75, 2], [30, 22, 2]], atol=1e-9)  # fmt: skip
    np.testing.assert_allclose(first.people[0].box, [8, 4, 70, 36])  # the rectangle the keypoints name as parent
    assert len(second.people) == 2 and second.people[1].keypoints[3, 2] == 0  # no right_wrist drawn: unlabelled
    np.testing.assert_array_equal(first.label_map(CLASSES) == 1, box(slice(10, 20), slice(10, 30)))
    np.testing.assert_array_equal(second.label_map(CLASSES) == 4, box(slice(30, 40), slice(40, 60)))


def test_label_studio_brush_rle_is_the_converters():
    brush = require_module("label_studio_converter.brush")
    rng = np.random.default_rng(0)
    for _ in range(8):
        mask = rng.random((int(rng.integers(1, 16)), int(rng.integers(1, 16)))) < rng.random()
        ours = labelstudio_rle_encode(mask)
        np.testing.assert_array_equal(brush.decode_rle(ours).reshape(*mask.shape, 4)[..., 3], mask * 255)
        np.testing.assert_array_equal(labelstudio_rle_decode(brush.mask2rle(mask.astype(np.uint8) * 255),
                                                             mask.shape), mask)  # fmt: skip


def test_coco_rle_strings_are_pycocotools():
    coco_mask = require_module("pycocotools.mask")
    rng = np.random.default_rng(1)
    for _ in range(50):
        mask = rng.random((int(rng.integers(1, 40)), int(rng.integers(1, 40)))) < rng.random()
        reference = coco_mask.encode(np.asfortranarray(mask.astype(np.uint8)))
        assert coco_rle_encode(mask)["counts"] == reference["counts"].decode()
        np.testing.assert_array_equal(coco_rle_decode(reference), mask)


def test_polygons_fill_the_pixels_pycocotools_fills_up_to_their_edges():
    coco_mask = require_module("pycocotools.mask")
    rng = np.random.default_rng(2)
    for _ in range(100):
        points = rng.random((12, 2)) * [96, 64]  # convex outlines (pycocotools drops the last row of one past the edge)
        hull = cv2.convexHull(points.astype(np.float32)).reshape(-1, 2).astype(np.float64)
        ours = polygons_to_mask([hull], SIZE)
        theirs = coco_mask.decode(coco_mask.frPyObjects([hull.ravel().tolist()], *SIZE))[..., 0].astype(bool)
        rows, cols = np.nonzero(ours ^ theirs)
        contour = hull.astype(np.float32).reshape(-1, 1, 2)
        distances = [
            abs(cv2.pointPolygonTest(contour, (c + 0.5, r + 0.5), True)) for r, c in zip(rows, cols, strict=True)
        ]
        assert max(distances, default=0) < 1  # they differ only on pixels whose centre is within a pixel of an edge
        assert (ours & theirs).sum() >= 0.97 * (ours | theirs).sum()


# ----------------------------------------------------------------------------------------------------------- codecs


masks_strategy = st.integers(1, 24).flatmap(
    lambda h: st.integers(1, 24).flatmap(
        lambda w: st.lists(st.booleans(), min_size=h * w, max_size=h * w).map(
            lambda bits: np.array(bits, dtype=bool).reshape(h, w)
        )
    )
)


@settings(max_examples=60, deadline=None)
@given(mask=masks_strategy)
def test_every_rle_codec_decodes_what_it_encodes(mask):
    np.testing.assert_array_equal(coco_rle_decode(coco_rle_encode(mask)), mask)
    np.testing.assert_array_equal(coco_rle_decode(coco_rle_encode(mask, compressed=False)), mask)
    np.testing.assert_array_equal(labelstudio_rle_decode(labelstudio_rle_encode(mask), mask.shape), mask)
    encoded = cvat_rle_encode(mask)
    if mask.any():
        got = cvat_rle_decode(encoded["rle"], *(encoded[k] for k in ("left", "top", "width", "height")), mask.shape)
        np.testing.assert_array_equal(got, mask)
    else:
        assert encoded is None  # CVAT has no empty mask


@settings(max_examples=40, deadline=None)
@given(mask=masks_strategy)
def test_polygon_outlines_give_back_every_region_without_holes(mask):
    outer = np.zeros_like(mask)  # the mask with its holes filled: what an outline can describe
    for polygon in mask_to_polygons(mask):
        outer |= polygons_to_mask([polygon], mask.shape)
    filled = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)[0]
    expected = cv2.drawContours(np.zeros(mask.shape, np.uint8), filled, -1, 1, thickness=cv2.FILLED).astype(bool)
    np.testing.assert_array_equal(outer, expected)


@settings(max_examples=40, deadline=None)
@given(
    width=st.integers(1, 5000),
    height=st.integers(1, 5000),
    points=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=4, max_size=4),
)
def test_label_studio_percent_coordinates_give_back_the_pixels(tmp_path_factory, width, height, points):
    keypoints = np.array([[x * width, y * height, 2] for x, y in points])
    labels = Annotations(KEYPOINTS, (), (), [ImageLabels("a.png", width, height, [Person(keypoints)])])
    path = tmp_path_factory.mktemp("ls") / "tasks.json"
    write_annotations(labels, path, "labelstudio")
    back = read_labelstudio(path, keypoint_names=list(KEYPOINTS), use_predictions=True)
    np.testing.assert_allclose(back.images[0].people[0].keypoints, keypoints, rtol=0, atol=1e-9 * max(width, height))


# ------------------------------------------------------------------------------------------------------- round trips


def _predictions(masks: str) -> Annotations:
    """Labels as predict makes them: two people with scores, four classes as polygons or masks."""
    rng = np.random.default_rng(3)
    people = []
    for _ in range(2):
        keypoints = np.concatenate([rng.random((4, 2)) * [95, 63], [[2], [2], [0], [2]]], axis=1)
        people.append(Person(keypoints, scores=rng.random(4), box=np.array([1.0, 2.0, 50.0, 40.0]), score=0.8))
    label_map = np.zeros(SIZE, np.uint8)
    label_map[5:30, 10:40], label_map[30:60, 10:40], label_map[8:20, 50:70], label_map[40:50, 60:90] = 1, 2, 3, 4
    regions = []
    for class_id in range(1, 5):
        mask = label_map == class_id
        if masks == "rle":
            regions.append(Region(CLASSES[class_id], mask=mask, score=0.5))
        else:
            regions.append(Region(CLASSES[class_id], polygons=mask_to_polygons(mask), score=0.5))
    image = ImageLabels("court_000.png", SIZE[1], SIZE[0], people, regions)
    return Annotations(KEYPOINTS, (("left_wrist", "racket_tip"),), CLASSES, [image], "racket_player")


@pytest.mark.parametrize("masks", ["polygon", "rle"])
@pytest.mark.parametrize("fmt", ["coco", "cvat", "labelstudio"])
def test_every_writer_reads_back_to_the_same_points_and_label_maps(fmt, masks, tmp_path):
    labels = _predictions(masks)
    config = {"config_path": tmp_path / "config.xml"} if fmt == "labelstudio" else {}  # Label Studio: the names' order
    path = write_annotations(labels, tmp_path / f"labels.{'xml' if fmt == 'cvat' else 'json'}", fmt, **config)
    back = read_annotations(path, use_predictions=True, label_config=config.get("config_path"))
    assert back.problems == []
    assert back.keypoint_names == KEYPOINTS and back.class_names == CLASSES
    original, read = labels.images[0], back.images[0]
    assert (read.width, read.height) == (original.width, original.height)
    for ours, theirs in zip(original.people, read.people, strict=True):
        labelled = ours.keypoints[:, 2] > 0
        np.testing.assert_array_equal(theirs.keypoints[:, 2] > 0, labelled)
        np.testing.assert_allclose(theirs.keypoints[labelled, :2], ours.keypoints[labelled, :2], atol=0.005)
    np.testing.assert_array_equal(read.label_map(CLASSES), original.label_map(CLASSES))


def test_our_coco_file_loads_in_pycocotools_with_the_same_masks(tmp_path):
    coco = require_module("pycocotools.coco")
    labels = _predictions("rle")
    write_annotations(labels, tmp_path / "coco.json", "coco")
    ground_truth = coco.COCO(str(tmp_path / "coco.json"))
    masks = {ground_truth.cats[a["category_id"]]["name"]: ground_truth.annToMask(a)
             for a in ground_truth.loadAnns(ground_truth.getAnnIds()) if a["segmentation"]}  # fmt: skip
    for region in labels.images[0].regions:
        np.testing.assert_array_equal(masks[region.label].astype(bool), region.mask)
    assert ground_truth.cats[1]["keypoints"] == list(KEYPOINTS) and ground_truth.cats[1]["skeleton"] == [[3, 1]]


def test_our_cvat_file_has_the_structure_cvat_imports(tmp_path):
    """CVAT for images 1.1 as CVAT's own exporter writes it (docs.cvat.ai XML format): version, the labels with the
    skeleton's svg and sublabels, then images with skeletons of points and shapes of known labels."""
    labels = _predictions("rle")
    root = ET.parse(write_annotations(labels, tmp_path / "a.xml", "cvat", source="auto")).getroot()
    assert root.tag == "annotations" and root.findtext("version") == "1.1"
    task_labels = {label.findtext("name"): label for label in root.find("meta/task/labels")}
    assert task_labels["racket_player"].findtext("type") == "skeleton"
    svg = ET.fromstring(f"<svg>{task_labels['racket_player'].findtext('svg')}</svg>")
    assert [c.get("data-label-name") for c in svg.iter("circle")] == list(KEYPOINTS)
    assert [task_labels[name].findtext("parent") for name in KEYPOINTS] == ["racket_player"] * 4
    for image in root.iter("image"):
        assert set(image.attrib) == {"id", "name", "width", "height"}
        for shape in image:
            assert shape.get("label") in task_labels and shape.get("source") == "auto"
            for point in shape.iter("points"):
                assert point.get("label") in KEYPOINTS and point.get("outside") in ("0", "1")


def test_label_studio_predictions_carry_the_model_version_scores_and_a_matching_config(tmp_path):
    labels = _predictions("polygon")
    path = write_annotations(labels, tmp_path / "tasks.json", "labelstudio", model_version="sapiens2-1b",
                             config_path=tmp_path / "config.xml")  # fmt: skip
    (task,) = json.loads(path.read_text())
    (prediction,) = task["predictions"]
    assert prediction["model_version"] == "sapiens2-1b" and 0 <= prediction["score"] <= 1
    assert task["data"]["image"] == "/data/local-files/?d=court_000.png" and "annotations" not in task
    config = ET.parse(tmp_path / "config.xml").getroot()
    declared = {tag.get("name"): [label.get("value") for label in tag] for tag in config if tag.tag != "Image"}
    for region in prediction["result"]:
        assert region["value"][region["type"]][0] in declared[region["from_name"]]
        assert region["to_name"] == "image" and "score" in region
    assert declared["keypoints"] == list(KEYPOINTS) and declared["classes"] == list(CLASSES)


# ----------------------------------------------------------------------------------------------- the import command


def test_labels_import_writes_the_training_layout_from_a_cvat_export(tmp_path, capsys):
    export = tmp_path / "task_export"
    shutil.copytree(CVAT.parent, export)
    write_images(export / "images", "court_000.png", "court_001.png")
    archive = shutil.make_archive(str(tmp_path / "task"), "zip", export)  # CVAT's download: a zip
    out = tmp_path / "dataset"
    assert main(["labels", "import", archive, "-o", str(out)]) == 0, capsys.readouterr().err
    assert "2 images, 3 people with 4 keypoints, 5 regions of 5 classes" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "images").iterdir()) == ["court_000.png", "court_001.png"]
    label_set = yaml.safe_load((out / "labels.yaml").read_text())
    assert label_set["keypoints"]["names"] == list(KEYPOINTS) and label_set["classes"]["names"] == list(CLASSES)
    coco = json.loads((out / "annotations.json").read_text())
    assert coco["categories"][0]["keypoints"] == list(KEYPOINTS)
    first = next(a for a in coco["annotations"] if a["image_id"] == 1)
    assert first["keypoints"] == [70.5, 12.25, 2, 60, 30, 1, 40.25, 20.75, 2, 30, 22, 2]
    label_map = cv2.imread(str(out / "labels" / "court_000.png"), cv2.IMREAD_UNCHANGED)
    assert label_map.dtype == np.uint8 and label_map.shape == SIZE
    assert [int((label_map == c).sum()) for c in range(5)] == [96 * 64 - 636, 188, 400, 48, 0]


def test_the_imported_seg_set_loads_in_the_training_dataset(tmp_path, capsys):
    from sapiens2.train.datasets import build_dataset

    write_images(tmp_path / "images", "court_000.png", "court_001.png")
    assert main(["labels", "import", str(CVAT), "-o", str(tmp_path / "set"), "--images", str(tmp_path / "images")]) == 0
    sample = build_dataset("seg", tmp_path / "set", input_size=(64, 48), augment=False)[0]
    assert set(np.unique(sample["labels"].numpy())) <= {0, 1, 2, 3, 4}


def test_labels_import_of_a_label_studio_export_finds_uploaded_and_local_images(tmp_path, capsys):
    images = write_images(tmp_path / "images", "court_000.png", "court/court_001.png")
    out = tmp_path / "dataset"
    argv = ["labels", "import", str(LABEL_STUDIO), "-o", str(out), "--images", str(images),
            "--label-config", str(LABEL_STUDIO_CONFIG)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert sorted(p.name for p in (out / "labels").iterdir()) == ["court_000.png", "court_001.png"]
    assert yaml.safe_load((out / "labels.yaml").read_text())["classes"]["names"] == list(CLASSES)


def test_bad_input_is_one_line_naming_the_file_and_the_rest_is_imported(tmp_path, capsys):
    text = CVAT.read_text()
    text = text.replace('label="bar_end" source="manual" outside="0" occluded="1"', 'label="bar_tip" source="manual" '
                        'outside="0" occluded="1"')  # a point label not in the skeleton  # fmt: skip
    text = text.replace("28.00,10.00;36.00,10.00;36.00,16.00;28.00,16.00", "128.00,70.00;136.00,70.00;136.00,76.00")
    text = text.replace('name="court_001.png"', 'name="court_404.png"')  # named in the export, not on disk
    export = tmp_path / "annotations.xml"
    export.write_text(text)
    images = write_images(tmp_path / "images", "court_000.png", "court_001.png")
    code = main(["labels", "import", str(export), "-o", str(tmp_path / "out"), "--images", str(images)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 3, lines
    assert all(line.startswith("sapiens2 labels: error: ") for line in lines)
    assert "point label 'bar_tip' is not in the skeleton 'racket_player'" in lines[0] and str(export) in lines[0]
    assert "polygon of 'left_sleeve': the polygon lies outside the 96 x 64 image" in lines[1]
    assert "image 'court_404.png' is named in the export but not found in" in lines[2]
    coco = json.loads((tmp_path / "out" / "annotations.json").read_text())
    assert [a["keypoints"][3:6] for a in coco["annotations"]] == [[0, 0, 0]]  # the other points are kept
    assert (tmp_path / "out" / "labels" / "court_000.png").is_file()


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("<annotations><meta><task>", "not well-formed XML"),
        ('{"images": []}', "neither COCO"),
        ("[1, 2]", "not a Label Studio JSON export"),
    ],
)
def test_an_unreadable_export_is_one_line_and_exit_1(tmp_path, capsys, content, words):
    export = tmp_path / ("bad.xml" if content.startswith("<") else "bad.json")
    export.write_text(content)
    assert main(["labels", "import", str(export), "-o", str(tmp_path / "out")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"sapiens2 labels: error: {export}: ") and words in line
    assert not (tmp_path / "out").exists()


def test_a_cvat_export_with_two_skeletons_needs_one_named(tmp_path):
    coach = "<label>\n          <name>coach</name>\n          <type>skeleton</type>\n        </label>\n        <label>"
    second = '<skeleton label="racket_player" source="manual" z_order="0">\n      <points label="racket_tip" '
    second += 'source="manual" outside="0" occluded="0" points="80.00'
    text = CVAT.read_text().replace("<label>", coach, 1).replace(second, second.replace("racket_player", "coach"))
    (tmp_path / "a.xml").write_text(text)
    with pytest.raises(AnnotationError, match="2 skeleton labels are used"):
        read_cvat(tmp_path / "a.xml")
    assert read_cvat(tmp_path / "a.xml", skeleton="racket_player").keypoint_names == KEYPOINTS


def test_coco_categories_give_the_set_and_flip_pairs(tmp_path):
    labels = _predictions("polygon")
    labels.flip_pairs = (("left_wrist", "right_wrist"),)
    back = read_coco(write_annotations(labels, tmp_path / "c.json", "coco"))
    assert back.flip_pairs == (("left_wrist", "right_wrist"),) and back.skeleton == (("left_wrist", "racket_tip"),)
    assert back.label_set()["keypoints"]["flip_pairs"] == [["left_wrist", "right_wrist"]]


def _label_studio_errors(config: Path, tasks: Path) -> list[str]:
    """Label Studio's SDK on our tasks (tests/labelstudio_check.py, in the SDK's own venv)."""
    done = subprocess.run([label_studio_python(), str(Path(__file__).parent / "labelstudio_check.py"), str(config),
                           str(tasks)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)["errors"]


@pytest.mark.slow
@pytest.mark.parametrize("masks", ["polygon", "rle"])
def test_label_studios_sdk_accepts_our_predictions_and_config(masks, tmp_path):
    labels = _predictions(masks)
    tasks = write_annotations(labels, tmp_path / "tasks.json", "labelstudio", config_path=tmp_path / "config.xml")
    assert _label_studio_errors(tmp_path / "config.xml", tasks) == []
    broken = json.loads(tasks.read_text())  # a negative control: a keypoint past the image's right edge
    next(r for r in broken[0]["predictions"][0]["result"] if r["type"] == "keypointlabels")["value"]["x"] = 150.0
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    assert len(_label_studio_errors(tmp_path / "config.xml", tmp_path / "broken.json")) == 1


@pytest.mark.slow
def test_the_label_studio_fixture_is_valid_for_label_studio():
    assert _label_studio_errors(LABEL_STUDIO_CONFIG, LABEL_STUDIO) == []


def test_labels_import_of_a_coco_file_with_rle_masks(tmp_path, capsys):
    labels = _predictions("rle")
    write_annotations(labels, tmp_path / "instances.json", "coco")
    images = write_images(tmp_path / "images", "court_000.png")
    assert main(["labels", "import", str(tmp_path / "instances.json"), "-o", str(tmp_path / "set")]) == 0
    label_map = cv2.imread(str(tmp_path / "set" / "labels" / "court_000.png"), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(label_map, labels.images[0].label_map(CLASSES))
    coco = json.loads((tmp_path / "set" / "annotations.json").read_text())
    assert len(coco["annotations"]) == 2 and coco["categories"][0]["keypoints"] == list(KEYPOINTS)
    assert images.is_dir()
