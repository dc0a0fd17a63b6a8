"""Per-image output files of every task, the mask rule, atomic writing, and the COCO results file."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_visualize import astronaut_image, astronaut_labels, astronaut_pose

from sapiens2.data.sources import InputItem
from sapiens2.dense.albedo import AlbedoResult
from sapiens2.dense.matting import MattingResult
from sapiens2.dense.normal import NormalResult
from sapiens2.dense.pointmap import PointmapResult
from sapiens2.dense.seg import SegResult, class_names
from sapiens2.metadata import keypoint_metadata
from sapiens2.pose.keypoints import format_keypoint_names
from sapiens2.pose.topdown import PoseResult
from sapiens2.predict.visualize import colorize_depth, colorize_normals, draw_pose, draw_seg_legend, seg_overlay
from sapiens2.predict.writers import CocoResultsWriter, WriteOptions, instance_score, read_pose_json, write_result

SIZE = (512, 512)

# --------------------------------------------------------------------------------------------------------------------
# Synthetic dense results for the astronaut photo: an ellipsoid "body" in front of a wall.


def _ellipsoid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """u, v (ellipse coordinates) and the (H, W) bulge sqrt(1 - u^2 - v^2) (0 outside the ellipse)."""
    rows, cols = np.indices(SIZE, dtype=np.float32)
    u, v = (cols - 222) / 200, (rows - 330) / 260
    return u, v, np.sqrt(np.clip(1 - u**2 - v**2, 0, None))


def seg_result() -> SegResult:
    return SegResult(astronaut_labels(), class_names(), "astronaut.png", SIZE)


def normal_result() -> NormalResult:
    u, v, bulge = _ellipsoid()
    inside = bulge > 0
    normals = np.stack([np.where(inside, u, 0), np.where(inside, v, 0), np.where(inside, bulge, 1)], axis=2)
    normals /= np.linalg.norm(normals, axis=2, keepdims=True)
    return NormalResult(normals.astype(np.float32), "astronaut.png", SIZE)


def pointmap_result() -> PointmapResult:
    _, _, bulge = _ellipsoid()
    rows, cols = np.indices(SIZE, dtype=np.float32)
    depth = np.where(bulge > 0, 3.0 - 0.6 * bulge, 6.0).astype(np.float32)
    focal = 600.0
    points = np.stack([(cols - 256) / focal * depth, (rows - 256) / focal * depth, depth], axis=2)
    return PointmapResult(points.astype(np.float32), depth, focal, 1.28, "astronaut.png", SIZE)


def albedo_result() -> AlbedoResult:
    albedo_float = (astronaut_image().astype(np.float32) / 255) * 0.7 + 0.15
    return AlbedoResult((albedo_float * 255).astype(np.uint8), albedo_float, "astronaut.png", SIZE)


def matting_result() -> MattingResult:
    _, _, bulge = _ellipsoid()
    alpha = np.clip(bulge * 4, 0, 1).astype(np.float32)  # soft edge
    foreground = astronaut_image().astype(np.float32) / 255 * alpha[..., None]
    return MattingResult(alpha, foreground, "astronaut.png", SIZE)


RESULTS = {
    "seg": seg_result,
    "normal": normal_result,
    "pointmap": pointmap_result,
    "albedo": albedo_result,
    "matting": matting_result,
    "pose": astronaut_pose,
}


def _read_rgb(path: Path) -> np.ndarray:
    return cv2.cvtColor(cv2.imread(str(path), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


def _read_ply(path: Path) -> tuple[list[str], np.ndarray]:
    data = path.read_bytes()
    end = data.index(b"end_header\n") + len(b"end_header\n")
    header = data[:end].decode("ascii").splitlines()
    count = int(next(line for line in header if line.startswith("element vertex")).split()[-1])
    fields = [("x", "<f4"), ("y", "<f4"), ("z", "<f4")]
    if "property uchar red" in header:
        fields += [("red", "u1"), ("green", "u1"), ("blue", "u1")]
    return header, np.frombuffer(data[end:], dtype=np.dtype(fields), count=count)


def _no_temporaries(folder: Path) -> None:
    leftovers = [p for p in folder.rglob("*") if p.name.startswith(".") or ".tmp" in p.name]
    assert not leftovers, leftovers


# --------------------------------------------------------------------------------------------------------------------
# Every task on the astronaut photo


def test_every_task_writes_its_files_for_the_astronaut_photo(tmp_path):
    image = astronaut_image()
    expected = {
        "seg": ["astronaut_seg_overlay.jpg", "astronaut_seg.png"],
        "normal": ["astronaut_normal.jpg", "astronaut_normal.npy"],
        "pointmap": ["astronaut_depth.npy", "astronaut.ply", "astronaut_depth.jpg", "astronaut_focal.json",
                     "astronaut_pointmap.npy"],
        "albedo": ["astronaut_albedo.png"],
        "matting": ["astronaut_cutout.png", "astronaut_alpha.png"],
        "pose": ["astronaut_pose.jpg", "astronaut_pose.json"],
    }  # fmt: skip
    for task, make in RESULTS.items():
        paths = write_result(task, make(), tmp_path / "astronaut", image)
        assert [p.name for p in paths] == expected[task], task  # the main file comes last
        for path in paths:
            assert path.is_file() and path.stat().st_size > 0
            if path.suffix in (".jpg", ".png"):
                picture = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
                assert picture is not None and picture.shape[0] == SIZE[0], path
                legend = path.name.endswith("_seg_overlay.jpg")  # the seg overlay has its legend panel on the right
                assert picture.shape[1] > SIZE[1] if legend else picture.shape[1] == SIZE[1], path
    _no_temporaries(tmp_path)


# --------------------------------------------------------------------------------------------------------------------
# Per task


def test_seg_writes_exact_label_png_overlay_and_arrays_on_request(tmp_path):
    image = astronaut_image()
    probabilities = np.random.default_rng(0).random((29, *SIZE), dtype=np.float32)
    result = SegResult(astronaut_labels(), class_names(), None, SIZE, probabilities)
    paths = write_result("seg", result, tmp_path / "a", image, WriteOptions(save_npy=True, picture_format="png"))
    assert [p.name for p in paths] == ["a_seg_overlay.png", "a_seg.npy", "a_seg_probs.npy", "a_seg.png"]
    labels = cv2.imread(str(tmp_path / "a_seg.png"), cv2.IMREAD_UNCHANGED)
    assert labels.dtype == np.uint8 and np.array_equal(labels, result.labels)
    expected = draw_seg_legend(seg_overlay(image, result.labels), result.labels)
    assert np.array_equal(_read_rgb(tmp_path / "a_seg_overlay.png"), expected)
    saved = np.load(tmp_path / "a_seg.npy")
    assert saved.dtype == np.uint8 and np.array_equal(saved, result.labels)
    assert np.array_equal(np.load(tmp_path / "a_seg_probs.npy"), probabilities)


def test_seg_overlay_jpeg_is_close_to_the_picture_and_side_by_side_doubles_width(tmp_path):
    image = astronaut_image()
    write_result("seg", seg_result(), tmp_path / "a", image)
    jpeg = _read_rgb(tmp_path / "a_seg_overlay.jpg").astype(np.float64)
    overlay = seg_overlay(image, astronaut_labels())
    assert np.abs(jpeg - draw_seg_legend(overlay, astronaut_labels())).mean() < 3.0  # quality 95
    options = WriteOptions(side_by_side=True, picture_format="png", legend=False)
    write_result("seg", seg_result(), tmp_path / "b", image, options)
    joined = _read_rgb(tmp_path / "b_seg_overlay.png")
    assert joined.shape == (512, 1024, 3) and np.array_equal(joined[:, :512], image)
    assert np.array_equal(joined[:, 512:], overlay)


def test_normal_npy_is_exact_and_the_mask_makes_background_nan_and_black(tmp_path):
    result = normal_result()
    write_result("normal", result, tmp_path / "plain", None, WriteOptions(picture_format="png"))
    saved = np.load(tmp_path / "plain_normal.npy")
    assert saved.dtype == np.float32 and saved.shape == (512, 512, 3) and np.array_equal(saved, result.normals)
    assert np.array_equal(_read_rgb(tmp_path / "plain_normal.png"), colorize_normals(result.normals))

    mask = astronaut_labels() > 0
    write_result("normal", result, tmp_path / "masked", None, WriteOptions(mask=mask, picture_format="png"))
    masked = np.load(tmp_path / "masked_normal.npy")
    assert np.isnan(masked[~mask]).all() and np.array_equal(masked[mask], result.normals[mask])
    picture = _read_rgb(tmp_path / "masked_normal.png")
    assert not picture[~mask].any() and np.array_equal(picture[mask], colorize_normals(result.normals)[mask])


def test_pointmap_writes_arrays_ply_of_masked_pixels_depth_picture_and_focal(tmp_path):
    image = astronaut_image()
    result = pointmap_result()
    mask = astronaut_labels() > 0
    mask[0, 0] = True
    result.points[0, 0] = np.nan  # a non-finite prediction never reaches the PLY
    options = WriteOptions(mask=mask, picture_format="png")
    write_result("pointmap", result, tmp_path / "p", image, options)

    points = np.load(tmp_path / "p_pointmap.npy")
    assert points.dtype == np.float32 and points.shape == (512, 512, 3)
    assert np.isnan(points[~mask]).all() and np.array_equal(points[mask][1:], result.points[mask][1:])
    depth = np.load(tmp_path / "p_depth.npy")
    assert depth.dtype == np.float32 and np.array_equal(depth[mask], result.depth[mask])  # not float16 steps
    assert np.isnan(depth[~mask]).all()

    header, vertices = _read_ply(tmp_path / "p.ply")
    keep = mask.copy()
    keep[0, 0] = False
    assert f"element vertex {keep.sum()}" in header and len(vertices) == keep.sum()
    xyz = np.stack([vertices["x"], vertices["y"], vertices["z"]], axis=1)
    rgb = np.stack([vertices["red"], vertices["green"], vertices["blue"]], axis=1)
    assert np.array_equal(xyz, result.points[keep]) and np.array_equal(rgb, image[keep])  # row-major order

    picture = _read_rgb(tmp_path / "p_depth.png")
    assert not picture[~mask].any() and np.array_equal(picture, colorize_depth(result.depth, mask))
    focal = json.loads((tmp_path / "p_focal.json").read_text())
    assert focal["focal_length_px"] == 600.0 and focal["scale"] == 1.28 and focal["image_size"] == [512, 512]


def test_pointmap_without_image_or_mask_writes_every_pixel_uncoloured(tmp_path):
    result = pointmap_result()
    write_result("pointmap", result, tmp_path / "p", None, WriteOptions(overlay=False))
    header, vertices = _read_ply(tmp_path / "p.ply")
    assert len(vertices) == 512 * 512 and "property uchar red" not in header
    assert not (tmp_path / "p_depth.jpg").exists()
    assert np.array_equal(np.load(tmp_path / "p_pointmap.npy"), result.points)


def test_albedo_png_is_exact_and_masked_pixels_are_black(tmp_path):
    result = albedo_result()
    mask = astronaut_labels() > 0
    write_result("albedo", result, tmp_path / "plain", None)
    assert np.array_equal(_read_rgb(tmp_path / "plain_albedo.png"), result.albedo)
    write_result("albedo", result, tmp_path / "masked", None, WriteOptions(mask=mask))
    picture = _read_rgb(tmp_path / "masked_albedo.png")
    assert not picture[~mask].any() and np.array_equal(picture[mask], result.albedo[mask])


def test_matting_writes_rounded_alpha_and_straight_rgba_cutout(tmp_path):
    result = matting_result()
    write_result("matting", result, tmp_path / "m", astronaut_image())
    alpha = cv2.imread(str(tmp_path / "m_alpha.png"), cv2.IMREAD_UNCHANGED)
    assert alpha.dtype == np.uint8 and alpha.ndim == 2
    assert np.array_equal(alpha, np.rint(result.alpha * 255).astype(np.uint8))
    cutout = cv2.cvtColor(cv2.imread(str(tmp_path / "m_cutout.png"), cv2.IMREAD_UNCHANGED), cv2.COLOR_BGRA2RGBA)
    assert cutout.shape == (512, 512, 4) and np.array_equal(cutout, result.rgba())
    opaque = alpha == 255  # un-premultiplied colour of opaque pixels is the photo (up to rounding)
    assert np.abs(cutout[opaque][:, :3].astype(int) - astronaut_image()[opaque]).max() <= 1


def test_pose_json_holds_boxes_scores_and_named_keypoints_in_the_chosen_format(tmp_path):
    pose = astronaut_pose()
    write_result("pose", pose, tmp_path / "p", astronaut_image())
    data = json.loads((tmp_path / "p_pose.json").read_text())
    assert data["keypoint_format"] == "sapiens308" and data["num_keypoints"] == 308
    assert data["keypoint_names"] == list(keypoint_metadata().names) and data["image_size"] == [512, 512]
    assert len(data["instances"]) == 2
    first = data["instances"][0]
    assert first["bbox_xyxy"] == pose.boxes[0].tolist() and first["bbox_score"] == 0.95 and "bbox" not in first
    assert first["score"] == pytest.approx(instance_score(0.95, pose.scores[0]))
    assert np.array_equal(np.array(first["keypoints"]), pose.keypoints[0])
    assert first["keypoint_scores"] == pose.scores[0].tolist()

    write_result("pose", pose, tmp_path / "c", astronaut_image(), WriteOptions(keypoint_format="coco17"))
    coco = json.loads((tmp_path / "c_pose.json").read_text())
    assert coco["keypoint_format"] == "coco17" and coco["keypoint_names"] == list(format_keypoint_names("coco17"))
    assert np.array_equal(np.array(coco["instances"][1]["keypoints"]), pose.converted("coco17").keypoints[1])


def test_pose_picture_is_the_drawn_skeleton(tmp_path):
    image = astronaut_image()
    pose = astronaut_pose()
    options = WriteOptions(picture_format="png", draw_boxes=True, keypoint_format="openpose25")
    write_result("pose", pose, tmp_path / "p", image, options)
    expected = draw_pose(image, pose, fmt="openpose25", draw_boxes=True, box_ids=[0, 1])
    assert np.array_equal(_read_rgb(tmp_path / "p_pose.png"), expected)
    assert not np.array_equal(expected, draw_pose(image, pose, fmt="openpose25", draw_boxes=True))  # "#0", "#1"
    write_result("pose", pose, tmp_path / "d", image, WriteOptions(picture_format="png"))  # the default: boxes, ids
    assert np.array_equal(_read_rgb(tmp_path / "d_pose.png"), draw_pose(image, pose, draw_boxes=True, box_ids=[0, 1]))
    with pytest.raises(ValueError, match="needs the RGB image"):
        write_result("pose", pose, tmp_path / "q", None)
    assert [p.name for p in write_result("pose", pose, tmp_path / "q", None, WriteOptions(overlay=False))] == [
        "q_pose.json"
    ]


def test_pose_boxes_past_the_image_are_written_clipped_as_bbox_xyxy(tmp_path):
    pose = astronaut_pose()
    pose.boxes[0] = [-12.5, 40.0, 530.0, 792.0]  # a detector box reaching past the left, right and bottom edges
    write_result("pose", pose, tmp_path / "p", astronaut_image(), WriteOptions(picture_format="png"))
    first, second = json.loads((tmp_path / "p_pose.json").read_text())["instances"]
    assert first["bbox_xyxy"] == [0.0, 40.0, 511.0, 511.0] and second["bbox_xyxy"] == pose.boxes[1].tolist()
    picture = _read_rgb(tmp_path / "p_pose.png")  # the box's right and bottom edges are drawn on the last pixels
    assert (picture[45:500, 511] == 255).all() and (picture[511, 20:500] == 255).all()


def test_pose_json_reads_back_into_the_written_result(tmp_path):
    pose = astronaut_pose()
    pose.keypoints[1, 5] = np.nan
    write_result("pose", pose, tmp_path / "p", None, WriteOptions(overlay=False, keypoint_format="coco17"))
    read, scores = read_pose_json(tmp_path / "p_pose.json")
    written = pose.converted("coco17")
    assert read.keypoint_names == written.keypoint_names and read.image_size == (512, 512)
    for name in ("boxes", "box_scores", "keypoints", "scores"):
        np.testing.assert_array_equal(getattr(read, name), getattr(written, name), err_msg=name)  # NaN where null
    expected = [instance_score(s, k) for s, k in zip(pose.box_scores, pose.scores, strict=True)]
    assert scores.tolist() == pytest.approx(expected)
    (tmp_path / "bad_pose.json").write_text('{"instances": [')
    with pytest.raises(ValueError, match="bad_pose.json: not a readable pose JSON"):
        read_pose_json(tmp_path / "bad_pose.json")


def test_non_finite_pose_values_become_json_null(tmp_path):
    pose = astronaut_pose()
    pose.keypoints[0, 3] = np.nan
    pose.scores[0, 4] = np.inf
    write_result("pose", pose, tmp_path / "p", astronaut_image())
    text = (tmp_path / "p_pose.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data["instances"][0]["keypoints"][3] == [None, None] and data["instances"][0]["keypoint_scores"][4] is None


# --------------------------------------------------------------------------------------------------------------------
# Destinations and checks


def test_input_item_destinations_mirror_the_stem_folders(tmp_path):
    item = InputItem(source=Path("in/day1/img.v2.jpg"), stem="day1/img.v2", output_dir=tmp_path / "out")
    paths = write_result("albedo", albedo_result(), item, astronaut_image())
    assert paths == [tmp_path / "out" / "day1" / "img.v2_albedo.png"] and paths[0].is_file()


def test_write_result_rejects_wrong_tasks_types_and_sizes(tmp_path):
    image = astronaut_image()
    with pytest.raises(ValueError, match="unknown task 'segm'"):
        write_result("segm", seg_result(), tmp_path / "x", image)
    with pytest.raises(ValueError, match="needs a SegResult"):
        write_result("seg", normal_result(), tmp_path / "x", image)
    with pytest.raises(ValueError, match="image_rgb has size"):
        write_result("seg", seg_result(), tmp_path / "x", image[:100])
    with pytest.raises(ValueError, match="WriteOptions.mask has size"):
        write_result("normal", normal_result(), tmp_path / "x", image, WriteOptions(mask=np.ones((4, 4), bool)))
    with pytest.raises(ValueError, match="uint8 RGB"):
        write_result("normal", normal_result(), tmp_path / "x", image.astype(np.float32))
    with pytest.raises(ValueError, match="keypoint_format"):
        WriteOptions(keypoint_format="coco")
    with pytest.raises(ValueError, match="picture_format"):
        WriteOptions(picture_format="bmp")
    assert not list(tmp_path.iterdir())  # nothing written by a rejected call


def test_rewriting_replaces_files_and_leaves_no_temporaries(tmp_path):
    image = astronaut_image()
    write_result("seg", seg_result(), tmp_path / "a", image)
    other = SegResult(np.zeros(SIZE, np.uint8), class_names(), None, SIZE)
    write_result("seg", other, tmp_path / "a", image)
    assert not cv2.imread(str(tmp_path / "a_seg.png"), cv2.IMREAD_UNCHANGED).any()
    _no_temporaries(tmp_path)


# --------------------------------------------------------------------------------------------------------------------
# COCO results


def _empty_pose(path: str) -> PoseResult:
    names = keypoint_metadata().names
    return PoseResult(np.zeros((0, 4)), np.zeros(0), np.zeros((0, 308, 2)), np.zeros((0, 308)), path, (300, 200), names)


def test_instance_score_is_box_score_times_mean_of_keypoint_scores_above_0_2():
    assert instance_score(0.5, np.array([0.1, 0.2, 0.4, 0.8, np.nan])) == pytest.approx(0.5 * 0.6)
    assert instance_score(1.0, np.array([0.1, 0.2])) == 0.0


def test_coco_results_are_an_array_and_the_dataset_file_maps_image_ids_to_files(tmp_path):
    pose = astronaut_pose()
    pose.boxes[1] = [370.0, -20.0, 530.0, 250.0]  # a detector box past the image's top and right
    writer = CocoResultsWriter(tmp_path / "r.json", keypoint_format="coco17", dataset_path=tmp_path / "r_dataset.json")
    assert writer.add(pose, "astronaut.png") == 1
    assert writer.add(_empty_pose("/data/empty.jpg")) == 2  # file name from the path
    path = writer.close()
    assert path == tmp_path / "r.json" and len(writer) == 2 and writer.num_instances == 2
    _no_temporaries(tmp_path)
    results = json.loads(path.read_text())
    assert isinstance(results, list) and len(results) == 2
    assert [sorted(r) for r in results] == [["category_id", "image_id", "keypoints", "score"]] * 2  # no "bbox"
    expected = pose.converted("coco17")
    assert np.array_equal(np.array(results[0]["keypoints"]).reshape(17, 3)[:, :2], expected.keypoints[0])
    assert results[0]["score"] == pytest.approx(instance_score(0.95, pose.scores[0]))  # from the 308 scores

    data = json.loads((tmp_path / "r_dataset.json").read_text())
    assert data["images"] == [
        {"id": 1, "file_name": "astronaut.png", "height": 512, "width": 512},
        {"id": 2, "file_name": "empty.jpg", "height": 300, "width": 200},
    ]
    category = data["categories"][0]
    assert category["id"] == 1 and category["keypoints"] == list(format_keypoint_names("coco17"))
    assert len(category["skeleton"]) == 19 and min(min(link) for link in category["skeleton"]) == 1
    assert [a["id"] for a in data["annotations"]] == [1, 2]
    assert data["annotations"][1]["bbox"] == [370.0, 0.0, 141.0, 250.0]  # clipped to the image, then x, y, w, h
    assert data["annotations"][1]["box_score"] == 0.6
    assert [{k: a[k] for k in results[0]} for a in data["annotations"]] == results


def test_coco_writer_uses_given_image_ids_and_rejects_duplicates_and_unknown_names(tmp_path):
    writer = CocoResultsWriter(tmp_path / "r.json", image_ids={"astronaut.png": 42, "b.png": 7})
    assert writer.add(astronaut_pose(), "astronaut.png") == 42
    with pytest.raises(ValueError, match="already added"):
        writer.add(astronaut_pose(), "astronaut.png")
    with pytest.raises(ValueError, match="not in the image_ids map"):
        writer.add(astronaut_pose(), "c.png")
    assert writer.add(_empty_pose("x/b.png")) == 7
    results = json.loads(writer.write().read_text())
    assert [r["image_id"] for r in results] == [42, 42]  # image 7 has nobody
    assert len(results[0]["keypoints"]) == 3 * 308 and writer.dataset()["info"]["keypoint_format"] == "sapiens308"
    assert [image["id"] for image in writer.dataset()["images"]] == [7, 42]  # by id
    assert not (tmp_path / "r_dataset.json").exists()  # only with dataset_path
    with pytest.raises(ValueError, match="pass file_name"):
        CocoResultsWriter(tmp_path / "s.json").add(_empty_pose(None))
    with pytest.raises(ValueError, match="keypoint_format"):
        CocoResultsWriter(tmp_path / "s.json", keypoint_format="coco18")


def test_coco_writer_writes_unusable_keypoints_as_zero_triplets(tmp_path):
    pose = astronaut_pose()
    pose.keypoints[0, 0] = np.nan
    writer = CocoResultsWriter(tmp_path / "r.json")
    writer.add(pose, "a.png")
    text = writer.write().read_text()
    assert "NaN" not in text
    assert json.loads(text)[0]["keypoints"][:3] == [0.0, 0.0, 0.0]
