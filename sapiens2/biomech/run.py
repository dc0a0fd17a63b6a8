"""Biomechanics of each tracked person of a mocap run: ``run_biomech("out/clip_mocap", "out/")``.

Per track (``analyse_track``), from the solved trajectories (``track_<id>_points.csv`` or ``.parquet``):

1. OpenCap's video markers in OpenSim's lab frame (``mocap.trc``) -> ``markers.trc``;
2. OpenSim (``biomech.osim``, the ``[biomech]`` extra): the static trial (a still, standing stretch, or
   ``BiomechOptions.static``), the scaled model, inverse kinematics (``ik.mot``) and the marker RMS error per frame;
3. gait (``biomech.gait``): events, parameters, joint-angle curves over the gait cycle (from the IK angles; from the
   markers' own angles without OpenSim), when the person walks;
4. ergonomics (``biomech.ergonomics``): RULA and REBA per frame and the time at each action level;
5. the report (``biomech.report``): HTML and PDF with the table, the curves, the timeline and frames at events.

Layout for ``out/clip``::

    clip_biomech/track_<id>/markers.trc                 OpenCap marker set, lab frame (Y up), mm
    clip_biomech/track_<id>/scaled.osim, scaled_static.mot   the scaled model and its static pose
    clip_biomech/track_<id>/ik.mot, ik_marker_errors.sto     IK angles (degrees) and marker errors (m)
    clip_biomech/track_<id>/gait.json, gait_curves.csv        gait events, parameters, cycle curves
    clip_biomech/track_<id>/ergonomics.csv                    RULA and REBA per frame
    clip_biomech/track_<id>/report.html, report.pdf           the report, with its pictures beside it
    clip_biomech.json                                         the summary, written last
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data.io import atomic_write
from ..messages import report_warning
from .ergonomics import WorkConditions

__all__ = ["BiomechOptions", "BiomechReport", "analyse_track", "find_tracks", "run_biomech"]

MIN_FRAMES = 3
"""A track needs this many frames: velocities, events and a static stretch all need more than a photo."""
IK_ANGLES = ("pelvis_tilt", "pelvis_list", "pelvis_rotation", "hip_flexion_r", "hip_flexion_l", "hip_adduction_r",
             "hip_adduction_l", "knee_angle_r", "knee_angle_l", "ankle_angle_r", "ankle_angle_l", "lumbar_extension",
             "lumbar_bending", "lumbar_rotation", "arm_flex_r", "arm_flex_l", "arm_add_r", "arm_add_l",
             "elbow_flex_r", "elbow_flex_l")  # fmt: skip
"""The IK coordinates the report and the gait curves show (degrees)."""


@dataclass(frozen=True, kw_only=True)
class BiomechOptions:
    """How ``run_biomech`` analyses each track; the ``sapiens2 biomech`` flag is in brackets.

    Args:
        marker_set: OpenCap's ``mmpose`` or ``openpose`` markers in the TRC [``--marker-set``].
        static: (start, end) seconds of the static trial for the scaling; None finds a still, standing stretch
            [``--static START END``].
        mass: the subject's mass, kg [``--mass``]; height: their height, m, recorded only [``--height``].
        model, markers: a user's own OpenSim model and marker set (the same marker names) [``--model-file``,
            ``--marker-file``].
        opensim: scale and run IK (needs the ``[biomech]`` extra) [off: ``--no-opensim``].
        conditions: what the ergonomic scores need beyond posture [``--load-kg``, ``--repeated``, ``--coupling``,
            ``--seated``, ``--arm-supported``].
        report: write the HTML and PDF report [off: ``--no-report``].
    """

    marker_set: str = "mmpose"
    static: tuple[float, float] | None = None
    mass: float = 75.0
    height: float | None = None
    model: str | os.PathLike | None = None
    markers: str | os.PathLike | None = None
    opensim: bool = True
    conditions: WorkConditions = field(default_factory=WorkConditions)
    report: bool = True

    def __post_init__(self) -> None:
        from ..mocap.trc import MARKER_SETS

        if self.marker_set not in MARKER_SETS:
            raise ValueError(f"marker_set must be one of {', '.join(MARKER_SETS)}, got {self.marker_set!r}")
        if self.static is not None and not (0 <= self.static[0] < self.static[1]):
            raise ValueError(f"static must be START END seconds with 0 <= START < END, got {self.static}")
        if not self.mass > 0:
            raise ValueError(f"mass must be > 0 kg, got {self.mass}")
        if self.model is not None and self.markers is None:
            raise ValueError("model needs its marker set (an OpenSim MarkerSet .xml with OpenCap's marker names)")
        if self.markers is not None and self.model is None:
            raise ValueError("markers need the model they belong to (an .osim file)")


@dataclass
class BiomechReport:
    """What one source's run did: the tracks analysed (id -> summary), the tracks left out (id -> why), the error."""

    source: str
    tracks: dict[int, dict] = field(default_factory=dict)
    left_out: dict[int, str] = field(default_factory=dict)
    skipped: bool = False
    error: str | None = None

    def summary(self) -> str:
        left_out = f" ({len(self.left_out)} left out)" if self.left_out else ""
        return f"{self.source}: {len(self.tracks)} tracks analysed{left_out}"


