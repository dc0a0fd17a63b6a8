"""Motion capture from a video: ``run_mocap(predictors, "clip.mp4", "out/")``; ``run_mocap_inputs`` for the CLI.

The video pipeline (``sapiens2.video.predict_video``) runs pose and pointmap (and seg, when given) with its
decoding, tracking, ``detect_every``, chunked resume and overlay; this module adds one per-frame hook to it
(``MocapHook``, a ``video.run.FrameHook``): each tracked person's 308 keypoints are lifted to metres in the camera
frame (``mocap.lift.lift_frame``) and written into the frame's record in ``clip_frames.jsonl`` (so they are
chunked, sealed and resumed with the frame), and a 3D view of the people (``mocap.view``) joins the overlay. When the
video is complete, each track's lifted keypoints are read back from ``clip_frames.jsonl``, solved on the skeleton
(``mocap.solve``: bone lengths, 3D smoothing, gap filling, rotations) and exported (BVH, glTF, FBX, C3D, USD,
CSV/Parquet, joint angles) from the solved ``rig.Motion`` alone. Exports are a function of the sealed records only,
so a run killed with SIGKILL and resumed writes the same files, byte for byte, as one that was never stopped.

Layout for ``out/clip`` (``docs/mocap.md``)::

    clip_overlay.mp4, clip_frames.jsonl, clip_video.json       the video pipeline's outputs (records with "mocap")
    clip_mocap/track_<id>.bvh .glb .fbx .c3d .usdc .trc         per track: animation and markers
    clip_mocap/scene.fbx .usdc .glb                             with ``scene``: every track in one file each
    clip_mocap/track_<id>_points.csv .parquet                   per track: the solved 308 keypoints per frame
    clip_mocap/track_<id>_contacts.csv .parquet                 per track: foot contacts per frame (mocap.contacts)
    clip_mocap/track_<id>_angles.csv .png                       per track: joint angles and their plot
    clip_mocap/track_<id>.trc                                   per track: OpenSim markers (OpenCap's mmpose set)
    clip_mocap/camera.csv                                       a moving camera's path in the world (mocap.world)
    clip_mocap.json                                             the summary, written last (the run is complete)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data.io import atomic_write
from ..messages import report_error
from ..metadata import keypoint_metadata

__all__ = [
    "EXPORT_FORMATS",
    "RIG_FORMATS",
    "SCENE_FORMATS",
    "MocapHook",
    "MocapOptions",
    "MocapReport",
    "SCENE_FORMATS",
    "RecordedTrack",
    "clip_intrinsics",
    "export_scene",
    "read_tracks",
    "record_lifted",
    "run_mocap",
    "run_mocap_inputs",
    "solve_and_export",
]

EXPORT_FORMATS = ("bvh", "glb", "fbx", "c3d", "usd", "csv", "parquet", "angles", "trc")
"""What ``MocapOptions.formats`` may name: BVH, glTF binary, binary FBX, C3D markers, USD (UsdSkel, ``.usdc``), the
solved keypoints as CSV and Parquet, the joint angles (CSV and a plot), and OpenSim markers (TRC in OpenCap's mmpose
set, ``mocap.trc``)."""
RIG_FORMATS = ("bvh", "glb", "fbx", "usd")
"""The animation exports, written on ``MocapOptions.rig``; the others (markers, tables, angles) keep our skeleton."""
SCENE_FORMATS = ("fbx", "usd", "glb")
"""The formats that hold several tracks in one file: with ``MocapOptions.scene`` each writes ``scene.<format>``."""

logger = logging.getLogger(__name__)

MOCAP_TASKS = ("pose", "pointmap")  # always; "seg" as well when it helps occlusion (MocapOptions.seg)
DIGITS = 4  # metres in the records: 0.1 mm
FLAGS = "-vof"  # the record letters of flag codes 0 (not seen), 1 visible, 2 occluded, 3 filled (low score, off)


@dataclass(frozen=True, kw_only=True)
class MocapOptions:
    """How ``run_mocap`` captures motion; the ``sapiens2 mocap`` flag is in brackets.

    Args:
        video: how the video is read, tracked and written (``VideoOptions``: ``--start``, ``--end``, ``--stride``,
            ``--detect-every``, ``--fps``). Its 2D smoothing is off by default: the motion is smoothed in 3D.
        smooth: 3D smoothing of each track: ``auto`` (offline for files and sequences, online for cameras and URLs),
            ``none``, ``online`` (One-Euro in 3D, bone lengths learned as frames come: what live input shows) or
            ``offline`` (zero-lag, bone lengths robust over the clip) [``--smooth``].
        seg: use the seg task's body parts to detect occluded keypoints (needs a seg Predictor) [off: ``--no-seg``].
        formats: the exports per track, from ``EXPORT_FORMATS`` [``--formats bvh,glb``].
        view: draw the 3D view beside the frame in the overlay [off: ``--no-view``].
        min_frames: tracks seen on fewer frames are left out of the exports (listed in the summary); a source with
            fewer frames (a photo) exports every track [``--min-track-frames``].
        skip_existing: skip a source whose mocap summary exists [``--skip-existing``].
        scene: the formats of ``SCENE_FORMATS`` write every track of a source into one file, ``scene.<format>``,
            each at its time in the video, instead of a file per track [``--scene``].
        rig: the skeleton of the animation exports (``RIG_FORMATS``): ``sapiens2`` (ours) or a standard rig of
            ``rigs.RIGS`` the solved motion is retargeted onto [``--rig``].
        rig_proportions: a rig's bone lengths: ``track`` (the track's own: the rig's joints land on the solved
            ones) or ``rig`` (its table's, the root translation scaled by the leg-length ratio)
            [``--rig-proportions``].
        plant_feet: offline, keep a foot detected planted in place (``mocap.contacts``); the contacts are
            detected and exported either way [on: ``--no-plant-feet`` turns it off].
        camera: ``static`` (the exports in the camera's frame), ``moving`` (the camera's path estimated from the
            background, the exports in a world frame with gravity: ``mocap.world``) or ``auto`` (moving when the
            background moves) [``--camera``].
    """

    video: Any = None
    smooth: str = "auto"
    seg: bool = True
    formats: Sequence[str] = EXPORT_FORMATS
    view: bool = True
    min_frames: int = 5
    skip_existing: bool = False
    scene: bool = False
    rig: str = "sapiens2"
    rig_proportions: str = "track"
    plant_feet: bool = True
    camera: str = "auto"

    def __post_init__(self) -> None:
        from ..video.run import VideoOptions
        from ..video.smooth import SMOOTH_MODES

        video = self.video if self.video is not None else VideoOptions(smooth="none", save_dense=False)
        object.__setattr__(self, "video", video)
        formats = (self.formats,) if isinstance(self.formats, str) else tuple(self.formats)
        object.__setattr__(self, "formats", formats)
        unknown = [f for f in formats if f not in EXPORT_FORMATS]
        if unknown:
            raise ValueError(f"formats: unknown {', '.join(unknown)} (choose from {', '.join(EXPORT_FORMATS)})")
        if self.scene and not set(formats) & set(SCENE_FORMATS):
            raise ValueError(f"scene needs a format that holds several tracks ({', '.join(SCENE_FORMATS)}) in formats")
        if self.smooth not in ("auto", *SMOOTH_MODES):
            raise ValueError(f"smooth must be auto, none, online or offline, got {self.smooth!r}")
        if self.min_frames < 1:
            raise ValueError(f"min_frames must be >= 1, got {self.min_frames}")
        from .rigs import PROPORTIONS, RIG_NAMES

        if self.rig not in RIG_NAMES:
            raise ValueError(f"rig: unknown {self.rig!r} (choose from {', '.join(RIG_NAMES)})")
        from .world import CAMERA_MODES

        if self.camera not in CAMERA_MODES:
            raise ValueError(f"camera must be static, moving or auto, got {self.camera!r}")
        if self.rig_proportions not in PROPORTIONS:
            raise ValueError(f"rig_proportions must be {' or '.join(PROPORTIONS)}, got {self.rig_proportions!r}")


@dataclass
class MocapReport:
    """What one source's mocap run did: the video run, the exported tracks (id -> files), the tracks left out (id ->
    why), the error (None when complete) and seconds per stage (the video's, plus ``solve`` and ``export``)."""

    source: str
    video: Any = None
    tracks: dict[int, list[str]] = field(default_factory=dict)
    left_out: dict[int, str] = field(default_factory=dict)
    skipped: bool = False
    error: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        frames = self.video.frames if self.video is not None else 0
        return f"{self.source}: {frames} frames, {len(self.tracks)} tracks exported" + (
            f" ({len(self.left_out)} left out)" if self.left_out else "")  # fmt: skip


# ------------------------------------------------------------------------------------------------- per frame


def _encode(values: np.ndarray, digits: int = DIGITS) -> list[float | None]:
    flat = np.round(np.asarray(values, np.float64), digits).reshape(-1).tolist()  # Python floats: a frame has ~1,100
    return [v if math.isfinite(v) else None for v in flat]


def _decode(values: list[float | None], width: int) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], np.float64).reshape(-1, width)


