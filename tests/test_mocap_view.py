"""The mocap overlay's 3D view and depth panel, checked by their drawn pixels: the view frames the skeleton it
draws even with wild points, always draws the floor and the axes, and says when the lifted points cannot be a
person's; the depth panel carries a colour bar in metres (issue 41)."""

from __future__ import annotations

import logging

import cv2
import numpy as np
from conftest import DATA, TINY_INPUT
from mocap_synth import walk_clip
from test_mocap_run import av, oracles, synth_clip

from sapiens2.mocap import view as view_module
from sapiens2.mocap.run import MocapOptions, run_mocap
from sapiens2.mocap.view import SkeletonView, bone_table, plausibility
from sapiens2.pose.keypoints import skeleton_layout
from sapiens2.predict.visualize import colorize_depth, depth_range, id_color
from sapiens2.video import VideoOptions

SIZE = 360
_LINKS = np.array(sorted({tuple(c) for c in skeleton_layout("sapiens308").link_colors.tolist()}), np.int64)


def _near(panel: np.ndarray, colours: np.ndarray, tolerance: int = 40) -> np.ndarray:
    """(H, W) bool: pixels within ``tolerance`` (sum of |RGB| differences) of any of ``colours`` (K, 3)."""
    diff = np.abs(panel[:, :, None, :].astype(np.int64) - colours[None, None]).sum(axis=3)
    return (diff < tolerance).any(axis=2)


