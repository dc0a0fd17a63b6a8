"""Pictures of predictions: palette, overlay, normal/depth colours, skeleton drawing, side-by-side."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from conftest import DATA

from sapiens2.data.io import read_image
from sapiens2.metadata import keypoint_metadata
from sapiens2.pose.keypoints import skeleton_links
from sapiens2.pose.topdown import PoseResult, as_keypoint_format
from sapiens2.predict.visualize import (
    colorize_depth,
    colorize_labels,
    colorize_normals,
    depth_range,
    draw_pose,
    draw_seg_legend,
    id_color,
    pose_sizes,
    seg_legend_entries,
    seg_overlay,
    seg_palette,
    side_by_side,
)

# --------------------------------------------------------------------------------------------------------------------
# Synthetic predictions for the astronaut photo (512 x 512), shared with test_writers.py.

# (x, y) of named 308 keypoints on the astronaut photo; the hips and legs lie below the picture.
_ASTRONAUT_BODY = {
    "nose": (222, 140), "left_eye": (245, 113), "right_eye": (200, 113), "left_ear": (272, 125),
    "right_ear": (173, 125), "left_shoulder": (330, 285), "right_shoulder": (95, 290), "left_elbow": (352, 420),
    "right_elbow": (48, 430), "left_wrist": (300, 500), "right_wrist": (150, 492), "left_hip": (300, 580),
    "right_hip": (125, 580), "left_knee": (300, 700), "right_knee": (125, 700), "left_ankle": (300, 820),
    "right_ankle": (125, 820), "neck": (222, 205), "left_acromion": (320, 270), "right_acromion": (105, 272),
    "left_olecranon": (362, 425), "right_olecranon": (38, 433), "left_cubital_fossa": (342, 415),
    "right_cubital_fossa": (58, 425),
}  # fmt: skip
_LOW_SCORE = ("right_ear",)  # drawn nowhere: below the 0.3 threshold


def astronaut_person(shift: tuple[float, float] = (0.0, 0.0), scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(308, 2) keypoints and (308,) scores of a plausible person on the astronaut photo (scaled about (222, 300))."""
    meta = keypoint_metadata()
    points = np.zeros((308, 2))
    for name, xy in _ASTRONAUT_BODY.items():
        points[meta.index(name)] = xy
    for name in meta.names[15:21]:  # feet: below the picture, with the ankles
        points[meta.index(name)] = points[meta.index(name.split("_")[0] + "_ankle")] + (0, 30)
    face = np.asarray(meta.groups["face"])
    angle = np.linspace(0, 6 * np.pi, len(face), endpoint=False)  # three rings around the face
    ring = np.repeat([1.0, 0.7, 0.4], -(-len(face) // 3))[: len(face)]
    points[face] = np.stack([222 + 42 * ring * np.cos(angle), 130 + 55 * ring * np.sin(angle)], axis=1)
    for side, sign in (("left", 1), ("right", -1)):  # fingers fan out above the wrist
        wrist = points[meta.index(f"{side}_wrist")]
        for finger_index, finger in enumerate(("thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger")):
            direction = np.deg2rad(60 + 15 * finger_index) * sign
            for step, joint in enumerate(("_third_joint", "2", "3", "4")):
                length = 10 + 7 * step
                points[meta.index(f"{side}_{finger}{joint}")] = wrist + length * np.array(
                    [np.cos(direction) * sign, -np.sin(abs(direction))]
                )
    scores = np.full(308, 0.9)
    for name in _LOW_SCORE:
        scores[meta.index(name)] = 0.1
    centre = np.array([222.0, 300.0])
    return (points - centre) * scale + centre + np.asarray(shift), scores


def astronaut_pose() -> PoseResult:
    """Two people on the astronaut photo: the astronaut and a small copy at the top right."""
    people = [astronaut_person(), astronaut_person(shift=(200.0, -190.0), scale=0.25)]
    keypoints = np.stack([p for p, _ in people])
    scores = np.stack([s for _, s in people])
    boxes = np.array([[10.0, 40.0, 400.0, 511.0], [370.0, 50.0, 470.0, 250.0]])
    names = keypoint_metadata().names
    return PoseResult(boxes, np.array([0.95, 0.6]), keypoints, scores, str(DATA / "astronaut.png"), (512, 512), names)


def astronaut_labels() -> np.ndarray:
    """(512, 512) uint8 body-part labels painted from simple shapes over the astronaut."""
    labels = np.zeros((512, 512), dtype=np.uint8)
    rows, cols = np.indices(labels.shape)
    labels[((cols - 222) / 120) ** 2 + ((rows - 380) / 150) ** 2 < 1] = 23  # Upper_Clothing
    labels[((cols - 222) / 50) ** 2 + ((rows - 160) / 45) ** 2 < 1] = 3  # Face_Neck
    labels[((cols - 225) / 75) ** 2 + ((rows - 75) / 60) ** 2 < 1] = 4  # Hair
    labels[((cols - 222) / 45) ** 2 + ((rows - 125) / 55) ** 2 < 1] = 3
    labels[((cols - 300) / 25) ** 2 + ((rows - 495) / 20) ** 2 < 1] = 6  # Left_Hand
    return labels


def astronaut_image() -> np.ndarray:
    return read_image(DATA / "astronaut.png")


# --------------------------------------------------------------------------------------------------------------------
# Segmentation


def test_colorize_labels_uses_the_official_palette_and_blacks_out_unknown_ids():
    palette = seg_palette()
    assert palette.shape == (29, 3) and palette.dtype == np.uint8
    assert palette[0].tolist() == [50, 50, 50] and palette[1].tolist() == [255, 218, 0]  # seg29.json, RGB
    labels = np.array([[0, 1, 28], [255, 4, 29]], dtype=np.uint8)
    picture = colorize_labels(labels)
    assert picture.shape == (2, 3, 3) and picture.dtype == np.uint8
    assert np.array_equal(picture[0], palette[[0, 1, 28]])
    assert picture[1, 0].tolist() == [0, 0, 0] and picture[1, 2].tolist() == [0, 0, 0]
    assert np.array_equal(picture[1, 1], palette[4])
    assert np.array_equal(colorize_labels(labels.astype(np.int64)), picture)


def test_colorize_labels_rejects_floats_and_negative_ids():
    with pytest.raises(ValueError, match="integer"):
        colorize_labels(np.zeros((2, 2), dtype=np.float32))
    with pytest.raises(ValueError, match=">= 0"):
        colorize_labels(np.array([[-1, 0]]))


def test_seg_overlay_is_the_rounded_weighted_blend():
    image = astronaut_image()
    labels = astronaut_labels()
    overlay = seg_overlay(image, labels)
    expected = 0.5 * image.astype(np.float64) + 0.5 * colorize_labels(labels)
    assert overlay.dtype == np.uint8 and overlay.shape == image.shape
    assert np.abs(overlay - expected).max() <= 0.5 + 1e-9  # rounded to nearest
    assert np.array_equal(seg_overlay(image, labels, alpha=0.0), image)
    assert np.array_equal(seg_overlay(image, labels, alpha=1.0), colorize_labels(labels))


def test_seg_overlay_rejects_mismatched_sizes_and_bad_alpha():
    image = astronaut_image()
    with pytest.raises(ValueError, match="do not match"):
        seg_overlay(image, np.zeros((10, 10), np.uint8))
    with pytest.raises(ValueError, match="alpha"):
        seg_overlay(image, astronaut_labels(), alpha=1.5)
    with pytest.raises(ValueError, match="uint8 RGB"):
        seg_overlay(image.astype(np.float32), astronaut_labels())


# --------------------------------------------------------------------------------------------------------------------
# Normals and depth


def test_colorize_normals_maps_xyz_to_rgb_by_truncation_and_masks_to_black():
    normals = np.array([[[1, 0, 0], [0, 1, 0], [0, 0, -1]], [[0.6, -0.8, 0], [np.nan, 0, 0], [0, 0, 1]]], np.float32)
    picture = colorize_normals(normals)
    assert picture.dtype == np.uint8 and picture.shape == (2, 3, 3)
    assert picture[0, 0].tolist() == [255, 127, 127]  # 0 -> 127.5 truncated
    assert picture[0, 1].tolist() == [127, 255, 127]
    assert picture[0, 2].tolist() == [127, 127, 0]
    assert picture[1, 0].tolist() == [int(1.6 / 2 * 255), int(0.2 / 2 * 255), 127]
    assert picture[1, 1].tolist() == [0, 0, 0]  # non-finite -> background
    mask = np.ones((2, 3), bool)
    mask[1, 2] = False
    masked = colorize_normals(normals, mask)
    assert masked[1, 2].tolist() == [0, 0, 0] and np.array_equal(masked[0], picture[0])
    with pytest.raises(ValueError, match="shape"):
        colorize_normals(normals, np.ones((3, 3), bool))


def test_colorize_depth_paints_near_warm_far_cool_and_background_black():
    depth = np.tile(np.linspace(1.0, 5.0, 64, dtype=np.float32), (8, 1))
    depth[0, 0] = np.nan
    depth[0, 1] = -1.0
    mask = np.ones(depth.shape, bool)
    mask[7, :] = False
    picture = colorize_depth(depth, mask, percentiles=(0, 100))
    turbo = cv2.cvtColor(cv2.applyColorMap(np.array([[0, 255]], np.uint8), cv2.COLORMAP_TURBO), cv2.COLOR_BGR2RGB)[0]
    assert picture.dtype == np.uint8 and picture.shape == (8, 64, 3)
    assert picture[1, 0].tolist() == turbo[1].tolist()  # nearest (1 m) -> top of the map (dark red)
    assert picture[1, -1].tolist() == turbo[0].tolist()  # farthest (5 m) -> bottom (dark blue)
    assert picture[0, 0].tolist() == [0, 0, 0] and picture[0, 1].tolist() == [0, 0, 0]
    assert not picture[7].any()  # masked row


def test_colorize_depth_with_a_fixed_range_colours_frames_alike():
    near = np.full((4, 4), 2.0, np.float32)
    picture_a = colorize_depth(near, value_range=(1.0, 4.0))
    picture_b = colorize_depth(np.pad(near, ((0, 0), (0, 4)), constant_values=3.5), value_range=(1.0, 4.0))
    assert np.array_equal(picture_a, picture_b[:, :4])
    assert not np.array_equal(picture_b[0, 0], picture_b[0, -1])
    assert not colorize_depth(np.zeros((3, 3), np.float32)).any()  # nothing valid -> all black
    with pytest.raises(ValueError, match="value_range"):
        colorize_depth(near, value_range=(3.0, 1.0))


def test_depth_range_is_the_percentiles_of_valid_foreground_depth():
    depth = np.arange(1, 101, dtype=np.float32).reshape(10, 10)
    depth[0, 0] = np.inf
    near, far = depth_range(depth, percentiles=(0, 100))
    assert (near, far) == (2.0, 100.0)
    mask = depth < 50
    assert depth_range(depth, mask, percentiles=(50, 50)) == pytest.approx((np.median(depth[mask]),) * 2)
    assert depth_range(np.zeros((2, 2)), None) is None


# --------------------------------------------------------------------------------------------------------------------
# Pose


def _painted(before: np.ndarray, after: np.ndarray, xy: tuple[int, int]) -> bool:
    return not np.array_equal(before[xy[1], xy[0]], after[xy[1], xy[0]])


def test_draw_pose_draws_confident_keypoints_with_their_colours_and_skips_the_rest():
    image = np.zeros((200, 200, 3), np.uint8)
    meta = keypoint_metadata()
    points = np.full((1, 308, 2), np.nan)
    scores = np.zeros((1, 308))
    nose, left_eye, right_eye = meta.index("nose"), meta.index("left_eye"), meta.index("right_eye")
    points[0, nose], scores[0, nose] = (50, 60), 0.3  # exactly the threshold: drawn
    points[0, left_eye], scores[0, left_eye] = (150, 60), 0.29  # below: not drawn
    points[0, right_eye], scores[0, right_eye] = (300, 60), 0.9  # outside the image: not drawn
    result = PoseResult(np.array([[0.0, 0, 199, 199]]), np.ones(1), points, scores, None, (200, 200), meta.names)
    picture = draw_pose(image, result, radius=4)
    assert picture[60, 50].tolist() == meta.keypoint_colors[nose].tolist()
    assert not picture[:, 100:].any()  # left eye (and its link to the nose) absent
    assert not image.any()  # input untouched


def test_draw_pose_draws_links_between_confident_keypoints_only():
    meta = keypoint_metadata()
    image = np.zeros((120, 200, 3), np.uint8)
    points = np.zeros((1, 308, 2))
    scores = np.zeros((1, 308))
    left_shoulder, right_shoulder, left_elbow = (
        meta.index(n) for n in ("left_shoulder", "right_shoulder", "left_elbow")
    )
    points[0, [left_shoulder, right_shoulder, left_elbow]] = [(150, 30), (50, 30), (150, 100)]
    scores[0, [left_shoulder, right_shoulder]] = 0.8
    scores[0, left_elbow] = 0.1
    result = PoseResult(np.zeros((1, 4)), np.ones(1), points, scores, None, (120, 200), meta.names)
    picture = draw_pose(image, result, radius=2, thickness=3)
    link = [i for i, (a, b) in enumerate(meta.skeleton_links.tolist()) if {a, b} == {left_shoulder, right_shoulder}]
    assert picture[30, 100].tolist() == meta.skeleton_link_colors[link[0]].tolist()  # middle of the shoulder link
    assert not picture[65, 150].any()  # shoulder-elbow link: the elbow is below the threshold
    assert not picture[100, 150].any()


def test_draw_pose_in_other_formats_maps_links_and_draws_no_unlabelled_joints():
    image = astronaut_image()
    pose = astronaut_pose()
    assert len(skeleton_links("sapiens308")) == 65
    assert len(skeleton_links("coco17")) == 19  # the 19 COCO body links
    coco = draw_pose(image, pose, fmt="coco17")
    full = draw_pose(image, pose)
    assert not np.array_equal(coco, full)  # no face dots or fingers in COCO-17
    fingertip = tuple(np.round(pose.keypoints[0, keypoint_metadata().index("left_forefinger4")]).astype(int))
    assert _painted(image, full, fingertip) and not _painted(image, coco, fingertip)
    assert _painted(image, coco, (300, 500))  # left wrist dot
    openpose = draw_pose(image, pose, fmt="openpose25")
    neck = np.round((np.array(_ASTRONAUT_BODY["left_shoulder"]) + _ASTRONAUT_BODY["right_shoulder"]) / 2).astype(int)
    assert _painted(image, openpose, tuple(neck))  # the shoulder midpoint is drawn as OpenPose's neck
    already = as_keypoint_format(pose, "coco17")
    assert np.array_equal(draw_pose(image, already, fmt="coco17"), coco)
    with pytest.raises(ValueError, match="did you mean 'coco17'"):
        draw_pose(image, pose, fmt="coco_17")
    with pytest.raises(ValueError, match="only 308-keypoint"):
        draw_pose(image, already, fmt="openpose25")


def test_draw_pose_scales_sizes_with_the_image_and_draws_boxes_on_request():
    assert pose_sizes((512, 512)) == (2, 2)
    assert pose_sizes((1536, 2048)) == (8, 8)  # the reference demo's 8 px at about 2K
    assert pose_sizes((20, 30)) == (1, 1)
    image = np.zeros((100, 100, 3), np.uint8)
    meta = keypoint_metadata()
    box = np.array([[10.0, 10, 80, 90]])
    result = PoseResult(box, np.ones(1), np.zeros((1, 308, 2)), np.zeros((1, 308)), None, (100, 100), meta.names)
    assert not draw_pose(image, result).any()
    boxed = draw_pose(image, result, draw_boxes=True)
    assert boxed[10, 50].tolist() == [255, 255, 255] and not boxed[50, 50].any()


def test_draw_pose_labels_each_box_with_its_id_in_the_id_colour_as_the_video_overlay():
    image = np.zeros((200, 300, 3), np.uint8)
    boxes = np.array([[20.0, 60, 120, 190], [160.0, 80, 290, 190]])
    result = PoseResult(boxes, np.ones(2), np.zeros((2, 308, 2)), np.zeros((2, 308)), None, (200, 300),
                        keypoint_metadata().names)  # fmt: skip
    plain = draw_pose(image, result, draw_boxes=True)
    labelled = draw_pose(image, result, draw_boxes=True, box_ids=[0, None])
    changed = np.argwhere((labelled != plain).any(axis=2))  # (row, col) of the "#0" text only
    assert len(changed) > 10 and changed[:, 0].max() < 60 and changed[:, 1].min() >= 20 and changed[:, 1].max() < 120
    colours = {tuple(c) for c in labelled[tuple(changed.T)].tolist()}
    assert tuple(id_color(0)) in colours  # anti-aliased edges add darker shades of the same colour
    assert id_color(1) != id_color(0) and id_color(5) == id_color(5)
    with pytest.raises(ValueError, match="box_ids has 1 entries for 2 people"):
        draw_pose(image, result, draw_boxes=True, box_ids=[0])


def test_seg_legend_lists_the_classes_present_with_colour_and_share():
    labels = astronaut_labels()
    entries = seg_legend_entries(labels)
    assert [e.class_id for e in entries] == list(range(29)) and entries[23].name == "Upper_Clothing"
    present = [e for e in entries if e.pixels]
    assert [e.class_id for e in present] == [0, 3, 4, 6, 23]
    assert sum(e.share for e in present) == pytest.approx(1.0)
    assert entries[4].share == pytest.approx((labels == 4).mean())
    assert entries[23].color == tuple(seg_palette()[23].tolist())
    assert all(e.pixels == 0 and e.share == 0 for e in seg_legend_entries(None))
    overlay = seg_overlay(astronaut_image(), labels)
    picture = draw_seg_legend(overlay, labels)
    assert picture.shape[0] == 512 and picture.shape[1] > 512 and np.array_equal(picture[:, :512], overlay)
    panel = picture[:, 512:].reshape(-1, 3)
    shown = {tuple(c) for c in panel.tolist()}
    for entry in entries:  # a swatch of every class present, none of the others
        assert (entry.color in shown) == bool(entry.pixels), entry.name
    assert np.array_equal(draw_seg_legend(overlay, np.full((512, 512), 255, np.uint8)), overlay)  # no class: no panel


# --------------------------------------------------------------------------------------------------------------------
# Layout helpers


def test_side_by_side_joins_image_and_picture_and_matches_heights():
    image = astronaut_image()
    joined = side_by_side(image, np.zeros_like(image))
    assert joined.shape == (512, 1024, 3) and np.array_equal(joined[:, :512], image)
    grey = side_by_side(image, np.full((256, 128), 7, np.uint8))  # resized to height 512, width 256
    assert grey.shape == (512, 768, 3) and (grey[:, 512:] == 7).all()
    with pytest.raises(ValueError, match="picture"):
        side_by_side(image, np.zeros((512, 512, 3), np.float32))


# --------------------------------------------------------------------------------------------------------------------
# The whole-image box (issue 41): not drawn; labels kept whole inside the image.


def _edge_difference(picture: np.ndarray, photo: np.ndarray) -> float:
    """Mean |picture - photo| over the outermost two pixel rows and columns (a frame drawn there makes it large)."""
    diff = np.abs(picture.astype(np.int16) - photo.astype(np.int16))
    edges = np.concatenate([diff[:2].reshape(-1, 3), diff[-2:].reshape(-1, 3), diff[:, :2].reshape(-1, 3),
                            diff[:, -2:].reshape(-1, 3)])  # fmt: skip
    return float(edges.mean())


def _label_pixels(picture: np.ndarray, photo: np.ndarray) -> np.ndarray:
    """(row, col) of the pixels where a thin red label (``id_color(0)``, blurred by JPEG) was drawn on the photo."""
    picture, photo = picture.astype(np.int16), photo.astype(np.int16)
    reddish = picture[..., 0] > picture[..., 1] + 50
    return np.argwhere(reddish & (np.abs(picture - photo).sum(axis=2) > 100))


def test_pose_picture_without_detector_draws_no_frame_and_its_label_inside(tiny_checkpoints, tmp_path, capsys):
    """``sapiens2 predict --task pose --detector none``: the person's box is the whole image; the picture's edges
    stay the photo's, and "#0" sits whole inside its top-left corner. Negative control: a box one pixel short of the
    whole image is drawn, and the same edge check sees it."""
    from sapiens2.cli import main

    photo = read_image(DATA / "astronaut.png")
    common = ["predict", "--task", "pose", str(DATA / "astronaut.png"), "--device", "cpu", "--input-size", "64", "48",
              f"--model=pose={tiny_checkpoints['pose']}"]  # fmt: skip
    assert main([*common, "-o", str(tmp_path / "whole"), "--detector", "none"]) == 0, capsys.readouterr().err
    picture = read_image(tmp_path / "whole" / "astronaut_pose.jpg")
    assert _edge_difference(picture, photo) < 8
    assert id_color(0) == (255, 55, 55)
    label = _label_pixels(picture[:40, :60], photo[:40, :60])
    assert len(label) > 20 and label[:, 0].min() >= 1 and label[:, 1].min() >= 1
    boxes = {"images": [{"id": 1, "file_name": "astronaut.png"}],
             "annotations": [{"image_id": 1, "bbox": [0, 0, 509, 509], "score": 1.0}]}  # fmt: skip
    (tmp_path / "boxes.json").write_text(json.dumps(boxes))
    argv = [*common, "-o", str(tmp_path / "inset"), "--boxes", str(tmp_path / "boxes.json")]
    assert main(argv) == 0, capsys.readouterr().err
    assert _edge_difference(read_image(tmp_path / "inset" / "astronaut_pose.jpg"), photo) > 30


def test_box_labels_at_the_image_edge_are_moved_inside_whole():
    """A label whose box touches the right or top edge is drawn whole: as many id-coloured pixels as the same
    label in the middle of the image, all inside."""
    image = np.zeros((300, 400, 3), np.uint8)
    names = keypoint_metadata().names

    def label_pixels(box):
        result = PoseResult(np.array([box], float), np.ones(1), np.zeros((1, 308, 2)), np.zeros((1, 308)), None,
                            (300, 400), names)  # fmt: skip
        plain = draw_pose(image, result, draw_boxes=True)
        labelled = draw_pose(image, result, draw_boxes=True, box_ids=[27])
        return np.argwhere((labelled != plain).any(axis=2))

    middle = label_pixels([150, 150, 250, 250])
    for box in ([392, 120, 399, 200], [100, 0, 200, 120], [395, 0, 399, 299]):
        moved = label_pixels(box)
        assert abs(len(moved) - len(middle)) <= 0.1 * len(middle), (box, len(moved), len(middle))
        assert moved[:, 1].max() < 400 and moved[:, 0].min() >= 0