class MocapHook:
    """The per-frame work of a mocap run inside ``predict_video``: lift each tracked person, record, draw.

    Its record field ``mocap`` is a list with one object per tracked person (``record_lifted``): ``track_id``,
    ``points`` (308 x 3 skin points, metres, camera frame, flattened), ``joints`` (J x 3 joint centres of
    ``skeleton.mocap_skeleton()``), ``flags`` (one letter per keypoint: ``v`` visible, ``o`` occluded, ``f`` filled,
    ``-`` unknown), ``joint_flags`` (one letter per joint: ``v`` measured, ``f`` filled) and ``camera`` (fx, fy, cx,
    cy of the pinhole read from the pointmap). With the person's 2D keypoints and scores in the same record, that
    is the whole ``lift.Lifted3D`` (``read_tracks`` rebuilds it). The panel is ``SkeletonView``'s.

    Args:
        online: keep a per-track ``solve.OnlineSolver`` (One-Euro in 3D, bones learned as it goes) and draw its
            skeleton; else draw the frame's lifted keypoints.
        view: draw the 3D view.
        use_seg: give the seg labels to the lifting (occlusion from body parts).
        fps: the source's frame rate (for the online solve).
        background: record the background's features (``mocap.world.background_features``: the camera's motion)
            in the record's ``background`` field.
    """

    name = "mocap"

    def __init__(self, *, online: bool = False, view: bool = True, use_seg: bool = True, fps: float = 30.0,
                 background: bool = False) -> None:  # fmt: skip
        self.online, self.view, self.use_seg, self.fps = online, view, use_seg, fps
        self.background = background
        self.signature = {"version": 1, "use_seg": use_seg, "digits": DIGITS}
        if background:
            self.signature["background"] = 1
        self._view: Any = None
        self._solvers: dict[int, Any] = {}

    def lift(self, results: Mapping[str, Any], ids: np.ndarray | None) -> list[tuple[int, Any]]:
        """(track id, ``Lifted3D``) for every tracked person of one frame's results."""
        from .lift import lift_frame

        pose, pointmap = results.get("pose"), results.get("pointmap")
        if pose is None or pointmap is None or ids is None or not len(pose.keypoints):
            return []
        seg = results.get("seg") if self.use_seg else None
        labels = seg.labels if seg is not None else None
        lifted = []
        for n in range(len(pose.keypoints)):
            if int(ids[n]) < 0:  # a detection too weak to start a track
                continue
            try:
                lifted.append((int(ids[n]), lift_frame(pose.keypoints[n], pose.scores[n], pointmap.points, labels)))
            except ValueError as error:  # e.g. a pointmap with no finite point: the person is not seen this frame
                logger.debug("frame not lifted for track %d: %s", int(ids[n]), error)
        return lifted

    def __call__(self, frame: Any, results: Mapping[str, Any], ids: np.ndarray | None
                 ) -> tuple[dict, np.ndarray | None]:  # fmt: skip
        people, shown = [], {}
        for track, lifted in self.lift(results, ids):
            people.append(record_lifted(track, lifted))
            if self.online:
                solver = self._solvers.get(track)
                if solver is None:
                    from .solve import OnlineSolver

                    solver = self._solvers[track] = OnlineSolver(self.fps, keep_frames=False)  # records keep them
                shown[track] = solver.step(lifted, frame.time)[0]
            else:
                shown[track] = np.asarray(lifted.keypoints, np.float64)
        fields: dict[str, Any] = {"mocap": people}
        pointmap = results.get("pointmap")
        if self.background:  # every record has the field (null without a pointmap): the path covers every frame
            from .world import background_features, encode_features

            seg, pose = results.get("seg") if self.use_seg else None, results.get("pose")
            features = None if pointmap is None else background_features(
                frame.image, pointmap.points, seg.labels if seg is not None else None,
                pose.boxes if pose is not None else None)  # fmt: skip
            fields["background"] = encode_features(features)
        panel = None
        if self.view:
            if self._view is None:
                from .skeleton import mocap_skeleton
                from .view import SkeletonView

                parents = mocap_skeleton().parents if self.online else None
                self._view = SkeletonView(frame.image.shape[0], parents=parents)
            panel = self._view(shown)
        return fields, panel


