"""``sapiens2 mocap``: the flags, parsed into ``PredictOptions`` + ``MocapOptions`` for
``sapiens2.mocap.run.run_mocap_inputs``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..messages import report_error
from .predict import (
    add_frame_range_flags,
    add_model_flags,
    cli_option,
    flag_message,
    model_options,
    note_unused_model_flags,
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "mocap",
        help="video of people -> metric 3D skeletons: BVH, glTF, FBX, USD, C3D, TRC, CSV/Parquet, joint angles, "
        "a 3D overlay",
        description="Motion capture: pose + pointmap (+ seg) through the video pipeline, lifted to metres, solved "
        "on a skeleton per tracked person and exported (docs/mocap.md). Example: sapiens2 mocap clip.mp4 -o out/",
    )
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="video files, images, folders of frames (one sequence each), cameras (/dev/video0, or 0) and stream "
        "URLs (rtsp/http ...)",
    )
    parser.add_argument("-o", "--output", required=True, type=Path, help="output folder")
    add_capture_flags(parser)
    parser.set_defaults(func=run)


def add_capture_flags(parser: argparse.ArgumentParser, formats: tuple[str, ...] | None = None, when: str = "") -> None:
    """The flags of a capture, ``sapiens2 mocap``'s and those of any command that captures videos first (``biomech``):
    the model group, the video group and the mocap group; ``formats`` the default exports (all), ``when`` added to
    the title of the model group (what it is for)."""
    from ..mocap.rigs import PROPORTIONS, RIG_NAMES
    from ..mocap.run import EXPORT_FORMATS, RIG_FORMATS
    from ..mocap.world import CAMERA_MODES

    add_model_flags(parser, f"pose, pointmap, seg (not with --no-seg) and the person detector{when}",
                    batch_help="images (pose: person crops) per forward pass")  # fmt: skip
    video = parser.add_argument_group("video")
    add_frame_range_flags(video, fps_help="the frame rate of a folder of frames (default 30)")
    video.add_argument("--detect-every", type=int, default=1, help="pose: run the detector every N frames, "
                       "boxes from the previous frame's keypoints between")  # fmt: skip
    video.add_argument("--smooth", default="auto", choices=("auto", "none", "online", "offline"),
                       help="3D smoothing: auto is offline (zero lag, bones robust over the clip) for files and "
                       "online (One-Euro in 3D, bones learned as it goes) for cameras and streams")  # fmt: skip
    video.add_argument("--no-overlay", action="store_true", help="do not write the overlay video")
    out = parser.add_argument_group("mocap")
    default = ",".join(formats or EXPORT_FORMATS)
    out.add_argument("--formats", default=default,
                     help=f"comma-separated exports per track (default {'all' if formats is None else default}): "
                     f"{', '.join(EXPORT_FORMATS)}")  # fmt: skip
    out.add_argument("--no-seg", action="store_true",
                     help="run without the seg model (occlusion from depth jumps only; faster)")
    out.add_argument("--no-view", action="store_true", help="no 3D view beside the frame in the overlay")
    out.add_argument("--min-track-frames", type=int, default=5,
                     help="leave out tracks seen on fewer frames (default 5)")  # fmt: skip
    out.add_argument("--skip-existing", action="store_true", help="skip inputs whose mocap summary exists")
    out.add_argument("--no-plant-feet", action="store_true",
                     help="keep the solved feet as measured (default: a foot detected planted on the ground is "
                     "pinned in place by leg IK; the contacts are exported either way)")  # fmt: skip
    out.add_argument("--camera", default="auto", choices=CAMERA_MODES,
                     help="static: the exports in the camera's frame; moving: the camera's path estimated from the "
                     "background (people masked out, metric from the pointmap) and the exports in a world frame with "
                     "gravity up, plus <input>_mocap/camera.csv; auto (default): moving when the background moves "
                     "more than 2 px (docs/mocap.md, Moving cameras)")  # fmt: skip
    out.add_argument("--scene", action="store_true",
                     help="FBX, USD and GLB: every track of an input in one file (<input>_mocap/scene.fbx, "
                     "scene.usdc, scene.glb) instead of one per track")  # fmt: skip
    out.add_argument("--rig", default="sapiens2", choices=RIG_NAMES,
                     help=f"the skeleton of the {', '.join(RIG_FORMATS)} exports: sapiens2 (ours, 65 joints) or a "
                     "standard rig the motion is retargeted onto (docs/mocap.md, Rigs)")  # fmt: skip
    out.add_argument("--rig-proportions", default="track", choices=PROPORTIONS,
                     help="a rig's bone lengths: the track's own (its joints land on the solved ones; default) or "
                     "the rig's (root translation scaled by the leg-length ratio)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from ..mocap.run import MocapOptions, run_mocap_inputs
    from ..predict.options import PredictOptions
    from ..video.run import VideoOptions

    note_unused_model_flags(args, ["pose", "pointmap", *([] if args.no_seg else ["seg"])])
    inputs = [int(i) if i.isdigit() and not Path(i).exists() else i for i in args.inputs]  # 0: the first camera
    options = PredictOptions(tasks=("pose", "pointmap"), output=args.output, inputs=inputs, **model_options(args))
    try:
        video = VideoOptions(start=args.start, end=args.end, stride=args.stride, detect_every=args.detect_every,
                             smooth="none", fps=args.fps, overlay=not args.no_overlay, save_dense=False)  # fmt: skip
    except ValueError as error:
        report_error(flag_message(error, VideoOptions))
        return 2
    try:
        mocap = MocapOptions(video=video, smooth=args.smooth, seg=not args.no_seg, view=not args.no_view,
                             formats=[f.strip() for f in args.formats.split(",") if f.strip()],
                             min_frames=args.min_track_frames, skip_existing=args.skip_existing,
                             scene=args.scene, rig=args.rig, rig_proportions=args.rig_proportions,
                             plant_feet=not args.no_plant_feet, camera=args.camera)  # fmt: skip
    except ValueError as error:
        report_error(flag_message(error, MocapOptions, {"min_frames": "--min-track-frames"}))
        return 2
    return run_mocap_inputs(options, mocap, option=cli_option)
