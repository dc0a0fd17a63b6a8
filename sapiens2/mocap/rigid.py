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

Axes: the camera frame, OpenCV (x right, y down, z forward), metres; rays pass through the camera centre (origin).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RIGID_PARTS", "UNCOVERED", "RigidFitOptions", "fit_rigid_part"]

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
    """(..., 3) rotation vectors -> (..., 3, 3) matrices (Rodrigues)."""
    angle = np.linalg.norm(rotvec, axis=-1)[..., None, None]
    k = _skew(rotvec / np.maximum(angle[..., 0], 1e-12))
    return np.eye(3) + np.sin(angle) * k + (1 - np.cos(angle)) * (k @ k)


def _kabsch(shape: np.ndarray, points: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(T, 3, 3), (T, 3): the rotation and translation taking (n, 3) ``shape`` onto each frame's (T, n, 3)
    ``points`` with (T, n) weights (least squares)."""
    w = weights / np.maximum(weights.sum(1, keepdims=True), 1e-12)
    mean_s = np.einsum("tn,nc->tc", w, shape)
    mean_p = np.einsum("tn,tnc->tc", w, points)
    cov = np.einsum("tn,tna,tnb->tab", w, points - mean_p[:, None], shape[None] - mean_s[:, None])
    u, _, vt = np.linalg.svd(cov)
    u[..., :, 2] *= np.sign(np.linalg.det(u @ vt))[:, None]
    rot = u @ vt
    return rot, mean_p - np.einsum("tab,tb->ta", rot, mean_s)


@dataclass(frozen=True)
class _Track:
    """The usable frames of one part: (T, n, 3) measured points and unit rays, (T, n) ray and depth trust (0/1), (n,)
    which points the part can cover, and the parent joint the first point hangs from: (T, 3) positions, (T,) trust,
    and the bone's length (m)."""

    measured: np.ndarray
    rays: np.ndarray
    ray_ok: np.ndarray
    depth_ok: np.ndarray
    coverable: np.ndarray
    anchor: np.ndarray
    anchor_ok: np.ndarray
    length: float


def _place(shape: np.ndarray, rot: np.ndarray, trans: np.ndarray) -> np.ndarray:
    return shape @ np.swapaxes(rot, -1, -2) + trans[:, None]


def _between(fitted: np.ndarray) -> np.ndarray:
    """(T, n, 3) the mid-point of each point's places in the frames either side (the one neighbour at the ends)."""
    before = np.concatenate([fitted[1:2], fitted[:-1]])
    after = np.concatenate([fitted[1:], fitted[-2:-1]])
    return 0.5 * (before + after)


def _residuals(fitted: np.ndarray, track: _Track, between: np.ndarray) -> tuple[np.ndarray, ...]:
    """(T, n) how far each fitted point lies off its ray; (T, n) how far along it beyond the measured point (> 0:
    the measured point is nearer the camera than the fit); (T,) how far the first point is off its bone's length;
    (T, n) how far each point is from ``between``."""
    off = fitted - track.measured
    along = np.einsum("tnc,tnc->tn", off, track.rays)
    miss = np.linalg.norm(off - along[..., None] * track.rays, axis=-1)
    reach = np.linalg.norm(fitted[:, 0] - track.anchor, axis=-1) - track.length
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
    """(T,) each frame's robust cost, the one ``_weights`` reweights."""
    total = np.zeros(len(fitted))
    for weight, scale, residual in _terms(fitted, track, between, opts):
        cost = weight * scale**2 * np.log1p((residual / scale) ** 2)
        total += cost.reshape(len(fitted), -1).sum(1)
    return total


def _metrics(rays: np.ndarray, ray_w: np.ndarray, depth_w: np.ndarray) -> np.ndarray:
    """(T, n, 3, 3) ray_w (I - u u^T) + depth_w u u^T: the quadratic form of a point's miss from its measurement."""
    along = rays[..., :, None] * rays[..., None, :]
    return ray_w[..., None, None] * (np.eye(3) - along) + depth_w[..., None, None] * along


def _poses(shape: np.ndarray, track: _Track, between: np.ndarray, weights: list[np.ndarray], rot: np.ndarray,
           trans: np.ndarray, iterations: int = 3) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Gauss-Newton on each frame's pose (R, p), the weights held: the points R s + p near their rays, trusted
    depths and ``between``, the first one at its bone's length from the anchor."""
    ray_w, depth_w, anchor_w, time_w = weights
    # the ray/depth form about the measured point plus time_w |x - between|^2 is one form about a blended target
    metric = _metrics(track.rays, ray_w, depth_w)
    pull = (np.broadcast_to(time_w, ray_w.shape)[..., None, None] + 1e-9) * np.eye(3)
    target = np.linalg.solve(metric + pull, (metric @ track.measured[..., None] + pull @ between[..., None]))[..., 0]
    metric = metric + pull
    eye = np.broadcast_to(np.eye(3), (len(rot), len(shape), 3, 3))
    for _ in range(iterations):
        arm = shape @ np.swapaxes(rot, -1, -2)  # (T, n, 3) R s_k
        error = arm + trans[:, None] - target
        jac = np.concatenate([-_skew(arm), eye], -1)  # (T, n, 3, 6): d(R s + p) / d(rotation, translation)
        jac_t = np.swapaxes(jac, -1, -2)
        hess = (jac_t @ (metric @ jac)).sum(1) + 1e-9 * np.eye(6)
        grad = (jac_t @ (metric @ error[..., None]))[..., 0].sum(1)
        # the first point at the bone's length from the anchor: residual |x0 - a| - L along their direction
        towards = arm[:, 0] + trans - track.anchor
        distance = np.linalg.norm(towards, axis=-1)
        row = ((towards / np.maximum(distance, 1e-9)[:, None])[:, None] @ jac[:, 0])[:, 0]
        hess += anchor_w[:, None, None] * row[:, :, None] * row[:, None, :]
        grad += (anchor_w * (distance - track.length))[:, None] * row
        step = -np.linalg.solve(hess, grad[..., None])[..., 0]
        rot = _exp(step[:, :3]) @ rot
        trans = trans + step[:, 3:]
    return rot, trans


def _best_poses(shape: np.ndarray, track: _Track, between: np.ndarray, weights: list[np.ndarray], rot: np.ndarray,
                trans: np.ndarray, opts: RigidFitOptions) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Gauss-Newton from each frame's own pose and from its neighbours' (a mirrored pose fits the rays of a flat part
    about as well; time tells them apart): per frame the start that ends with the least robust cost."""
    best_rot, best_trans, best = rot, trans, np.full(len(rot), np.inf)
    for shift in (0, -1, 1):
        start = np.clip(np.arange(len(rot)) + shift, 0, len(rot) - 1)
        r, p = _poses(shape, track, between, weights, rot[start], trans[start])
        cost = _cost(_place(shape, r, p), track, between, opts)
        better = cost < best
        best_rot = np.where(better[:, None, None], r, best_rot)
        best_trans = np.where(better[:, None], p, best_trans)
        best = np.minimum(best, cost)
    return best_rot, best_trans


def _shape(shape: np.ndarray, track: _Track, ray_w: np.ndarray, depth_w: np.ndarray, rot: np.ndarray,
           trans: np.ndarray) -> np.ndarray:  # fmt: skip
    """Each point in the part's frame: least squares over the frames of its rays and depths (rotated into it), the
    way ``solve`` triangulates markers."""
    metric = _metrics(track.rays, ray_w, depth_w)
    local = np.einsum("tba,tnb->tna", rot, track.measured - trans[:, None])  # R^T (m - p)
    local_metric = np.einsum("tba,tnbc,tcd->tnad", rot, metric, rot)  # R^T M R
    a = local_metric.sum(0) + 1e-9 * np.eye(3)
    b = np.einsum("tnab,tnb->na", local_metric, local)
    solved = np.linalg.solve(a, b[..., None])[..., 0]
    enough = np.linalg.eigvalsh(a)[:, 0] > 1e-6
    return np.where(enough[:, None], solved, shape)


def _start(track: _Track) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A first shape and poses: generalised Procrustes over the trusted measured points, from the frame with most."""
    weight = track.depth_ok + 1e-3
    shape = track.measured[np.argmax(track.depth_ok.sum(1))]
    shape = shape - shape.mean(0)
    for _ in range(3):
        rot, trans = _kabsch(shape, track.measured, weight)
        local = np.einsum("tba,tnb->tna", rot, track.measured - trans[:, None])
        shape = (weight[..., None] * local).sum(0) / weight.sum(0)[:, None]
    rot, trans = _kabsch(shape, track.measured, weight)
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
    opts = options or RigidFitOptions()
    frames = len(measured)
    measured = np.where(np.isfinite(measured), measured, 0.0)
    ray_ok = ray_ok & (np.linalg.norm(measured, axis=-1) > 1e-6)
    depth_ok = depth_ok & ray_ok
    if anchor is None or anchor_ok is None:
        anchor, anchor_ok = np.zeros((frames, 3)), np.zeros(frames, bool)
    anchor_ok = anchor_ok & np.isfinite(anchor).all(1)
    min_depths = max(1, round(opts.min_depth_share * measured.shape[1]))
    usable = (ray_ok.sum(1) >= opts.min_rays) & (depth_ok.sum(1) >= min_depths)
    if usable.sum() < 3:
        return measured, np.zeros(frames, bool)
    rays = measured / np.maximum(np.linalg.norm(measured, axis=-1, keepdims=True), 1e-12)
    coverable = np.ones(measured.shape[1], bool) if coverable is None else np.asarray(coverable, bool)
    track = _Track(measured[usable], rays[usable], ray_ok[usable].astype(np.float64),
                   depth_ok[usable].astype(np.float64), coverable, np.nan_to_num(anchor[usable]),
                   anchor_ok[usable].astype(np.float64), float(length))  # fmt: skip
    shape, rot, trans = _start(track)
    between = _between(_place(shape, rot, trans))
    weights = _weights(_place(shape, rot, trans), track, between, opts)
    for _ in range(opts.rounds):
        rot, trans = _best_poses(shape, track, between, weights, rot, trans, opts)
        # the shape rests on the rays of all frames: a depth wrong in many of them (a knuckle behind the index one)
        # pulls it only weakly, while each frame's pose needs the depths to know how far away it is
        ray_w, depth_w = weights[:2]
        shape = _shape(shape, track, ray_w, depth_w * (opts.shape_depth_weight / opts.depth_weight), rot, trans)
        fitted = _place(shape, rot, trans)
        between = _between(fitted)
        weights = _weights(fitted, track, between, opts)
    rot, trans = _poses(shape, track, between, weights, rot, trans)
    fitted = _place(shape, rot, trans)
    miss, _, reach, _ = _residuals(fitted, track, between)
    holds = (miss * track.ray_ok).sum(1) / np.maximum(track.ray_ok.sum(1), 1) < opts.max_miss
    holds &= (np.abs(reach) <= opts.max_reach) | (track.anchor_ok == 0)
    out = measured.copy()
    index = np.flatnonzero(usable)[holds]
    out[index] = fitted[holds]
    good = np.zeros(frames, bool)
    good[index] = True
    return out, good