def record_lifted(track: int, lifted: Any) -> dict:
    """A ``Lifted3D`` as the JSON object of a frame record's ``mocap`` list (see ``MocapHook``)."""
    codes = np.where(lifted.visible, 1, np.where(lifted.occluded, 2, 3))
    codes = np.where(np.isfinite(np.asarray(lifted.keypoints)).all(axis=1), codes, 0)
    k = np.asarray(lifted.intrinsics, np.float64)
    return {"track_id": track, "points": _encode(lifted.keypoints), "joints": _encode(lifted.joints),
            "flags": "".join(FLAGS[c] for c in codes.tolist()),
            "joint_flags": "".join("f" if f else "v" for f in np.asarray(lifted.joint_filled).tolist()),
            "camera": _encode([k[0, 0], k[1, 1], k[0, 2], k[1, 2]], 3)}  # fmt: skip


def flag_array(flags: str) -> np.ndarray:
    """(K,) int8 codes of a flags string: 0 unknown, 1 visible, 2 occluded, 3 filled (``FLAGS``)."""
    codes = np.zeros(256, np.int8)
    for code, letter in enumerate(FLAGS):
        codes[ord(letter)] = code
    return codes[np.frombuffer(flags.encode("ascii"), np.uint8)]


def _lifted_from_record(person: dict, pose: dict | None) -> Any:
    from .lift import Lifted3D

    codes = flag_array(person["flags"])
    count = len(codes)
    if pose is not None and len(pose["keypoints"]) == 3 * count:
        flat = _decode(pose["keypoints"], 3)
        pixels, scores = flat[:, :2], flat[:, 2]
    else:  # written with another keypoint format: the 2D points are not the 308
        pixels, scores = np.full((count, 2), np.nan), np.where(codes == 1, 1.0, 0.0)
    fx, fy, cx, cy = person["camera"]
    return Lifted3D(keypoints=_decode(person["points"], 3), joints=_decode(person["joints"], 3), scores=scores,
                    pixels=pixels, visible=codes == 1, occluded=codes == 2, filled=codes >= 2,
                    joint_filled=np.array([c == "f" for c in person["joint_flags"]]),
                    intrinsics=np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]]))  # fmt: skip