def skeleton_pixels(panel: np.ndarray) -> np.ndarray:
    """(row, col) of the pixels in the 308 links' colours or track 1's, outside the text band at the top and the
    axes sign at the lower left (whose colours are near some links')."""
    size = panel.shape[0]
    mask = _near(panel, np.vstack([_LINKS, [id_color(1)]]))
    mask[: size // 9] = False
    mask[-size // 4 :, : size // 4] = False
    return np.argwhere(mask)


def frames_the_skeleton(panel: np.ndarray) -> bool:
    """Skeleton pixels spanning at least 40 % of the panel's height: a person in view, not a dot."""
    found = skeleton_pixels(panel)
    return len(found) > 200 and np.ptp(found[:, 0]) > 0.4 * panel.shape[0]


def floor_pixels(panel: np.ndarray) -> int:
    return int((np.abs(panel.astype(np.int64) - 70).max(axis=2) <= 12).sum())  # the grid's grey (70, 70, 70)


def axes_drawn(panel: np.ndarray) -> bool:
    """The x (red), up (green) and z (blue) arrows in the lower-left corner."""
    corner = panel[-panel.shape[0] // 4 :, : panel.shape[1] // 4]
    colours = [(230, 70, 70), (70, 200, 70), (80, 140, 255)]
    return all(_near(corner, np.array([c]), 60).sum() >= 8 for c in colours)


def warning_pixels(panel: np.ndarray) -> int:
    """Pixels of the red warning text in the top band."""
    return int(_near(panel[: panel.shape[0] // 8], np.array([(255, 80, 80)]), 60).sum())


def person(frame: int = 10) -> np.ndarray:
    """(308, 3) keypoints of the synthetic walk (a 1.75 m adult, 4 m from the camera)."""
    return walk_clip().markers[frame].copy()


def with_outliers(points: np.ndarray) -> np.ndarray:
    """Three keypoints hundreds of metres away, as a bad depth gives."""
    points = points.copy()
    points[[5, 50, 200]] = [[40.0, -300.0, 900.0], [-500.0, 20.0, 3.0], [3.0, 3.0, 2000.0]]
    return points


def test_the_view_frames_the_skeleton_and_draws_the_floor_and_axes(monkeypatch):
    for name, points in [("normal", person()), ("outliers", with_outliers(person()))]:
        panel = SkeletonView(SIZE)({1: points})
        assert frames_the_skeleton(panel), name
        assert floor_pixels(panel) > 400 and axes_drawn(panel), name
        assert warning_pixels(panel) == 0, name  # a real person's size
    empty = SkeletonView(SIZE)({})  # nobody yet: the floor and the axes all the same, and no skeleton
    assert floor_pixels(empty) > 400 and axes_drawn(empty) and not len(skeleton_pixels(empty))
    # Negative control: framing by the min and max of every point (the rule before) shrinks the person to a dot.
    monkeypatch.setattr(view_module, "robust_inliers", lambda points: np.isfinite(points).all(axis=1))
    assert not frames_the_skeleton(SkeletonView(SIZE)({1: with_outliers(person())}))


def test_the_view_follows_a_walk_and_snaps_back_after_a_wild_frame():
    view = SkeletonView(SIZE)
    for t in range(0, 40, 4):
        assert frames_the_skeleton(view({1: person(t)})), t
    garbage = person(40) * 1000.0  # one frame of nonsense (all points), then the person again
    assert frames_the_skeleton(view({1: garbage}))
    assert frames_the_skeleton(view({1: person(44)}))


def test_the_view_says_when_the_lifted_points_are_implausible(caplog):
    bones, expected = bone_table()
    assert len(bones) >= 8 and 0.7 < plausibility(person(), bones, expected) < 1.4
    assert 7 < plausibility(person() * 10.0, bones, expected) < 14
    view = SkeletonView(SIZE)
    with caplog.at_level(logging.WARNING, logger="sapiens2.mocap.view"):
        for _ in range(3):
            panel = view({1: person() * 10.0})  # bones 10x too long
    assert warning_pixels(panel) > 30 and frames_the_skeleton(panel)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "track 1" in warnings[0] and "implausible" in warnings[0]  # once per track
    assert warning_pixels(SkeletonView(SIZE)({1: person()})) == 0


def test_the_view_frames_and_flags_what_tiny_random_models_lift_from_a_photo(tiny_checkpoints):
    """The reported case: the fixtures' tiny random models on a real photo lift points millions of metres away;
    the view still frames them, draws the floor and axes, and says they are implausible."""
    from sapiens2 import Predictor
    from sapiens2.data.io import read_image
    from sapiens2.mocap.lift import lift_frame

    image = read_image(DATA / "astronaut.png")
    pose = Predictor("pose", model=tiny_checkpoints["pose"], detector=None, device="cpu", input_size=(64, 48))
    pointmap = Predictor(
        "pointmap", model=tiny_checkpoints["pointmap"], device="cpu", input_size=TINY_INPUT["pointmap"]
    )
    people, points = pose(image), pointmap(image).points
    lifted = lift_frame(people.keypoints[0], people.scores[0], points, None)
    panel = SkeletonView(SIZE)({1: np.asarray(lifted.keypoints)})
    assert floor_pixels(panel) > 400 and axes_drawn(panel) and warning_pixels(panel) > 30
    assert len(skeleton_pixels(panel)) > 200


def colour_bar_levels(panel: np.ndarray) -> tuple[np.ndarray, float] | None:
    """The turbo levels down the most turbo-like column in the right 15 % of a depth panel, over its middle half
    of rows, and their mean colour error; None without any column whose colours run from near (high levels, top)
    to far (low levels, bottom) over most of the colormap."""
    turbo = cv2.applyColorMap(np.arange(256, dtype=np.uint8)[:, None], cv2.COLORMAP_TURBO)[:, 0, ::-1].astype(int)
    height, width = panel.shape[:2]
    best = None
    for column in range(width - width // 7, width):
        pixels = panel[height // 4 : 3 * height // 4, column].astype(int)  # (R, 3)
        distance = np.abs(pixels[:, None] - turbo[None]).sum(axis=2)  # (R, 256)
        levels, error = distance.argmin(axis=1), float(distance.min(axis=1).mean())
        falling = np.mean(np.diff(levels) <= 2)  # down the column the levels fall (a little noise allowed)
        if error < 40 and falling > 0.9 and levels[0] - levels[-1] > 100 and (best is None or error < best[1]):
            best = (levels, error)
    return best


def test_the_mocap_overlay_depth_panel_has_a_colour_bar_and_the_view_a_floor(tmp_path):
    """Through ``run_mocap`` on the synthetic walk (Oracle networks, real decode/encode): the overlay frame is
    [frame | depth | 3D view]; the depth panel's right edge carries the turbo colours from near to far, the 3D
    view a skeleton, the floor and the axes. Negative control: the depth picture without the bar has no such
    column (its floor runs the other way, near at the bottom)."""
    clip, truth = synth_clip(tmp_path / "walk.mp4", 4)
    video = VideoOptions(smooth="none", save_dense=False)
    report = run_mocap(oracles(truth), clip, tmp_path / "out", MocapOptions(video=video, formats=("bvh",)),
                       progress=False)  # fmt: skip
    assert report.error is None
    with av.open(str(tmp_path / "out" / "walk_overlay.mp4")) as container:
        overlay = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)][-1]
    height, width = truth.size
    depth_panel, view = overlay[:, width : 2 * width], overlay[:, 2 * width :]
    assert view.shape[:2] == (height, height)
    assert colour_bar_levels(depth_panel) is not None
    depth = truth.frame(3).pointmap[..., 2]
    assert colour_bar_levels(colorize_depth(depth, value_range=depth_range(depth))) is None
    assert len(skeleton_pixels(view)) > 100 and floor_pixels(view) > 300 and axes_drawn(view)
    metres = np.abs(depth_panel.astype(int) - 255).max(axis=2) < 40  # the white tick labels beside the bar
    assert metres[:, width - width // 5 :].sum() > 40
