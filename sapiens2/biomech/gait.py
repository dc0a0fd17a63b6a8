"""Gait from lab-frame marker trajectories: events per foot, spatio-temporal parameters, cycle-normalised curves.

Events are found by the coordinate method of Zeni et al. (2008), which needs no force plate and no foot contact
with a known floor: along the walking direction (the pelvis's horizontal velocity), heel strike is when the heel is
farthest in front of the pelvis (midHip), toe off when the toes are farthest behind it. Each extremum is refined
to a fraction of a frame by the parabola through it and its neighbours.

Parameters (``gait_parameters``): cadence (steps/min), stride and step time (s) and length (m), walking speed
(m/s), stance and swing (% of the stride), double support (% of the stride: heel strike to the other foot's toe
off, twice per stride), step width (m: the heels' distance across the walking direction at successive heel
strikes), and the symmetry index of each left/right pair, ``100 |L - R| / ((L + R) / 2)`` (0 is symmetric;
Robinson et al. 1987).

Axes: OpenSim's lab frame (``mocap.trc``): Y up, metres, seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["GaitEvents", "cycle_curves", "gait_events", "gait_parameters", "smooth"]

SIDES = (("left", "L"), ("right", "R"))
MIN_SPEED = 0.15
"""m/s: events count only while the pelvis moves this fast and at least half its median speed while moving (2 Hz
low-pass): standing still makes none, nor do the first and last steps of starting and stopping."""
_UP = np.array([0.0, 1.0, 0.0])


def smooth(values: np.ndarray, fps: float, cutoff: float = 6.0) -> np.ndarray:
    """Zero-lag Gaussian low-pass along axis 0 (about ``cutoff`` Hz at half power); NaNs are interpolated first."""
    values = np.asarray(values, np.float64)
    flat = values.reshape(len(values), -1).copy()
    index = np.arange(len(values))
    for column in flat.T:
        good = np.isfinite(column)
        if good.any() and not good.all():
            column[~good] = np.interp(index[~good], index[good], column[good])
    sigma = 0.1325 * fps / cutoff  # a Gaussian's half-power frequency is 0.1325 / sigma (cycles per sample)
    radius = int(np.ceil(3 * sigma))
    if radius < 1 or len(values) < 3:
        return flat.reshape(values.shape)
    kernel = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    kernel /= kernel.sum()
    # odd reflection at the ends (2 x[0] - x[k]): keeps the slope, so the ends make no extremum of their own
    padded = np.pad(flat, ((radius, radius), (0, 0)), mode="reflect", reflect_type="odd") if len(values) > radius \
        else np.pad(flat, ((radius, radius), (0, 0)), mode="edge")  # fmt: skip
    out = np.stack([np.convolve(padded[:, i], kernel, mode="valid") for i in range(flat.shape[1])], 1)
    return out.reshape(values.shape)


def _heading(pelvis: np.ndarray, times: np.ndarray, fps: float) -> np.ndarray:
    """(T, 3) unit horizontal walking direction from the smoothed pelvis velocity (the mean one where it stalls)."""
    velocity = np.gradient(smooth(pelvis, fps, 1.0), times, axis=0)
    velocity -= np.outer(velocity @ _UP, _UP)
    mean = velocity.mean(0)
    speed = np.linalg.norm(velocity, axis=1, keepdims=True)
    direction = np.where(speed > 0.1, velocity / np.maximum(speed, 1e-9), mean / max(np.linalg.norm(mean), 1e-9))
    return direction / np.maximum(np.linalg.norm(direction, axis=1, keepdims=True), 1e-9)


def _peaks(signal: np.ndarray, fps: float, min_gap: float = 0.35) -> np.ndarray:
    """Sub-frame indices of the interior maxima of ``signal`` that stand out (above the middle of its range) and
    lie ``min_gap`` s apart (the higher kept)."""
    low, high = np.percentile(signal, [5, 95])
    middle = 0.5 * (low + high)
    i = np.arange(1, len(signal) - 1)
    found = i[(signal[i] >= signal[i - 1]) & (signal[i] > signal[i + 1]) & (signal[i] > middle)]
    kept: list[int] = []
    for k in sorted(found.tolist(), key=lambda k: -signal[k]):
        if all(abs(k - other) >= min_gap * fps for other in kept):
            kept.append(k)
    kept.sort()
    out = []
    for k in kept:  # the vertex of the parabola through k-1, k, k+1
        a, b, c = signal[k - 1], signal[k], signal[k + 1]
        bend = a - 2 * b + c
        out.append(k + (0.5 * (a - c) / bend if bend < 0 else 0.0))
    return np.array(out, np.float64)


@dataclass
class GaitEvents:
    """Heel strikes and toe offs per side (``left``/``right``) in sub-frame indices of the trial, with ``times``
    (T,) s, ``heading`` (T, 3) walking direction and the marker tracks they came from."""

    times: np.ndarray
    heel_strike: dict[str, np.ndarray]
    toe_off: dict[str, np.ndarray]
    heading: np.ndarray
    tracks: Mapping[str, np.ndarray] = field(repr=False)

    def time(self, index: np.ndarray | float) -> np.ndarray:
        """Seconds of sub-frame indices."""
        return np.interp(index, np.arange(len(self.times)), self.times)

    def at(self, name: str, index: float) -> np.ndarray:
        """(3,) position of marker ``name`` at a sub-frame index (linear between frames)."""
        track = self.tracks[name]
        k = int(np.clip(np.floor(index), 0, len(track) - 2))
        w = index - k
        return (1 - w) * track[k] + w * track[k + 1]


def gait_events(tracks: Mapping[str, np.ndarray], times: np.ndarray) -> GaitEvents:
    """Heel strikes and toe offs of both feet (Zeni et al. 2008) from lab-frame marker tracks (name -> (T, 3):
    ``midHip`` or the hips, the heels, and the small toes and/or big toes).

    Raises:
        ValueError: fewer than 3 frames, or the person does not walk (the pelvis moves less than 0.3 m).
    """
    times = np.asarray(times, np.float64)
    if len(times) < 3:
        raise ValueError(f"gait needs a walk of several frames, got {len(times)}")
    fps = (len(times) - 1) / (times[-1] - times[0])
    pelvis = tracks["midHip"] if "midHip" in tracks else 0.5 * (tracks["RHip"] + tracks["LHip"])
    pelvis = smooth(pelvis, fps)
    flat = pelvis - np.outer(pelvis @ _UP, _UP)
    if np.nanmax(np.linalg.norm(flat - flat[0], axis=1)) < 0.3:
        raise ValueError("the person does not walk (the pelvis moves less than 0.3 m): no gait events")
    heading = _heading(pelvis, times, fps)
    speed = np.linalg.norm(np.gradient(smooth(flat, fps, 2.0), times, axis=0), axis=1)
    moving = speed > MIN_SPEED
    walking = speed > max(MIN_SPEED, 0.5 * float(np.median(speed[moving]))) if moving.any() else moving

    def during_walk(found: np.ndarray) -> np.ndarray:
        return found[walking[np.clip(np.round(found).astype(int), 0, len(times) - 1)]]

    strikes, offs = {}, {}
    for side, s in SIDES:
        heel = smooth(tracks[f"{s}Heel"], fps)
        toes = [tracks[n] for n in (f"{s}BigToe", f"{s}SmallToe") if n in tracks]
        toe = smooth(np.mean(toes, axis=0), fps)
        strikes[side] = during_walk(_peaks(((heel - pelvis) * heading).sum(1), fps))
        offs[side] = during_walk(_peaks(-((toe - pelvis) * heading).sum(1), fps))
    return GaitEvents(times, strikes, offs, heading, tracks)


def _symmetry(left: float, right: float) -> float:
    return float(100.0 * abs(left - right) / (0.5 * (left + right))) if left + right else float("nan")


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def gait_parameters(events: GaitEvents) -> dict[str, float]:
    """The spatio-temporal parameters (see the module docstring) as name -> value; per-side ones as
    ``<name>_left`` / ``_right``; NaN where the walk has too few events (a stride needs two heel strikes of a foot).
    """
    strikes = sorted((float(k), side) for side, ks in events.heel_strike.items() for k in ks)
    heel = {"left": "LHeel", "right": "RHeel"}
    out: dict[str, float] = {}
    per: dict[str, dict[str, list[float]]] = {side: {} for side, _ in SIDES}

    def add(side: str, name: str, value: float) -> None:
        per[side].setdefault(name, []).append(value)

    for (k0, side0), (k1, side1) in zip(strikes[:-1], strikes[1:], strict=True):
        if side0 == side1:  # a missed event between: no step here
            continue
        step = events.at(heel[side1], k1) - events.at(heel[side0], k0)
        direction = events.heading[int(round(k1))]
        lateral = np.cross(direction, _UP)
        add(side1, "step_time", float(events.time(k1) - events.time(k0)))
        add(side1, "step_length", float(step @ direction))
        add(side1, "step_width", float(abs(step @ lateral)))
    for side, _ in SIDES:
        other = "right" if side == "left" else "left"
        ks = events.heel_strike[side]
        for k0, k1 in zip(ks[:-1], ks[1:], strict=True):
            t0, t1 = events.time(k0), events.time(k1)
            stride = float(t1 - t0)
            move = events.at(heel[side], k1) - events.at(heel[side], k0)
            add(side, "stride_time", stride)
            add(side, "stride_length", float(np.linalg.norm(move - (move @ _UP) * _UP)))
            own_off = [k for k in events.toe_off[side] if k0 < k < k1]
            other_off = [k for k in events.toe_off[other] if k0 < k < k1]
            other_on = [k for k in events.heel_strike[other] if k0 < k < k1]
            if own_off:
                stance = float(events.time(own_off[0]) - t0) / stride
                add(side, "stance", 100.0 * stance)
                add(side, "swing", 100.0 * (1.0 - stance))
                if other_off and other_on and other_off[0] < other_on[0] < own_off[0]:
                    double = (events.time(other_off[0]) - t0) + (events.time(own_off[0]) - events.time(other_on[0]))
                    add(side, "double_support", 100.0 * float(double) / stride)
    names = ("stride_time", "stride_length", "step_time", "step_length", "step_width", "stance", "swing",
             "double_support")  # fmt: skip
    for name in names:
        both = per["left"].get(name, []) + per["right"].get(name, [])
        out[name] = _mean(both)
        for side, _ in SIDES:
            out[f"{name}_{side}"] = _mean(per[side].get(name, []))
    out["cadence"] = 60.0 / out["step_time"] if out["step_time"] > 0 else float("nan")
    out["speed"] = out["stride_length"] / out["stride_time"] if out["stride_time"] > 0 else float("nan")
    for name in ("step_time", "step_length", "stance", "swing"):
        out[f"{name}_symmetry"] = _symmetry(out[f"{name}_left"], out[f"{name}_right"])
    out["strides"] = float(sum(len(per[side].get("stride_time", [])) for side, _ in SIDES))
    return out


def cycle_curves(events: GaitEvents, curves: Mapping[str, np.ndarray], side: str, points: int = 101
                 ) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:  # fmt: skip
    """Each curve (name -> (T,) values on the trial's frames) over ``side``'s gait cycles (heel strike to heel
    strike) resampled to ``points`` samples from 0 to 100 %: name -> (mean, sd, number of cycles)."""
    ks = events.heel_strike[side]
    grid = np.linspace(0.0, 1.0, points)
    frames = np.arange(len(events.times))
    out = {}
    for name, values in curves.items():
        cycles = [np.interp(k0 + grid * (k1 - k0), frames, values) for k0, k1 in zip(ks[:-1], ks[1:], strict=True)]
        if cycles:
            stack = np.stack(cycles)
            out[name] = (stack.mean(0), stack.std(0), len(cycles))
    return out