# ------------------------------------------------------------------------------------------------- per track


@dataclass
class RecordedTrack:
    """One track as recorded: ``frames`` (T,) source indices from its first to its last frame (every ``stride``-th
    frame that was written), ``times`` (T,) seconds, ``lifted`` (T,) ``Lifted3D`` or None where the person was not
    in the frame."""

    track_id: int
    frames: np.ndarray
    times: np.ndarray
    lifted: list[Any]

    @property
    def seen(self) -> np.ndarray:
        """(T,) bool: the person was in the frame."""
        return np.array([item is not None for item in self.lifted])

    @property
    def points(self) -> np.ndarray:
        """(T, 308, 3) lifted keypoints, NaN where not seen."""
        count = next(len(item.keypoints) for item in self.lifted if item is not None)
        return np.stack([item.keypoints if item is not None else np.full((count, 3), np.nan) for item in self.lifted])

    @property
    def flags(self) -> np.ndarray:
        """(T, 308) int8 codes: 0 not seen, 1 visible, 2 occluded, 3 filled."""
        count = next(len(item.keypoints) for item in self.lifted if item is not None)
        return np.stack([np.where(item.visible, 1, np.where(item.occluded, 2, 3)).astype(np.int8)
                         if item is not None else np.zeros(count, np.int8) for item in self.lifted])  # fmt: skip


def read_tracks(frames_jsonl: str | os.PathLike, stride: int = 1) -> dict[int, RecordedTrack]:
    """Every track of a mocap run's ``clip_frames.jsonl``, rebuilt from the records' ``mocap`` field."""
    per_track: dict[int, dict[int, Any]] = {}
    times: dict[int, float] = {}
    with open(frames_jsonl) as lines:
        for line in lines:
            record = json.loads(line)
            times[record["frame"]] = record["time"]
            poses = {p["track_id"]: p for p in record.get("people", ()) if p.get("track_id") is not None}
            for person in record.get("mocap", ()):
                track = person["track_id"]
                per_track.setdefault(track, {})[record["frame"]] = _lifted_from_record(person, poses.get(track))
    tracks = {}
    for track, seen in sorted(per_track.items()):
        first, last = min(seen), max(seen)
        frames = np.array([f for f in range(first, last + 1, stride) if f in times], np.int64)
        lifted = [seen.get(f) for f in frames.tolist()]
        tracks[track] = RecordedTrack(track, frames, np.array([times[f] for f in frames.tolist()]), lifted)
    return tracks


def clip_intrinsics(tracks: Mapping[int, RecordedTrack]) -> np.ndarray | None:
    """(3, 3) the source's pinhole: the median over the frames where someone was lifted of the frame's ``camera``
    (fx, fy, cx, cy) that ``lift.lift_frame`` read from its pointmap and lifted the keypoints with (one per frame: the
    people of a frame share it); None without any."""
    per_frame: dict[int, np.ndarray] = {}
    for data in tracks.values():
        for frame, lifted in zip(data.frames.tolist(), data.lifted, strict=True):
            if lifted is not None:
                per_frame.setdefault(frame, np.asarray(lifted.intrinsics, np.float64))
    return np.median(np.stack(list(per_frame.values())), axis=0) if per_frame else None


def read_background(frames_jsonl: str | os.PathLike) -> tuple[np.ndarray, list[Any], dict[int, float]] | None:
    """The background features of a mocap run's ``clip_frames.jsonl`` (the records' ``background`` field, written
    when the camera may move): (T,) frame indices, their ``world.Features`` (None where a frame has none) and frame
    -> time; None when no record has the field."""
    from .world import decode_features

    frames, features, times = [], [], {}
    with open(frames_jsonl) as lines:
        for line in lines:
            record = json.loads(line)
            if "background" in record:
                frames.append(record["frame"])
                features.append(decode_features(record["background"]))
                times[record["frame"]] = record["time"]
    return (np.array(frames, np.int64), features, times) if frames else None