def find_tracks(source: str | os.PathLike) -> tuple[dict[int, Path], Path | None]:
    """(track id -> points file, the mocap summary or None) of a mocap output: its folder (``clip_mocap/``), its
    summary (``clip_mocap.json``) or one ``track_<id>_points.csv`` / ``.parquet``.

    Raises:
        ValueError: nothing there is a mocap output with trajectories (its remedy in the message).
    """
    path = Path(source)
    pattern = re.compile(r"track_(\d+)_points\.(csv|parquet)$")
    if path.is_file() and pattern.search(path.name):
        return {int(pattern.search(path.name).group(1)): path}, None
    if path.is_file() and path.name.endswith("_mocap.json"):
        path = path.with_name(path.name[: -len(".json")])
    if not path.is_dir():
        raise ValueError(f"{source}: not a mocap output (a clip_mocap folder, its clip_mocap.json or a "
                         "track_<id>_points.csv)")  # fmt: skip
    found: dict[int, Path] = {}
    for file in sorted(path.iterdir()):
        match = pattern.search(file.name)
        if match and (int(match.group(1)) not in found or match.group(2) == "csv"):
            found[int(match.group(1))] = file
    summary = path.with_name(path.name + ".json")
    if not found:
        raise ValueError(f"{source}: no person's trajectories here (no track_<id>_points.csv: the video showed "
                         "nobody, or mocap ran without --formats csv)")  # fmt: skip
    return found, summary if summary.is_file() else None


def _write_table(path: Path, columns: Mapping[str, np.ndarray], digits: int = 4) -> Path:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    for row in zip(*(np.asarray(v).tolist() for v in columns.values()), strict=True):
        writer.writerow(["" if isinstance(v, float) and not math.isfinite(v) else
                         (round(v, digits) if isinstance(v, float) else v) for v in row])  # fmt: skip
    return atomic_write(path, text.getvalue().encode())


