"""The ByteTrack-style tracker on synthetic box tracks: ids survive crossings and short occlusions; the assignment
solver is optimal (checked against brute force)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sapiens2.video.track import ByteTracker, TrackerOptions, box_iou, linear_assignment


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