def solve_and_export(tracks: Mapping[int, RecordedTrack], folder: Path, fps: float, options: MocapOptions,
                     mode: str, min_frames: int | None = None, camera: Any = None
                     ) -> tuple[dict[int, list[str]], dict[int, str], dict[str, float]]:  # fmt: skip
    """Solve every track seen on at least ``min_frames`` frames (default ``options.min_frames``) with
    ``solve.solve_track`` (3D smoothing ``mode``) and write its exports into ``folder``; with ``options.scene``
    the ``SCENE_FORMATS`` go into one ``scene.<format>`` listed among every track's files. With a moving
    ``camera`` (a ``world.CameraPath`` from ``world.camera_path``) the tracks are grounded in the world frame
    (``world.ground_motion``) before their feet are planted and they are exported, the grounded path is written to
    ``camera.csv``, listed among every track's files, and goes into the USD, glTF and FBX; with a static one (None,
    or not ``moving``) those hold the still camera the exports are seen from (``_still_camera``). Returns (id ->
    files, id -> why left out, seconds of ``solve`` and ``export``)."""
    min_frames = options.min_frames if min_frames is None else min_frames
    from .rigs import retarget
    from .solve import SolveOptions, solve_track

    files: dict[int, list[str]] = {}
    left_out: dict[int, str] = {}
    seconds = {"solve": 0.0, "export": 0.0}
    folder.mkdir(parents=True, exist_ok=True)
    old_files = [*folder.glob("track_*"), *folder.glob("scene.*"), *folder.glob("camera.csv")]
    for old in old_files:  # an earlier run's exports (other tracks, formats)
        old.unlink()
    per_track = [f for f in options.formats if not (options.scene and f in SCENE_FORMATS)]
    in_scene: list[tuple[int, Any, float]] = []
    found: dict[int, Any] = {}  # track id -> its foot contacts
    moving = camera is not None and camera.moving
    still = None if moving else _still_camera(tracks, options.formats, fps)
    solved_tracks: dict[int, tuple[RecordedTrack, Any]] = {}
    for track, data in tracks.items():
        seen = int(data.seen.sum())
        if seen < min_frames:
            left_out[track] = f"seen on {seen} frames (fewer than {min_frames})"
            continue
        start = time.perf_counter()
        try:  # with a moving camera the feet are planted in the world, below
            plant = options.plant_feet and not moving
            solved_tracks[track] = data, solve_track(data.lifted, fps, SolveOptions(smooth=mode, plant_feet=plant))
        except ValueError as error:
            left_out[track] = f"cannot solve: {error}"
            continue
        finally:
            seconds["solve"] += time.perf_counter() - start
    grounded: list[str] = []
    if moving:
        from .world import feet_ground, ground_motion, write_camera_path

        start = time.perf_counter()
        camera = camera.grounded([feet_ground(s.motion, *camera.at(d.frames)) for d, s in solved_tracks.values()])
        grounded = [write_camera_path(camera, str(folder / "camera.csv"))]
        logger.info("camera path in the world: up and the ground from the %s", camera.up_from)
        seconds["solve"] += time.perf_counter() - start
    for track, (data, solved) in solved_tracks.items():
        motion, contacts, seen_by = solved.motion, solved.contacts, still
        if moving:
            start = time.perf_counter()
            motion, contacts = ground_motion(motion, camera, data.frames, options.plant_feet and mode != "online")
            seen_by = _camera_animation(camera, data.frames, per_track, fps)
            seconds["solve"] += time.perf_counter() - start
        start = time.perf_counter()
        rigged = retarget(motion, options.rig, options.rig_proportions)
        stem = folder / f"track_{track}"
        files[track] = [str(p) for p in export_motion(motion, stem, per_track, rigged, contacts, seen_by)] + grounded
        in_scene.append((track, rigged, float(data.times[0])))  # its start in the clip, in seconds
        found[track] = contacts
        seconds["export"] += time.perf_counter() - start
    if in_scene and per_track != list(options.formats):
        start = time.perf_counter()
        in_file = [f for f in options.formats if f not in per_track]
        seen_by = _camera_animation(camera, camera.frames, in_file, fps, in_clip=True) if moving else still
        scene = export_scene(in_scene, folder / "scene", in_file, found, seen_by)
        for track, _, _ in in_scene:
            files[track] += [str(p) for p in scene]  # the files holding the track
        seconds["export"] += time.perf_counter() - start
    return files, left_out, seconds


def _camera_animation(camera: Any, frames: np.ndarray, formats: Sequence[str], fps: float,
                      in_clip: bool = False) -> Any:  # fmt: skip
    """The moving ``camera`` (a grounded ``world.CameraPath``) over ``frames`` as the USD, glTF and FBX exports take
    it (``rig.CameraAnimation``), from 0 s, or ``in_clip`` from its first frame's time (a scene); None without any of
    them in ``formats``."""
    if not {"usd", "glb", "fbx"} & set(formats):
        return None
    from .rig import CameraAnimation

    first = camera.times[0] if in_clip and camera.times is not None else np.nan
    start = float(first) if np.isfinite(first) else 0.0
    return CameraAnimation.from_camera(*camera.at(frames), fps, start, camera.intrinsics)


def _still_camera(tracks: Mapping[int, RecordedTrack], formats: Sequence[str], fps: float) -> Any:
    """A static shot's camera as the USD, glTF and FBX exports take it (``rig.CameraAnimation``, still): the exports
    are in the camera's own frame, so it stands at the origin with no turn (looking down the files' -Z, +Y up), with
    the pinhole the keypoints were lifted with (``clip_intrinsics``); None without any of them in ``formats``."""
    if not {"usd", "glb", "fbx"} & set(formats):
        return None
    from .rig import CameraAnimation

    return CameraAnimation.from_camera(np.eye(3)[None], np.zeros((1, 3)), fps, intrinsics=clip_intrinsics(tracks))