def _finite(value: Any) -> Any:
    """JSON-safe: NaN and inf become None, arrays lists."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_finite(v) for v in np.asarray(value).tolist()] if isinstance(value, np.ndarray) else [
            _finite(v) for v in value]  # fmt: skip
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def analyse_track(table: Mapping[str, np.ndarray], folder: str | os.PathLike, options: BiomechOptions | None = None,
                  *, video: str | None = None, source_frames: list[int] | None = None) -> dict:  # fmt: skip
    """Analyse one track's trajectory table (``mocap.tables.trajectory_table`` columns) into ``folder`` (the
    module docstring's layout); returns its summary (files, static window, gait parameters, time at each
    ergonomic action level). ``video`` and ``source_frames`` (the video frame of each of the track's rows) let the
    report show the frames at gait events.

    Raises:
        ValueError: the track cannot be analysed (too few frames, no standing still for the scaling, ...): one line.
        ImportError: OpenSim is wanted but not installed (the line names the extra).
    """
    from ..mocap.trc import MARKER_SETS, lab_frame, marker_tracks, to_lab, write_trc
    from . import ergonomics as ergo

    options = options or BiomechOptions()
    folder = Path(folder)
    times = np.asarray(table["time"], np.float64)
    valid = np.asarray(table.get("valid", np.ones(len(times))), bool)
    if len(times) < MIN_FRAMES or valid.sum() < MIN_FRAMES:
        raise ValueError(f"the person is seen on {int(valid.sum())} frame(s): biomechanics needs a video of at least "
                         f"{MIN_FRAMES} frames")  # fmt: skip
    names = tuple(dict.fromkeys(MARKER_SETS["openpose"] + ergo.ERGONOMIC_POINTS))
    camera = marker_tracks(table, names)
    frame = lab_frame(camera)
    lab = {name: to_lab(track, frame) for name, track in camera.items()}
    summary: dict[str, Any] = {"frames": len(times), "seconds": float(times[-1] - times[0]), "files": []}
    trc = write_trc(table, folder / "markers.trc", options.marker_set, frame)
    summary["files"].append(trc.name)
    curves: dict[str, np.ndarray] = {}
    if options.opensim:
        from .osim import import_opensim, inverse_kinematics, scale_model, static_window

        import_opensim()  # the missing extra is one line before anything runs
        set_names = MARKER_SETS[options.marker_set]
        window = options.static or static_window(set_names, np.stack([lab[n] for n in set_names], 1), times)
        if window is None:
            raise ValueError("the person never stands still (no still, standing stretch of 0.5 s for the scaling): "
                             "give the static trial's seconds with --static START END")  # fmt: skip
        scaled = scale_model(trc, folder / "scaled.osim", window, mass=options.mass, height=options.height,
                             model=options.model, markers=options.markers, marker_set=options.marker_set)  # fmt: skip
        ik = inverse_kinematics(trc, scaled, folder / "ik.mot")
        summary["static"] = [float(window[0]), float(window[1])]
        rms = 1000 * ik.marker_rms
        summary["marker_rms_mm"] = {"mean": float(rms.mean()), "max": float(rms.max())}
        summary["files"] += [scaled.name, scaled.stem + "_static.mot", ik.motion_file.name, ik.errors_file.name]
        ik_curves = {name: np.interp(times, ik.times, ik.coordinates[name]) for name in IK_ANGLES
                     if name in ik.coordinates}  # fmt: skip
        curves |= ik_curves
        curves["marker_rms_mm"] = 1000 * np.interp(times, ik.times, ik.marker_rms)
    angles = ergo.posture_angles(lab)
    rula, reba = ergo.rula_scores(angles, options.conditions), ergo.reba_scores(angles, options.conditions)
    ergonomics = {"time": times, **{f"rula_{k}": v for k, v in rula.items()},
                  **{f"reba_{k}": v for k, v in reba.items()}, **angles}  # fmt: skip
    _write_table(folder / "ergonomics.csv", ergonomics)
    summary["files"].append("ergonomics.csv")
    summary["ergonomics"] = {
        "rula_seconds_per_level": {ergo.RULA_LEVELS[k]: v for k, v in
                                   ergo.action_level_time(rula["level"], times, tuple(ergo.RULA_LEVELS)).items()},
        "reba_seconds_per_level": {ergo.REBA_LEVELS[k]: v for k, v in
                                   ergo.action_level_time(reba["level"], times, tuple(ergo.REBA_LEVELS)).items()},
        "rula_max": int(rula["score"].max()), "reba_max": int(reba["score"].max()),
    }  # fmt: skip
    gait = _gait(lab, times, curves, angles, folder, summary)
    if options.report:
        from .report import write_report

        summary["files"] += [p.name for p in write_report(folder, summary, times, curves, angles, rula, reba, gait,
                                                          video=video, source_frames=source_frames)]  # fmt: skip
    return summary


def _gait(lab: Mapping[str, np.ndarray], times: np.ndarray, curves: dict[str, np.ndarray], angles: dict,
          folder: Path, summary: dict) -> Any:  # fmt: skip
    """Gait events, parameters and cycle curves into ``gait.json`` / ``gait_curves.csv``; None when the person
    does not walk (noted in the summary)."""
    from .gait import cycle_curves, gait_events, gait_parameters

    try:
        events = gait_events(lab, times)
    except ValueError as error:
        summary["gait"] = {"note": str(error)}
        return None
    parameters = gait_parameters(events)
    if not curves:  # no OpenSim: the knees from the markers
        curves["knee_angle_r"], curves["knee_angle_l"] = angles["right_knee_flexion"], angles["left_knee_flexion"]
    table: dict[str, np.ndarray] = {"percent": np.arange(101.0)}
    for side, s in (("left", "_l"), ("right", "_r")):
        own = {n: v for n, v in curves.items() if n.endswith(s)}
        for name, (mean, sd, count) in cycle_curves(events, own, side).items():
            table[f"{name}_mean"], table[f"{name}_sd"] = mean, sd
            table[f"{name}_cycles"] = np.full(101, count)
    gait = {"heel_strike": {k: events.time(v).tolist() for k, v in events.heel_strike.items()},
            "toe_off": {k: events.time(v).tolist() for k, v in events.toe_off.items()},
            "heel_strike_frames": {k: v.tolist() for k, v in events.heel_strike.items()},
            "toe_off_frames": {k: v.tolist() for k, v in events.toe_off.items()},
            "parameters": parameters}  # fmt: skip
    atomic_write(folder / "gait.json", json.dumps(_finite(gait), indent=1).encode())
    _write_table(folder / "gait_curves.csv", table)
    summary["files"] += ["gait.json", "gait_curves.csv"]
    summary["gait"] = _finite(parameters)
    return events, parameters, table


def _track_frames(summary: Path | None, track: int) -> tuple[str | None, list[int] | None]:
    """(the source video, the video frame of each row of the track) from a mocap summary and its frame records: the
    track's rows are the recorded frames from its first to its last (``mocap.run.read_tracks``)."""
    if summary is None:
        return None, None
    try:
        info = json.loads(summary.read_text())
        records = summary.with_name(summary.name.replace("_mocap.json", "_frames.jsonl"))
        frames, seen = [], []
        with open(records) as lines:
            for line in lines:
                record = json.loads(line)
                frames.append(int(record["frame"]))
                if any(p.get("track_id") == track for p in record.get("mocap", ())):
                    seen.append(frames[-1])
        rows = sorted(f for f in frames if seen and seen[0] <= f <= seen[-1])
        return str(info.get("source")), rows or None
    except (OSError, ValueError, KeyError):
        return None, None


def run_biomech(source: str | os.PathLike, output: str | os.PathLike | None = None,
                options: BiomechOptions | None = None) -> BiomechReport:  # fmt: skip
    """Analyse every track of a mocap output (``find_tracks``: its folder, summary or one points file) into
    ``output`` (default beside it): ``<clip>_biomech/track_<id>/`` per track and ``<clip>_biomech.json``.

    Example:
        >>> report = run_biomech("out/clip_mocap", "out/")
        >>> report.tracks[1]["gait"]["cadence"]
    """
    from ..mocap.trc import read_trajectories

    options = options or BiomechOptions()
    report = BiomechReport(str(source))
    tracks, mocap_summary = find_tracks(source)
    path = Path(source)
    stem = path.parent.name if path.is_file() and mocap_summary is None else path.name
    stem = re.sub(r"(_mocap)(\.json)?$", "", stem)
    out = Path(output) if output is not None else (path.parent if path.is_dir() else path.parent.parent)
    folder = out / f"{stem}_biomech"
    for track, points in tracks.items():
        try:
            table = read_trajectories(points)
            video, rows = _track_frames(mocap_summary, track)
            report.tracks[track] = analyse_track(table, folder / f"track_{track}", options, video=video,
                                                 source_frames=rows)  # fmt: skip
        except ValueError as error:
            report.left_out[track] = f"track {track}: {error}"
    if not report.tracks:  # why, on the error line
        report.error = f"{source}: " + ("; ".join(report.left_out.values()) or "no track")
    else:  # the others analysed: a warning line each
        for why in report.left_out.values():
            report_warning(f"{source}: {why}")
    text = json.dumps(_finite({"source": str(source), "tracks": {str(k): v for k, v in report.tracks.items()},
                               "left_out": {str(k): v for k, v in report.left_out.items()}}), indent=1)  # fmt: skip
    atomic_write(out / f"{stem}_biomech.json", text.encode())
    return report
