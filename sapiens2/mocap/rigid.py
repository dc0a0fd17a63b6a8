"""Rigid parts fitted to camera rays (``docs/mocap.md``, "Lifting 2D keypoints to 3D"): the palm and the foot.

A few keypoints ride on one rigid part (the wrist and the four knuckles on the palm; the ankle and toes on the foot),
so in the part's own frame their centres (the skin point pushed its joint's depth along its ray) keep one shape. The
2D keypoints fix each centre's camera ray even where the pointmap saw something in front of it (the index knuckle in
front of the others in a hand seen edge-on, the foot over the ankle); the measured depths are right where nothing
covers them. Per track, the shape and every frame's pose are fitted together to both (a bundle adjustment with a
known camera): each frame's pose by Gauss-Newton on its points' distances to their rays and trusted depths, the
first point at its bone's length from the parent joint and every point near its places in the frames either side;
the shape by least squares over all frames' rays (the way ``solve`` triangulates markers); in turns, reweighted
(Cauchy). A measured depth nearer the camera than the fit (what covering does) is let go sooner than a farther one,
for the points their own part can cover (not the wrist: ``UNCOVERED``). A frame whose fit breaks the bone to the
parent joint (a mirrored pose the rays allow) is dropped.

The poses' Gauss-Newton steps every frame and start of every part at once, as one stack of 6x6 normal equations.
SciPy's ``least_squares`` over all frames at once was measured in their place (issue #40) and kept out. With a
finite-difference block-sparse Jacobian (``jac_sparsity``) it took 35x as long; with the analytic one as a sparse
matrix (the same model and derivatives, trust region with LSMR, ``x_scale="jac"``, tolerances 1e-12: ``python
benchmarks/mocap_solve.py --rigid least_squares``) the 96-frame walk's fit still took 2.3-5.2 s against 0.17-0.35 s
(13-16x, on a shared 2-core machine). The poses are independent given a round's weights, shape and neighbours, but
one trust region over them all steps as the hardest frame allows (about 17 evaluations a round, each with an
iterative sparse solve), where one batched 6x6 solve a step serves every frame. Nor can a solver run to convergence
give today's fits: three steps a round stop short of each round's optimum, so ``least_squares`` moves the walk's
fitted points by up to 27 um, as Gauss-Newton run to 30 steps a round does (the two converged fits agree to 1.3 um).

Axes: the camera frame, OpenCV (x right, y down, z forward), metres; rays pass through the camera centre (origin).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sapiens2.mocap.rig import rotation_class

__all__ = ["RIGID_PARTS", "UNCOVERED", "RigidFitOptions", "align_shape", "fit_rigid_part", "fit_rigid_parts"]

RIGID_PARTS = {
    f"{s}_{part}": tuple(f"{side}_{name}" for name in names)
    for s, side in (("l", "left"), ("r", "right"))
    for part, names in (
        ("palm", ("wrist", "forefinger_third_joint", "middle_finger_third_joint", "ring_finger_third_joint",
                  "pinky_finger_third_joint")),
        ("foot", ("ankle", "big_toe", "small_toe")),
    )
}  # fmt: skip
"""Part name -> the keypoints riding rigidly on it, the one hanging from the parent joint first. The thumb's base moves
against the palm, and the heel, hidden behind its own foot in most frames of a walk toward the camera, has no depth
to start its shape from (its marker is triangulated in the foot's frame afterwards, ``solve``), so both are left
out."""

UNCOVERED = frozenset({"left_wrist", "right_wrist"})
"""Keypoints their own part hardly covers: the wrist sits at the forearm's end, thicker than the palm, so the palm
does not hide it the way the index knuckle hides the others in a hand seen edge-on or the foot hides the ankle; a
measured depth of theirs nearer the camera than the fit is let go no sooner than a farther one (``far_scale``).
Something else in front of the wrist (the body) is the lifting's and the solver's occlusion tests' to find."""


@dataclass(frozen=True)
class RigidFitOptions:
    """How a rigid part is fitted (metres; every weight is against a ray's, 1 per metre squared).

    Attributes:
        depth_weight: weight of a trusted measured depth in each frame's pose.
        shape_depth_weight: its weight in the shape, which rests on the rays of all frames.
        near_scale, far_scale: metres at which a measured depth nearer / farther than the fit weighs half (Cauchy;
            nearer is what covering does, so it is let go sooner, for the points their part can cover).
        ray_scale: metres off its ray at which a point weighs half (a wrong 2D keypoint).
        anchor_weight, anchor_scale: weight of the first point keeping its bone's length from the parent joint (the
            wrist from the elbow, the ankle from the knee), and the metres off at which it weighs half.
        time_weight, time_scale: weight of each point staying near the mid-point of its places in the frames either
            side, and the metres off at which it weighs half (a frame alone cannot jump to a mirrored pose).
        rounds: turns of pose and shape fitting.
        min_rays: fewest trusted rays a frame needs for its pose; min_depth_share: share of its points whose depth
            must be trusted (at least one): a single depth fixes how far the part is, not how it tilts.
        max_miss: metres the fitted points may lie off their rays on average before the frame's fit is dropped.
        max_reach: metres the first point may lie off its bone's length from the parent joint before the frame's
            fit is dropped (a mirrored pose that the rays allow but the bone does not).
    """

    depth_weight: float = 0.25
    shape_depth_weight: float = 0.005
    near_scale: float = 0.003
    far_scale: float = 0.02
    ray_scale: float = 0.01
    anchor_weight: float = 0.25
    anchor_scale: float = 0.015
    time_weight: float = 0.02
    time_scale: float = 0.03
    rounds: int = 20
    min_rays: int = 3
    min_depth_share: float = 1 / 3
    max_miss: float = 0.01
    max_reach: float = 0.03


def _skew(v: np.ndarray) -> np.ndarray:
    """(..., 3) -> (..., 3, 3) cross-product matrices."""
    out = np.zeros(v.shape + (3,))
    out[..., 0, 1], out[..., 0, 2], out[..., 1, 2] = -v[..., 2], v[..., 1], -v[..., 0]
    out[..., 1, 0], out[..., 2, 0], out[..., 2, 1] = v[..., 2], -v[..., 1], v[..., 0]
    return out


def _exp(rotvec: np.ndarray) -> np.ndarray:
    """(..., 3) rotation vectors -> (..., 3, 3) matrices (SciPy's ``Rotation.from_rotvec``)."""
    matrices = rotation_class().from_rotvec(np.require(rotvec.reshape(-1, 3), np.float64, ["C", "W"])).as_matrix()
    return matrices.reshape(rotvec.shape + (3,))


def align_shape(shape: np.ndarray, points: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rotation and translation taking (n, 3) ``shape`` onto each frame's (T, n, 3) ``points`` with (T, n)
    weights (weighted least squares; the Kabsch solution that ``Rotation.align_vectors`` gives for the centred
    points). Returns (T, 3, 3) rotations and (T, 3) translations.

    All frames are one stack of 3x3 SVDs here: ``align_vectors`` takes one frame a call, and the four parts of a
    96-frame walk start from about 1,500 alignments. ``tests/test_mocap_lift.py`` checks the two agree.
    """
    w = weights / np.maximum(weights.sum(1, keepdims=True), 1e-12)
    mean_s = np.einsum("tn,nc->tc", w, shape)
    mean_p = np.einsum("tn,tnc->tc", w, points)
    cov = np.einsum("tn,tna,tnb->tab", w, points - mean_p[:, None], shape[None] - mean_s[:, None])
    u, _, vt = np.linalg.svd(cov)
    u[..., :, 2] *= np.sign(np.linalg.det(u @ vt))[:, None]  # a rotation, not a reflection
    rot = u @ vt
    return rot, mean_p - np.einsum("tab,tb->ta", rot, mean_s)


@dataclass(frozen=True)
class _Track:
    """The usable frames of one or more parts of n points each, one part's after the other's (F frames in all): (F, n,
    3) measured points and unit rays, (F, n) ray and depth trust (0/1), (n,) which points the parts can cover, and
    the parent joint the first point hangs from: (F, 3) positions, (F,) trust and the bone's length (m). ``part``
    (F,) is each frame's part, ``first`` / ``last`` (F,) its part's first and last frame, ``before`` / ``after``
    (F,) its neighbours in its part (the one neighbour at the ends), and ``bounds`` (P + 1,) where each part's frames
    begin, then the end."""

    measured: np.ndarray
    rays: np.ndarray
    ray_ok: np.ndarray
    depth_ok: np.ndarray
    coverable: np.ndarray
    anchor: np.ndarray
    anchor_ok: np.ndarray
    length: np.ndarray
    part: np.ndarray
    first: np.ndarray
    last: np.ndarray
    before: np.ndarray
    after: np.ndarray
    bounds: np.ndarray


def _place(shape: np.ndarray, rot: np.ndarray, trans: np.ndarray) -> np.ndarray:
    """(..., F, n, 3) each frame's (F, n, 3) shape at the (..., F) poses."""
    return shape @ np.swapaxes(rot, -1, -2) + trans[..., None, :]


def _between(fitted: np.ndarray, track: _Track) -> np.ndarray:
    """(F, n, 3) the mid-point of each point's places in the frames either side (the one neighbour at the ends)."""
    return 0.5 * (fitted[track.before] + fitted[track.after])


def _residuals(fitted: np.ndarray, track: _Track, between: np.ndarray) -> tuple[np.ndarray, ...]:
    """(..., F, n) how far each fitted point lies off its ray; (..., F, n) how far along it beyond the measured point
    (> 0: the measured point is nearer the camera than the fit); (..., F) how far the first point is off its bone's
    length; (..., F, n) how far each point is from ``between``. ``fitted`` (..., F, n, 3): leading axes are other
    fits of the same track (``_best_poses``' starts)."""
    off = fitted - track.measured
    along = np.einsum("...nc,...nc->...n", off, track.rays)
    miss = np.linalg.norm(off - along[..., None] * track.rays, axis=-1)
    reach = np.linalg.norm(fitted[..., 0, :] - track.anchor, axis=-1) - track.length
    return miss, along, reach, np.linalg.norm(fitted - between, axis=-1)


def _terms(fitted: np.ndarray, track: _Track, between: np.ndarray, opts: RigidFitOptions) -> list[tuple]:
    """(weight, scale, residual) of each kind of term: the rays, the depths, the anchor, time."""
    miss, along, reach, jump = _residuals(fitted, track, between)
    nearer = (along > 0) & track.coverable  # a depth seen nearer than the fit, of a point the part can cover
    return [
        (track.ray_ok, opts.ray_scale, miss),
        (opts.depth_weight * track.depth_ok, np.where(nearer, opts.near_scale, opts.far_scale), along),
        (opts.anchor_weight * track.anchor_ok, opts.anchor_scale, reach),
        (opts.time_weight, opts.time_scale, jump),
    ]


def _weights(fitted: np.ndarray, track: _Track, between: np.ndarray, opts: RigidFitOptions) -> list[np.ndarray]:
    """The robust weights (Cauchy: a residual at its scale weighs half) of the current fit, per kind of term."""
    return [
        weight / (1.0 + (residual / scale) ** 2) for weight, scale, residual in _terms(fitted, track, between, opts)
    ]


def _cost(fitted: np.ndarray, track: _Track, between: np.ndarray, opts: RigidFitOptions) -> np.ndarray:
    """(..., T) each frame's robust cost, the one ``_weights`` reweights."""
    total = np.zeros(fitted.shape[:-2])
    for weight, scale, residual in _terms(fitted, track, between, opts):
        cost = weight * scale**2 * np.log1p((residual / scale) ** 2)
        total += cost if cost.ndim == total.ndim else cost.sum(-1)  # per point, or per frame (the anchor)
    return total


def _metrics(rays: np.ndarray, ray_w: np.ndarray, depth_w: np.ndarray) -> np.ndarray:
    """(T, n, 3, 3) ray_w (I - u u^T) + depth_w u u^T: the quadratic form of a point's miss from its measurement."""
    along = rays[..., :, None] * rays[..., None, :]
    return ray_w[..., None, None] * (np.eye(3) - along) + depth_w[..., None, None] * along


def _poses(shape: np.ndarray, track: _Track, between: np.ndarray, weights: list[np.ndarray], rot: np.ndarray,
           trans: np.ndarray, iterations: int = 3) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Gauss-Newton on each frame's pose (R, p), the weights held: the points R s + p near their rays, trusted
    depths and ``between``, the first one at its bone's length from the anchor. ``rot`` (..., T, 3, 3) and ``trans``
    (..., T, 3): leading axes are other starts of the same frames, all frames and starts stepped at once (their
    (6, 6) normal equations solved as one stack)."""
    ray_w, depth_w, anchor_w, time_w = weights
    # the ray/depth form about the measured point plus time_w |x - between|^2 is one form about a blended target
    metric = _metrics(track.rays, ray_w, depth_w)
    pull = (np.broadcast_to(time_w, ray_w.shape)[..., None, None] + 1e-9) * np.eye(3)
    target = np.linalg.solve(metric + pull, (metric @ track.measured[..., None] + pull @ between[..., None]))[..., 0]
    metric = metric + pull  # (T, n, 3, 3) M
    # d(R s + p) / d(rotation, translation) = [-[R s]x, I] =: [A, I]: the normal equations by blocks, sum_n A^T M A,
    # sum_n M A (its transpose above the diagonal) and sum_n M, which the iterations do not change
    hess = np.empty(rot.shape[:-2] + (6, 6))
    hess[..., 3:, 3:] = metric.sum(-3) + 1e-9 * np.eye(3)
    grad = np.empty(rot.shape[:-2] + (6,))
    for _ in range(iterations):
        arm = shape @ np.swapaxes(rot, -1, -2)  # (..., T, n, 3) R s_k
        error = arm + trans[..., None, :] - target
        turn = -_skew(arm)  # (..., T, n, 3, 3) A
        metric_turn = metric @ turn
        metric_error = metric @ error[..., None]  # (..., T, n, 3, 1)
        # the sums over the points as one product: (..., T, n, 3, k) -> (..., T, 3n, k)
        turn_t = np.swapaxes(turn.reshape(turn.shape[:-3] + (-1, 3)), -1, -2)  # (..., T, 3, 3n)
        hess[..., :3, :3] = turn_t @ metric_turn.reshape(turn_t.shape[:-2] + (-1, 3)) + 1e-9 * np.eye(3)
        hess[..., 3:, :3] = metric_turn.sum(-3)
        hess[..., :3, 3:] = np.swapaxes(hess[..., 3:, :3], -1, -2)
        grad[..., :3] = (turn_t @ metric_error.reshape(turn_t.shape[:-2] + (-1, 1)))[..., 0]
        grad[..., 3:] = metric_error.sum(-3)[..., 0]
        # the first point at the bone's length from the anchor: residual |x0 - a| - L along their direction d, whose
        # row of the Jacobian is d^T [A_0, I] = [(A_0^T d)^T, d^T]
        towards = arm[..., 0, :] + trans - track.anchor
        distance = np.linalg.norm(towards, axis=-1)
        direction = towards / np.maximum(distance, 1e-9)[..., None]
        row = np.concatenate([(np.swapaxes(turn[..., 0, :, :], -1, -2) @ direction[..., None])[..., 0], direction], -1)
        system = hess + anchor_w[:, None, None] * row[..., :, None] * row[..., None, :]
        step = -np.linalg.solve(system, (grad + (anchor_w * (distance - track.length))[..., None] * row)[..., None])
        rot = _exp(step[..., :3, 0]) @ rot
        trans = trans + step[..., 3:, 0]
    return rot, trans


def _best_poses(shape: np.ndarray, track: _Track, between: np.ndarray, weights: list[np.ndarray], rot: np.ndarray,
                trans: np.ndarray, opts: RigidFitOptions) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Gauss-Newton from each frame's own pose and from its neighbours' (a mirrored pose fits the rays of a flat part
    about as well; time tells them apart), the three starts at once: per frame the start that ends with the least
    robust cost (the first of equals; a frame where none has a finite cost keeps its pose)."""
    frames = np.arange(len(rot))
    starts = np.stack([np.clip(frames + shift, track.first, track.last) for shift in (0, -1, 1)])  # (3, F)
    r, p = _poses(shape, track, between, weights, rot[starts], trans[starts])  # (3, F, 3, 3), (3, F, 3)
    cost = _cost(_place(shape, r, p), track, between, opts)  # (3, F)
    cost = np.where(np.isnan(cost), np.inf, cost)
    pick = np.argmin(cost, axis=0)
    found = cost[pick, frames] < np.inf
    return np.where(found[:, None, None], r[pick, frames], rot), np.where(found[:, None], p[pick, frames], trans)


def _shape(shape: np.ndarray, track: _Track, ray_w: np.ndarray, depth_w: np.ndarray, rot: np.ndarray,
           trans: np.ndarray) -> np.ndarray:  # fmt: skip
    """(P, n, 3) each part's points in its frame: least squares over its frames of their rays and depths (rotated
    into it), the way ``solve`` triangulates markers."""
    metric = _metrics(track.rays, ray_w, depth_w)
    rot_t = np.swapaxes(rot, -1, -2)[:, None]  # (F, 1, 3, 3)
    local = rot_t @ (track.measured - trans[:, None])[..., None]  # (F, n, 3, 1) R^T (m - p)
    local_metric = rot_t @ metric @ rot[:, None]  # (F, n, 3, 3) R^T M R
    starts = track.bounds[:-1]
    a = np.add.reduceat(local_metric, starts, axis=0) + 1e-9 * np.eye(3)  # (P, n, 3, 3): sums over each part's frames
    b = np.add.reduceat(local_metric @ local, starts, axis=0)[..., 0]
    solved = np.linalg.solve(a, b[..., None])[..., 0]
    enough = np.linalg.eigvalsh(a)[..., 0] > 1e-6
    return np.where(enough[..., None], solved, shape)


def _start(measured: np.ndarray, depth_ok: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A first shape and poses of one part, (T, n, 3) ``measured`` and (T, n) ``depth_ok``: generalised Procrustes
    over the trusted measured points, from the frame with most."""
    weight = depth_ok + 1e-3
    shape = measured[np.argmax(depth_ok.sum(1))]
    shape = shape - shape.mean(0)
    for _ in range(3):
        rot, trans = align_shape(shape, measured, weight)
        local = np.einsum("tba,tnb->tna", rot, measured - trans[:, None])
        shape = (weight[..., None] * local).sum(0) / weight.sum(0)[:, None]
    rot, trans = align_shape(shape, measured, weight)
    return shape, rot, trans


def fit_rigid_part(measured: np.ndarray, ray_ok: np.ndarray, depth_ok: np.ndarray, anchor: np.ndarray | None = None,
                   anchor_ok: np.ndarray | None = None, length: float = 0.0, coverable: np.ndarray | None = None,
                   options: RigidFitOptions | None = None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Fit one rigid part to its points' rays and depths over a track.

    Args:
        measured: (T, n, 3) the points' measured centres, each on its camera ray (finite where ``ray_ok``).
        ray_ok: (T, n) bool, the point's 2D keypoint (hence its ray) is trusted.
        depth_ok: (T, n) bool, its measured depth is trusted too (seen, not flagged as occluded).
        anchor, anchor_ok, length: (T, 3) the parent joint the first point hangs from, (T,) bool where it was
            measured, and the bone's length (m); None: no anchor.
        coverable: (n,) bool, the points the part itself can cover (their depths seen nearer than the fit are let
            go at ``near_scale``; the others at ``far_scale`` either way); None: all.
        options: :class:`RigidFitOptions`.

    Returns:
        (T, n, 3) the fitted points (the learned shape at each frame's pose) and (T,) bool, the frames whose fit
        holds (enough trusted rays and depths, the points near their rays, the first one near its bone's length
        from the anchor); the other frames keep ``measured``.
    """
    return fit_rigid_parts([measured], [ray_ok], [depth_ok], [anchor], [anchor_ok], [length], coverable, options)[0]


def fit_rigid_parts(measured: Sequence[np.ndarray], ray_ok: Sequence[np.ndarray], depth_ok: Sequence[np.ndarray],
                    anchor: Sequence[np.ndarray | None], anchor_ok: Sequence[np.ndarray | None],
                    length: Sequence[float], coverable: np.ndarray | None = None,
                    options: RigidFitOptions | None = None) -> list[tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """Fit several rigid parts with the same number n of points (the two palms, the two feet) at once: one part's
    fit each, as :func:`fit_rigid_part` gives it, but the frames of all of them in each step's arrays (a part's fit
    is a few hundred small array operations whatever its length, so fitting them together costs little more than
    one). Each argument but ``coverable`` and ``options`` has one entry per part, as :func:`fit_rigid_part` takes
    it; tracks may differ in length.

    Returns:
        Per part, (T, n, 3) the fitted points and (T,) bool the frames whose fit holds.

    Raises:
        ValueError: the parts have different numbers of points.
    """
    opts = options or RigidFitOptions()
    if len({np.shape(m)[1] for m in measured}) > 1:
        raise ValueError(f"fit_rigid_parts: parts of different sizes {[np.shape(m)[1] for m in measured]}")
    outputs, kept = [], []  # kept: (part, usable frames, rays) of the parts with enough frames to fit
    for number, points in enumerate(measured):
        frames = len(points)
        points = np.where(np.isfinite(points), points, 0.0)
        rays_ok = ray_ok[number] & (np.linalg.norm(points, axis=-1) > 1e-6)
        depths_ok = depth_ok[number] & rays_ok
        min_depths = max(1, round(opts.min_depth_share * points.shape[1]))
        usable = (rays_ok.sum(1) >= opts.min_rays) & (depths_ok.sum(1) >= min_depths)
        outputs.append((points, np.zeros(frames, bool)))
        if usable.sum() >= 3:
            kept.append((number, usable, rays_ok, depths_ok))
    if not kept:
        return outputs
    columns: dict[str, list[np.ndarray]] = {name: [] for name in ("measured", "ray_ok", "depth_ok", "anchor",
                                                                  "anchor_ok", "length")}  # fmt: skip
    for number, usable, rays_ok, depths_ok in kept:
        points, frames = outputs[number][0], len(outputs[number][0])
        joint, joint_ok = anchor[number], anchor_ok[number]
        if joint is None or joint_ok is None:
            joint, joint_ok = np.zeros((frames, 3)), np.zeros(frames, bool)
        joint_ok = joint_ok & np.isfinite(joint).all(1)
        columns["measured"].append(points[usable])
        columns["ray_ok"].append(rays_ok[usable].astype(np.float64))
        columns["depth_ok"].append(depths_ok[usable].astype(np.float64))
        columns["anchor"].append(np.nan_to_num(joint[usable]))
        columns["anchor_ok"].append(joint_ok[usable].astype(np.float64))
        columns["length"].append(np.full(int(usable.sum()), float(length[number])))
    track = _make_track(columns, coverable)
    starts = [_start(m, d) for m, d in zip(columns["measured"], columns["depth_ok"], strict=True)]
    shape = np.stack([start[0] for start in starts])  # (P, n, 3)
    rot, trans = np.concatenate([start[1] for start in starts]), np.concatenate([start[2] for start in starts])
    framed = shape[track.part]  # (F, n, 3) each frame's part's shape
    between = _between(_place(framed, rot, trans), track)
    weights = _weights(_place(framed, rot, trans), track, between, opts)
    for _ in range(opts.rounds):
        rot, trans = _best_poses(framed, track, between, weights, rot, trans, opts)
        # the shape rests on the rays of all frames: a depth wrong in many of them (a knuckle behind the index one)
        # pulls it only weakly, while each frame's pose needs the depths to know how far away it is
        ray_w, depth_w = weights[:2]
        shape = _shape(shape, track, ray_w, depth_w * (opts.shape_depth_weight / opts.depth_weight), rot, trans)
        framed = shape[track.part]
        fitted = _place(framed, rot, trans)
        between = _between(fitted, track)
        weights = _weights(fitted, track, between, opts)
    rot, trans = _poses(framed, track, between, weights, rot, trans)
    fitted = _place(framed, rot, trans)
    miss, _, reach, _ = _residuals(fitted, track, between)
    holds = (miss * track.ray_ok).sum(1) / np.maximum(track.ray_ok.sum(1), 1) < opts.max_miss
    holds &= (np.abs(reach) <= opts.max_reach) | (track.anchor_ok == 0)
    for (number, usable, _, _), begin, end in zip(kept, track.bounds[:-1], track.bounds[1:], strict=True):
        points, good = outputs[number][0].copy(), outputs[number][1]
        index = np.flatnonzero(usable)[holds[begin:end]]
        points[index] = fitted[begin:end][holds[begin:end]]
        good[index] = True
        outputs[number] = (points, good)
    return outputs


def _make_track(columns: dict[str, list[np.ndarray]], coverable: np.ndarray | None) -> _Track:
    """The parts' usable frames (``columns``: per field, one array per part) one after the other, with where each
    part begins and each frame's neighbours in its part."""
    sizes = np.array([len(m) for m in columns["measured"]])
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    part = np.repeat(np.arange(len(sizes)), sizes)
    first, last = bounds[:-1][part], bounds[1:][part] - 1
    frames = np.arange(bounds[-1])
    before = np.where(frames > first, frames - 1, frames + 1)  # the first frame's only neighbour is the next one
    after = np.where(frames < last, frames + 1, frames - 1)
    measured = np.concatenate(columns["measured"])
    rays = measured / np.maximum(np.linalg.norm(measured, axis=-1, keepdims=True), 1e-12)
    coverable = np.ones(measured.shape[1], bool) if coverable is None else np.asarray(coverable, bool)
    return _Track(measured, rays, np.concatenate(columns["ray_ok"]), np.concatenate(columns["depth_ok"]), coverable,
                  np.concatenate(columns["anchor"]), np.concatenate(columns["anchor_ok"]),
                  np.concatenate(columns["length"]), part, first, last, before, after, bounds)  # fmt: skip