def export_motion(motion: Any, stem: Path, formats: Sequence[str], rigged: Any = None,
                  contacts: Any = None, camera: Any = None) -> list[Path]:  # fmt: skip
    """Write ``motion`` in each of ``formats`` at ``stem`` + the format's suffix; returns the files written. With
    ``rigged`` (a ``rigs.RigMotion``) the ``RIG_FORMATS`` hold that rig's motion (FBX and USD its bone axes too).
    The foot ``contacts`` (``mocap.contacts.FootContacts``) go with CSV / Parquet into ``<stem>_contacts.<suffix>``,
    into the FBX as an animated ``contact`` user property of each ankle joint (on a rig: the joint that follows
    our ankle) and into the USD as time-sampled attributes ``sapiens2:contact:<foot>`` of the Skeleton prim. The
    shot's ``camera`` (``rig.CameraAnimation``, moving or still) goes into the USD, the glTF and the FBX."""
    written: list[Path] = []
    animated = motion if rigged is None else rigged.motion
    axes = None if rigged is None else rigged.orientations
    if "bvh" in formats:
        from .bvh import write_bvh

        written.append(Path(write_bvh(animated, stem.with_name(stem.name + ".bvh"))))
    if "glb" in formats:
        from .gltf import write_glb

        written.append(Path(write_glb(animated, stem.with_name(stem.name + ".glb"), camera=camera)))
    if "fbx" in formats:
        from .fbx import FbxTrack, write_fbx_scene

        track = FbxTrack(stem.name, animated, orientations=axes, curves=_contact_curves(contacts, rigged))
        written.append(Path(write_fbx_scene([track], stem.with_name(stem.name + ".fbx"), camera)))
    if "c3d" in formats:
        from .c3d import write_c3d

        written.append(Path(write_c3d(motion, stem.with_name(stem.name + ".c3d"))))
    if "usd" in formats:
        from .usd import SkeletalAnimation, write_usd

        attributes = contacts.attributes() if contacts is not None else None
        animation = SkeletalAnimation.from_motion(animated, stem.name, orientations=axes, attributes=attributes)
        written.append(Path(write_usd(animation, stem.with_name(stem.name + ".usdc"), camera=camera)))
    if "csv" in formats or "parquet" in formats:
        from .tables import write_trajectories

        for suffix in ("csv", "parquet"):
            if suffix in formats:
                written.append(Path(write_trajectories(motion, stem.with_name(f"{stem.name}_points.{suffix}"))))
        if contacts is not None:
            from .tables import write_contacts

            for suffix in ("csv", "parquet"):
                if suffix in formats:
                    path = stem.with_name(f"{stem.name}_contacts.{suffix}")
                    written.append(Path(write_contacts(motion, contacts, path)))
    if "angles" in formats:
        from .tables import write_joint_angles

        written += [Path(p) for p in write_joint_angles(motion, stem.with_name(f"{stem.name}_angles.csv"))]
    if "trc" in formats:
        from .tables import trajectory_table
        from .trc import write_trc

        written.append(Path(write_trc(trajectory_table(motion), stem.with_name(stem.name + ".trc"))))
    return written


def _contact_curves(contacts: Any, rigged: Any) -> dict[str, dict[str, np.ndarray]] | None:
    """The FBX user curves of foot ``contacts`` on the animated skeleton: our ankles, or on a rig the joints that
    follow them (``rigs.RigMotion.mapping``); None without contacts."""
    if contacts is None:
        return None
    curves = contacts.by_joint()
    if rigged is None or rigged.rig == "sapiens2":
        return curves
    follows = {ours: joint for joint, ours in rigged.mapping.items()}
    return {follows[joint]: values for joint, values in curves.items() if joint in follows}


def export_scene(tracks: Sequence[tuple[int, Any, float]], stem: Path, formats: Sequence[str],
                 contacts: Mapping[int, Any] | None = None, camera: Any = None) -> list[Path]:  # fmt: skip
    """Write every (track id, ``Motion`` or ``rigs.RigMotion``, its start in the clip in seconds) into one file per
    format of ``formats`` (from ``SCENE_FORMATS``) at ``stem`` + the format's suffix, each track at its time, with
    its foot ``contacts`` (track id -> ``FootContacts``) and the shot's ``camera`` as ``export_motion`` writes them;
    returns the files written."""
    from .rig import Motion

    written: list[Path] = []
    contacts = contacts or {}
    rigs = {t: (None if isinstance(m, Motion) else m) for t, m, _ in tracks}
    rigged = [(t, (m, None) if isinstance(m, Motion) else (m.motion, m.orientations), s) for t, m, s in tracks]
    if "fbx" in formats:
        from .fbx import FbxTrack, write_fbx_scene

        scene = [FbxTrack(f"track_{track}", motion, start, axes, curves=_contact_curves(contacts.get(track),
                                                                                         rigs[track]))
                 for track, (motion, axes), start in rigged]  # fmt: skip
        written.append(Path(write_fbx_scene(scene, stem.with_name(stem.name + ".fbx"), camera)))
    if "glb" in formats:
        from .gltf import write_glb_scene

        path = stem.with_name(stem.name + ".glb")
        tracks_in = [(f"track_{t}", motion, start) for t, (motion, _), start in rigged]
        written.append(Path(write_glb_scene(tracks_in, path, camera)))
    if "usd" in formats:
        from .usd import SkeletalAnimation, write_usd

        animations = [SkeletalAnimation.from_motion(motion, f"track_{track}", round(start * motion.fps), axes,
                                                    contacts[track].attributes() if track in contacts else None)
                      for track, (motion, axes), start in rigged]  # fmt: skip
        written.append(Path(write_usd(animations, stem.with_name(stem.name + ".usdc"), camera=camera)))
    return written


# ------------------------------------------------------------------------------------------------- a source


