"""OpenSim scaling and inverse kinematics on a TRC of OpenCap's video markers, through the ``opensim`` wheel.

The model, marker sets and setups are OpenCap's (``biomech/opensim/``, Apache-2.0, README there), or a user's own
model and marker set with the same marker names. ``static_window`` finds a still, standing stretch for the scaling;
``scale_model`` runs OpenSim's ScaleTool on it (marker-pair distances -> segment scales, then the marker placer
moves the model's markers onto the static pose); ``inverse_kinematics`` runs the InverseKinematicsTool over the
whole trial and reads back its angles and the marker RMS error per frame.

``opensim`` is imported only here, inside the functions; without it they raise one ImportError naming the extra.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

__all__ = [
    "IKResult",
    "MODEL_FILES",
    "NEUTRAL_PRIORS",
    "STANDING",
    "import_opensim",
    "inverse_kinematics",
    "model_file",
    "read_sto",
    "scale_model",
    "static_window",
]

MODEL_FILES = {
    "model": "LaiUhlrich2022.osim",
    "markers_mmpose": "LaiUhlrich2022_markers_mmpose.xml",
    "markers_openpose": "LaiUhlrich2022_markers_openpose.xml",
    "scale_setup": "Setup_scaling_LaiUhlrich2022_mmpose.xml",
    "ik_setup": "Setup_IK_mmpose.xml",
}
"""The packaged files (``biomech/opensim/``) by role."""

STANDING = {"seconds": 0.5, "speed": 0.15, "knee": 20.0, "trunk": 20.0}
"""A still, standing stretch: at least ``seconds`` long, the markers slower than ``speed`` m/s (their median, after
a 2 Hz low-pass that takes the lifted keypoints' jitter off), knees bent less than ``knee`` degrees and the trunk
(midHip -> Neck) within ``trunk`` degrees of vertical."""


NEUTRAL_PRIORS = {"lumbar_extension": 0.01}
"""Coordinate -> weight of a weak pull to its default value (0) in every IK solve (static pose and trial). OpenCap's
three pelvis markers lie on one line (hips and midHip), so the pelvis's tilt about it is barely seen: without this,
IK can trade tens of degrees of pelvis tilt for lumbar extension and hip flexion and keep the markers still."""


def _add_priors(osim, tasks) -> None:
    for name, weight in NEUTRAL_PRIORS.items():
        task = osim.IKCoordinateTask()
        task.setName(name)
        task.setWeight(weight)
        task.setValueType(osim.IKCoordinateTask.DefaultValue)
        tasks.cloneAndAppend(task)


def import_opensim():
    """The ``opensim`` module, its log quiet (errors only).

    Raises:
        ImportError: one line naming the extra.
    """
    try:
        import opensim
    except ImportError:
        raise ImportError("OpenSim scaling and inverse kinematics need the opensim wheel: "
                          "pip install sapiens2[biomech]") from None  # fmt: skip
    opensim.Logger.setLevelString("error")
    opensim.Logger.removeFileSink()  # no opensim.log in the working folder
    return opensim


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Send the process's stdout (file descriptor 1) to /dev/null: OpenSim's tools print a model summary there."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _run(tool, failure: str) -> bool:
    """``tool.run()`` with its stdout silenced; an OpenSim exception becomes one line (ValueError)."""
    try:
        with _quiet_stdout():
            return bool(tool.run())
    except RuntimeError as error:  # SWIG's wrapper of an OpenSim/Simbody exception: several lines
        text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        raise ValueError(f"OpenSim {failure}: {text}") from None


def model_file(role: str) -> Path:
    """The packaged file of ``role`` (``MODEL_FILES``)."""
    return Path(str(resources.files("sapiens2.biomech").joinpath("opensim", MODEL_FILES[role])))


def _angle(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))


def static_window(names: tuple[str, ...] | list[str], positions: np.ndarray, times: np.ndarray,
                  standing: dict[str, float] | None = None) -> tuple[float, float] | None:  # fmt: skip
    """(start, end) seconds of the longest still, standing stretch (``STANDING``) of lab-frame marker positions
    (T, M, 3) metres, Y up, at most 1 s from its middle; None when there is none."""
    rule = {**STANDING, **(standing or {})}
    index = {n: i for i, n in enumerate(names)}
    if len(times) < 2:
        return None
    from .gait import smooth

    fps = (len(times) - 1) / max(times[-1] - times[0], 1e-9)
    speed = np.linalg.norm(np.gradient(smooth(positions, fps, 2.0), times, axis=0), axis=-1)  # (T, M), jitter off
    with np.errstate(invalid="ignore"):
        still = np.nanmedian(speed, axis=1) < rule["speed"]
        knees = [180.0 - _angle(positions[:, index[f"{s}Hip"]] - positions[:, index[f"{s}Knee"]],
                                positions[:, index[f"{s}Ankle"]] - positions[:, index[f"{s}Knee"]])
                 for s in "RL"]  # fmt: skip
        trunk = _angle(positions[:, index["Neck"]] - positions[:, index["midHip"]], np.array([0.0, 1.0, 0.0]))
        ok = still & (knees[0] < rule["knee"]) & (knees[1] < rule["knee"]) & (trunk < rule["trunk"])
    best, start = (0, 0), None
    for t, good in enumerate([*ok.tolist(), False]):
        if good and start is None:
            start = t
        elif not good and start is not None:
            if t - start > best[1] - best[0]:
                best = (start, t)
            start = None
    first, end = best
    if end == first or times[end - 1] - times[first] < rule["seconds"] - 1e-9:
        return None
    middle = 0.5 * (times[first] + times[end - 1])
    return max(times[first], middle - 0.5), min(times[end - 1], middle + 0.5)


def scale_model(trc: str | os.PathLike, output: str | os.PathLike, window: tuple[float, float], *,
                mass: float = 75.0, height: float | None = None, model: str | os.PathLike | None = None,
                markers: str | os.PathLike | None = None, marker_set: str = "mmpose") -> Path:  # fmt: skip
    """Scale the model to the markers of ``trc`` over ``window`` (s) and place its markers: writes ``output``
    (the scaled ``.osim``) and ``<output stem>_static.mot`` (the static pose) beside it.

    Args:
        model, markers: a user's own ``.osim`` and marker set (default the packaged LaiUhlrich2022 with OpenCap's
            ``marker_set`` markers); the scaling setup's marker pairs must name markers of the set.
        mass: the subject's mass (kg), shared over the segments as in the generic model.
        height: the subject's height (m), recorded in the setup only (OpenSim does not use it).
    """
    osim = import_opensim()
    output = Path(output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    tool = osim.ScaleTool(str(model_file("scale_setup")))
    tool.setName(output.stem)
    tool.setPathToSubject("")  # the paths below are absolute, not relative to the setup's folder
    tool.setSubjectMass(mass)
    if height is not None:
        tool.setSubjectHeight(height)
    maker = tool.getGenericModelMaker()
    maker.setModelFileName(str(Path(model or model_file("model")).resolve()))
    maker.setMarkerSetFileName(str(Path(markers or model_file(f"markers_{marker_set}")).resolve()))
    span = osim.ArrayDouble()
    for value in window:
        span.append(float(value))
    scaler = tool.getModelScaler()
    scaler.setMarkerFileName(str(Path(trc).resolve()))
    scaler.setTimeRange(span)
    scaler.setOutputModelFileName(str(output))
    scaler.setOutputScaleFileName("")
    placer = tool.getMarkerPlacer()
    placer.setMarkerFileName(str(Path(trc).resolve()))
    placer.setTimeRange(span)
    placer.setOutputModelFileName(str(output))
    placer.setOutputMotionFileName(str(output.with_name(output.stem + "_static.mot")))
    placer.setMoveModelMarkers(True)
    done = _run(tool, "could not scale the model")
    if not done or not output.is_file():
        raise ValueError("OpenSim could not scale the model (its log on stderr says why)")
    return output


def read_sto(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """An OpenSim ``.mot`` / ``.sto`` table (header up to ``endheader``, then a tab-separated table with a
    ``time`` column) as column -> (T,) float64."""
    lines = Path(path).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().lower() == "endheader") + 1
    header = lines[start].split("\t")
    values = np.array([[float(v) for v in line.split("\t")] for line in lines[start + 1 :] if line.strip()], np.float64)
    values = values.reshape(-1, len(header))
    return {name.strip(): values[:, i] for i, name in enumerate(header)}


@dataclass
class IKResult:
    """Inverse kinematics of a trial: the ``.mot`` file, its coordinates (name -> (T,) degrees for rotations,
    metres for translations, as OpenSim writes them), ``times`` (T,) s and the marker RMS and max errors per
    frame (m)."""

    motion_file: Path
    times: np.ndarray
    coordinates: dict[str, np.ndarray]
    marker_rms: np.ndarray
    marker_max: np.ndarray
    errors_file: Path


def inverse_kinematics(trc: str | os.PathLike, scaled_model: str | os.PathLike, output: str | os.PathLike,
                       time_range: tuple[float, float] | None = None) -> IKResult:  # fmt: skip
    """Run OpenSim's InverseKinematicsTool (OpenCap's marker weights) over ``trc`` with ``scaled_model``: writes
    ``output`` (the ``.mot``) and ``<output stem>_marker_errors.sto`` beside it."""
    osim = import_opensim()
    output = Path(output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    tool = osim.InverseKinematicsTool(str(model_file("ik_setup")))
    tool.setName(output.stem)
    model = osim.Model(str(Path(scaled_model).resolve()))
    model.initSystem()
    tool.setModel(model)
    _add_priors(osim, tool.getIKTaskSet())
    tool.setMarkerDataFileName(str(Path(trc).resolve()))
    tool.setOutputMotionFileName(str(output))
    tool.setResultsDir(str(output.parent))
    tool.set_report_errors(True)
    if time_range is None:
        data = osim.MarkerData(str(Path(trc).resolve()))
        time_range = (data.getStartFrameTime(), data.getLastFrameTime())
    tool.setStartTime(float(time_range[0]))
    tool.setEndTime(float(time_range[1]))
    done = _run(tool, "inverse kinematics failed")
    if not done or not output.is_file():
        raise ValueError("OpenSim inverse kinematics failed (its log on stderr says why)")
    written = output.parent / f"{output.stem}_ik_marker_errors.sto"
    errors_file = output.with_name(output.stem + "_marker_errors.sto")
    os.replace(written, errors_file)
    table, errors = read_sto(output), read_sto(errors_file)
    coordinates = {k: v for k, v in table.items() if k != "time"}
    return IKResult(output, table["time"], coordinates, errors["marker_error_RMS"], errors["marker_error_max"],
                    errors_file)  # fmt: skip
