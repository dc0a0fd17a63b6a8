"""The ByteTrack-style tracker on synthetic box tracks: ids survive crossings and short occlusions; the assignment
solver is optimal (checked against brute force)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from videoclips import hidden_crossing

from sapiens2.video.track import (
    ByteTracker,
    TrackerOptions,
    appearance,
    appearance_distance,
    box_iou,
    linear_assignment,
)


def box(cx: float, cy: float, w: float = 24, h: float = 48) -> list[float]:
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def test_box_iou_of_known_boxes():
    iou = box_iou([[0, 0, 10, 10]], [[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30]])
    np.testing.assert_allclose(iou, [[1.0, 1 / 3, 0.0]])


def test_two_people_crossing_keep_their_ids_through_the_occlusion():
    """A walks right in front of B walking left; while they overlap B is half hidden (a low detector score) and
    for three frames not detected at all. After the crossing each keeps the id it started with."""
    tracker = ByteTracker()
    ids_a, ids_b = [], []
    for t in range(60):
        xa, xb = 20 + 4 * t, 260 - 4 * t
        boxes, scores = [box(xa, 100)], [0.9]
        overlap = abs(xa - xb) < 24
        if not overlap:
            boxes.append(box(xb, 100))
            scores.append(0.9)
        elif abs(xa - xb) > 8:  # partly hidden: a low-score detection, matched in the second stage
            boxes.append(box(xb, 100))
            scores.append(0.3)
        ids = tracker.update(np.array(boxes), np.array(scores))
        ids_a.append(ids[0])
        if len(ids) > 1:
            ids_b.append(ids[1])
    assert set(ids_a) == {1}, ids_a
    assert set(ids_b) == {2}, ids_b
    assert tracker.next_id == 3  # no id was ever handed out again


def test_a_track_lost_longer_than_max_lost_gets_a_new_id():
    tracker = ByteTracker(TrackerOptions(max_lost=5))
    assert tracker.update(np.array([box(50, 50)]), np.array([0.9])).tolist() == [1]
    for _ in range(7):
        tracker.update(np.zeros((0, 4)), np.zeros(0))
    assert tracker.update(np.array([box(50, 50)]), np.array([0.9])).tolist() == [2]


def test_low_scores_never_start_tracks_and_shapes_are_checked():
    tracker = ByteTracker()
    assert tracker.update(np.array([box(50, 50)]), np.array([0.3])).tolist() == [-1]
    assert not tracker.tracks
    try:
        tracker.update(np.array([box(50, 50)]), np.array([0.3, 0.4]))
    except ValueError as error:
        assert "2 scores for 1 boxes" in str(error)
    else:
        raise AssertionError("mismatched scores were accepted")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.floats(0.1, 1.5), st.integers(0, 10_000))
def test_assignment_is_optimal(rows, cols, max_cost, seed):
    """Most pairs matched under ``max_cost``, then the least total cost: the same as trying every permutation."""
    cost = np.random.default_rng(seed).random((rows, cols))
    pairs = linear_assignment(cost, max_cost)
    assert len({r for r, _ in pairs}) == len(pairs) == len({c for _, c in pairs})
    assert all(cost[r, c] <= max_cost for r, c in pairs)
    n = max(rows, cols)
    best = min(
        (-len(kept), sum(cost[r, c] for r, c in kept))
        for perm in itertools.permutations(range(n))
        for kept in [[(r, perm[r]) for r in range(rows) if perm[r] < cols and cost[r, perm[r]] <= max_cost]]
    )
    assert -len(pairs) == best[0]
    assert abs(sum(cost[r, c] for r, c in pairs) - best[1]) < 1e-9


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        # velocity of each person, pixels per frame; lanes are 120 px apart and boxes 48 px tall, so vertical speeds
        # within +-0.9 keep neighbours >= 72 - 39 x 1.8 px apart: they never overlap (the test's premise)
        st.tuples(st.floats(-3, 3), st.floats(-0.9, 0.9)),
        min_size=1,
        max_size=4,
    ),
    st.lists(st.integers(0, 39), max_size=6),  # frames at which one random person is missed
    st.integers(0, 1000),
)
def test_well_separated_people_keep_one_id_each(velocities, missed, seed):
    """People on separate lanes (never overlapping), moving at constant speed with detection noise and a few
    missed detections, each keep one id for the whole clip and no two share one."""
    rng = np.random.default_rng(seed)
    tracker = ByteTracker()
    seen: dict[int, set[int]] = {p: set() for p in range(len(velocities))}
    for t in range(40):
        people = [p for p in range(len(velocities)) if not (t in missed and p == t % len(velocities))]
        boxes = np.array([box(200 + velocities[p][0] * t, 60 + 120 * p + velocities[p][1] * t) for p in people])
        boxes += rng.normal(0, 0.5, boxes.shape)
        ids = tracker.update(boxes, np.full(len(people), 0.9))
        for p, track in zip(people, ids, strict=True):
            seen[p].add(int(track))
    assert all(len(ids) == 1 for ids in seen.values()), seen
    assert len({next(iter(ids)) for ids in seen.values()}) == len(velocities)


# ------------------------------------------------------------------ re-identification through a long occlusion


def _ids_through(hidden: int, options: TrackerOptions, changed: bool = False) -> tuple[list[int], list[int], int]:
    """Track ``videoclips.hidden_crossing``: each person's ids over the frames they were detected (-1 dropped: a
    half-hidden low score that matched no track), and the longest run of frames B was not detected at all."""
    frames, _, detections = hidden_crossing(hidden, changed=changed)
    tracker = ByteTracker(options)
    ids: dict[int, list[int]] = {0: [], 1: []}
    missed = longest = 0
    for image, (boxes, scores, who) in zip(frames, detections, strict=True):
        found = tracker.update(boxes, scores, image=image)
        for person, track in zip(who.tolist(), found.tolist(), strict=True):
            if track >= 0:
                ids[person].append(track)
        missed = 0 if 1 in who else missed + 1
        longest = max(longest, missed)
    return ids[0], ids[1], longest


def test_ids_hold_through_a_two_second_occlusion_by_appearance():
    """Two people crossing at 30 fps, the one behind fully hidden by the one in front for 60 frames (2 s; each
    detected box is the visible part, half-hidden ones score low): with re-identification each keeps one id.
    Without it (today's ByteTrack) the hidden person comes out with a new id, and already after 10 hidden frames,
    since the half-hidden boxes shrink and drag the motion prediction off the person."""
    a, b, hidden = _ids_through(60, TrackerOptions())
    assert hidden == 60
    assert set(a) == {1} and set(b) == {2}, (sorted(set(a)), sorted(set(b)))
    for frames in (10, 60):
        a, b, _ = _ids_through(frames, TrackerOptions(reid=False))
        assert set(a) == {1} and set(b) == {2, 3} and b.index(3) > b.index(2), frames  # negative control: split


def test_someone_else_coming_out_is_not_given_the_lost_id():
    """The same crossing, but who comes out from behind wears other colours: a new id, though the position fits."""
    a, b, _ = _ids_through(30, TrackerOptions(), changed=True)
    assert set(a) == {1} and set(b) == {2, 3}
    a, b, _ = _ids_through(30, TrackerOptions())
    assert set(b) == {2}  # the control: the same clothes keep the id


def test_re_identification_is_bounded_in_time_and_space():
    """Lost longer than ``reid_max_lost`` frames: a new id; a look-alike far from where the person was lost (more
    than a box height plus ``reid_speed`` heights per frame): a new id; near: the old one."""
    _, b, _ = _ids_through(60, TrackerOptions(reid_max_lost=40))
    assert set(b) == {2, 3}
    image = np.zeros((200, 400, 3), np.uint8)
    image[40:140, 20:80] = (200, 40, 40)
    image[40:140, 300:360] = (200, 40, 40)
    for x, expected in ((50, 1), (330, 2)):
        tracker = ByteTracker(TrackerOptions(max_lost=2, reid_speed=0.05))
        assert tracker.update(np.array([[20, 40, 80, 140]]), np.array([0.9]), image=image).tolist() == [1]
        for _ in range(10):  # lost 10 frames: it may have gone 100 x (1 + 0.5) = 150 px
            tracker.update(np.zeros((0, 4)), np.zeros(0), image=image)
        box = np.array([[x - 30, 40, x + 30, 140]])
        assert tracker.update(box, np.array([0.9]), image=image).tolist() == [expected], x


def test_appearance_tells_colours_apart_and_ignores_the_grey_background():
    rng = np.random.default_rng(0)
    image = rng.integers(60, 140, (100, 200, 3)).astype(np.uint8)
    grey = image.mean(axis=2, keepdims=True).astype(np.uint8)
    image = np.repeat(grey, 3, axis=2)
    image[20:80, 10:50] = (200, 40, 40)
    image[20:80, 110:150] = (40, 170, 60)
    red, red_wider, green = (appearance(image, b) for b in ([10, 20, 50, 80], [5, 15, 55, 85], [110, 20, 150, 80]))
    assert appearance_distance(red, red_wider) < 0.05 and appearance_distance(red, green) > 0.9
    assert appearance(image, [10, 20, 11, 21]) is None and abs(red.sum() - 1) < 1e-9


def test_a_run_resumed_mid_occlusion_keeps_the_ids():
    """The tracker's state as ``video.people.PoseStage`` saves it with each chunk (JSON) holds the appearances: a
    run stopped while B is hidden and resumed from that state gives every later frame the ids of a run never
    stopped; a state without the appearances (as before re-identification) would give B a new id."""
    import json

    from sapiens2.video.people import PoseStage
    from sapiens2.video.run import VideoOptions

    frames, _, detections = hidden_crossing(60)
    hidden = [t for t, (_, _, who) in enumerate(detections) if 1 not in who]
    stop = hidden[len(hidden) // 2]
    whole = PoseStage(None, VideoOptions(), None, None, 0)
    expected = [whole.tracker.update(b, s, image=f).tolist() for f, (b, s, _) in zip(frames, detections, strict=True)]
    first = PoseStage(None, VideoOptions(), None, None, 0)
    for image, (boxes, scores, _) in zip(frames[:stop], detections[:stop], strict=True):
        first.tracker.update(boxes, scores, image=image)
    state = json.loads(json.dumps(first.state()))
    for saved, ids_after in ((state, expected[stop:]), (None, None)):
        if saved is None:  # the control: the same state less the appearances
            saved = {**state, "tracks": [{k: v for k, v in t.items() if k != "look"} for t in state["tracks"]]}
        resumed = PoseStage(None, VideoOptions(), None, saved, stop)
        got = [resumed.tracker.update(b, s, image=f).tolist()
               for f, (b, s, _) in zip(frames[stop:], detections[stop:], strict=True)]  # fmt: skip
        if ids_after is not None:
            assert got == ids_after
        else:
            assert max(max(ids, default=0) for ids in got) == 3  # B came back as someone new