def _source_signature(text: str, options: MocapOptions, hook: MocapHook) -> dict:
    from ..video.decode import is_stream_url

    stat = {}
    if not is_stream_url(text) and Path(text).is_file():
        info = Path(text).stat()
        stat = {"bytes": info.st_size, "mtime": int(info.st_mtime)}
    video = {k: getattr(options.video, k) for k in ("start", "end", "stride", "detect_every", "smooth", "fps",
                                                    "keypoint_format")}  # fmt: skip
    return {"source": text, **stat, "video": video, "hook": hook.signature}


def run_mocap(
    predictors: Mapping[str, Any],
    source: str | os.PathLike | int,
    output: str | os.PathLike,
    options: MocapOptions | None = None,
    *,
    progress: bool | None = None,
) -> MocapReport:
    """Capture the motion of every tracked person in ``source`` and write the exports (see the module docstring).

    Args:
        predictors: task -> ``Predictor`` for ``pose`` (its detector, or None for the whole frame) and ``pointmap``,
            and ``seg`` to detect occlusion from body parts.
        source: a video file, an image or a folder of frames (a sequence), a camera index or a stream URL.
        output: output folder; files are named after the source (``video.run.video_stem``).
        options: see ``MocapOptions``.
        progress: show a progress bar (default: on a terminal).

    Returns:
        A ``MocapReport``. A source that fails mid-way keeps its frames up to the last good one, exports the tracks
        from them and reports the error; an unusable source raises ``VideoReadError``.

    Example:
        >>> predictors = {t: Predictor(t, model="1b") for t in ("pose", "pointmap", "seg")}
        >>> report = run_mocap(predictors, "clip.mp4", "out/")
    """
    from ..video.decode import is_stream_url
    from ..video.run import predict_video, video_stem

    options = options or MocapOptions()
    missing = [t for t in MOCAP_TASKS if t not in predictors]
    if missing:
        raise ValueError(f"mocap needs a Predictor for {' and '.join(missing)} (it has {', '.join(predictors)})")
    check_pose_model(predictors["pose"])
    tasks = {t: p for t, p in predictors.items() if t in MOCAP_TASKS or (t == "seg" and options.seg)}
    text = str(source) if isinstance(source, int) else os.fspath(source)
    stem = video_stem(source, Path(output))
    report = MocapReport(text)
    summary_path = stem.parent / f"{stem.name}_mocap.json"
    if options.skip_existing and summary_path.is_file():
        report.skipped = True
        return report
    live = isinstance(source, int) or is_stream_url(text) or text.startswith("/dev/")
    mode = options.smooth if options.smooth != "auto" else ("online" if live else "offline")
    hook = MocapHook(online=mode == "online", view=options.view and options.video.overlay, use_seg="seg" in tasks,
                     fps=options.video.fps or 30.0, background=options.camera != "static")  # fmt: skip
    folder = stem.parent / f"{stem.name}_mocap"
    run_file = folder / "run.json"
    signature = _source_signature(text, options, hook)
    video_summary = stem.parent / f"{stem.name}_video.json"
    done = _finished_video(video_summary, run_file, signature)
    if done is None:
        summary_path.unlink(missing_ok=True)
        run_file.unlink(missing_ok=True)
        video = dataclasses.replace(options.video, skip_existing=False)
        report.video = predict_video(tasks, source, output, video, progress=progress, hook=hook)
        fps = json.loads(video_summary.read_text())["fps"] if video_summary.is_file() else 30.0
        report.seconds.update(report.video.seconds)
        if report.video.error is None and video_summary.is_file():  # a rerun goes straight to the exports
            atomic_write(run_file, json.dumps(signature).encode())
    else:  # killed after the video was complete: the records are all there
        from ..video.run import VideoReport

        report.video = VideoReport(text, frames=done["frames"], resumed_frames=done["frames"],
                                   outputs=[str(stem.parent / f"{stem.name}_frames.jsonl")])  # fmt: skip
        report.video.error = done.get("error")
        fps = done["fps"]
    report.error = report.video.error
    frames_jsonl = stem.parent / f"{stem.name}_frames.jsonl"
    if not frames_jsonl.is_file():
        return report
    stride = options.video.stride
    tracks = read_tracks(frames_jsonl, stride)
    try:
        camera, camera_summary = _camera_path(frames_jsonl, options.camera, text, report)
        needed = min(options.min_frames, max(report.video.frames, 1))  # a photo or a short clip: every track
        report.tracks, report.left_out, seconds = solve_and_export(tracks, folder, fps / stride, options, mode, needed,
                                                                   camera)  # fmt: skip
    except Exception as problem:  # e.g. the disk filled up: the records stay, a rerun exports again
        report.error = report.error or f"{text}: cannot write exports ({type(problem).__name__}: {problem})"
        return report
    report.seconds.update(seconds)
    summary = {
        "source": text, "frames": report.video.frames, "fps": fps / stride, "smooth_3d": mode,
        "seg": "seg" in tasks, "formats": list(options.formats), "scene": options.scene, "rig": options.rig,
        "rig_proportions": options.rig_proportions, "plant_feet": options.plant_feet, "camera": camera_summary,
        "error": report.error,
        "tracks": {str(t): [str(Path(p).relative_to(stem.parent)) for p in paths] for t, paths in
                   report.tracks.items()},
        "left_out": {str(t): why for t, why in report.left_out.items()},
        "video": str(video_summary.relative_to(stem.parent)),
    }  # fmt: skip
    atomic_write(summary_path, json.dumps(summary, indent=1).encode())
    return report


def _camera_path(frames_jsonl: Path, mode: str, text: str, report: MocapReport) -> tuple[Any, dict]:
    """The source's ``world.CameraPath`` (None for a static camera) and its entry in the summary: the mode asked
    for, what was decided and the background's largest motion against the first frame (pixels); ``moving`` on
    fewer than 2 frames is one error line (the exports stay in the camera frame)."""
    if mode == "static":
        return None, {"mode": mode, "moving": False}
    from .world import MIN_POSED, STATIC_PX, camera_path, is_moving

    background = read_background(frames_jsonl)
    count = 0 if background is None else len(background[0])
    if count < 2:
        if mode == "moving":
            report.error = report.error or (f"{text}: --camera moving needs a video (2 frames or more), it has "
                                            f"{count}; exported in the camera's frame")  # fmt: skip
        return None, {"mode": mode, "moving": False, "frames": count}
    frames, features, times = background
    path = camera_path(frames, features, True if mode == "moving" else None, [times[f] for f in frames.tolist()])
    finite = path.motion_px[np.isfinite(path.motion_px)]
    largest = float(finite.max()) if len(finite) > 1 else None  # None: no frame but the first had enough features
    changed = bool(np.isinf(path.motion_px).any())  # a frame shares too few features with the first
    summary = {"mode": mode, "moving": path.moving, "background_motion_px": largest, "view_changed": changed,
               "static_px": STATIC_PX, "found_moving": is_moving(path.motion_px)}  # fmt: skip
    if path.moving:
        summary["posed"] = round(float(path.posed.mean()), 4)
        if path.posed.mean() < MIN_POSED:
            logger.warning("%s: the camera moves but its path was found on %d of %d frames only (too few background "
                           "features with depth); the exports stay in the camera's frame", text, path.posed.sum(),
                           len(path.posed))  # fmt: skip
            summary["moving"], path = False, None
    moved = "the view changed" if changed else ("no background seen" if largest is None else f"{largest:.1f} px")
    logger.info("%s: camera %s (%s; the background moved against the first frame: %s; static up to %s px)",
                text, "moving" if summary["moving"] else "static", "asked" if mode != "auto" else "decided", moved,
                STATIC_PX)  # fmt: skip
    return path, summary


def _finished_video(video_summary: Path, run_file: Path, signature: dict) -> dict | None:
    """The video summary of an earlier run with this signature that completed its video part; else None."""
    try:
        same = json.loads(run_file.read_text()) == json.loads(json.dumps(signature))
        summary = json.loads(video_summary.read_text())
    except (OSError, ValueError):
        return None
    return summary if same and not summary.get("error") else None


def check_pose_model(predictor: Any, what: str = "the pose model") -> None:
    """Refuse a pose model of another keypoint set (``sapiens2.labels``): the rig, the lifting and the solve place
    joints by the 308 keypoints' ids and names (their body, feet and hands), which such a model does not predict.

    Raises:
        ValueError: one line naming the model's keypoints.
    """
    points = getattr(getattr(predictor, "labels", None), "keypoints", None)
    if points is not None and tuple(points.names) != keypoint_metadata().names:
        shown = ", ".join(points.names[:5]) + (", ..." if len(points.names) > 5 else "")
        raise ValueError(
            f"mocap needs a pose model of the 308 Sapiens2 keypoints (it solves the skeleton from their body, feet "
            f"and hands); {what} predicts {len(points.names)} keypoints of its own ({shown})"
        )


# ------------------------------------------------------------------------------------------------- the CLI's entry


def run_mocap_inputs(options: Any, mocap: MocapOptions, *, option: Any = None, progress: bool | None = None) -> int:
    """``sapiens2 mocap``: ``options`` is the ``PredictOptions`` of the run (models, device, output, inputs),
    ``mocap`` the ``MocapOptions``; one error line per failed source, the others still run. Returns 0 when every
    source is complete, 1 otherwise, 2 for a usage error (nothing run)."""
    from ..predict.batch import make_predictors, resolve_sources
    from ..predict.options import check_device, check_input_size, python_option, setup_status
    from ..video.run import drop_missing, run_each

    option = option or python_option
    tasks = [*MOCAP_TASKS, *(("seg",) if mocap.seg else ())]
    try:
        check_device(options.device, option)
        check_input_size(options.input_size, option=option)
        resolve_sources(options, tasks, option, download=False)  # a model file that does not exist: usage error
        sources = drop_missing(options.inputs)  # then the inputs, before any model loads
        predictors = make_predictors(options, tasks, option) if sources else {}
        if predictors:
            check_pose_model(predictors["pose"])
    except (ValueError, OSError) as error:
        report_error(error)
        return setup_status(error)
    status = run_each(sources, lambda source: run_mocap(predictors, source, options.output, mocap, progress=progress))
    return max(status, int(len(sources) < len(options.inputs)))
