"""``sapiens2 biomech``: the flags, parsed into ``BiomechOptions`` for ``sapiens2.biomech.run.run_biomech``; a video
goes through ``sapiens2 mocap`` first, with mocap's own flags (``cli.mocap.add_capture_flags``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..messages import report_error
from . import mocap
from .predict import flag_message, note_unused_model_flags


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "biomech",
        help="video or mocap output -> OpenSim model and IK angles, gait parameters, RULA/REBA, a report",
        description="Biomechanics of each tracked person (docs/biomechanics.md): OpenCap's video markers as a TRC, "
        "OpenSim scaling and inverse kinematics (LaiUhlrich2022 model), gait events and parameters, RULA and REBA "
        "per frame, an HTML and PDF report. Example: sapiens2 biomech clip.mp4 -o out/ (or out/clip_mocap)",
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="mocap outputs (a clip_mocap folder, its clip_mocap.json, or a track_<id>_points.csv) "
                        "or videos, which sapiens2 mocap captures first")  # fmt: skip
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="output folder (default: beside each mocap output; required for videos)")  # fmt: skip
    mocap.add_capture_flags(parser, formats=("csv", "trc"), when=", for a video input (sapiens2 mocap's flags)")
    osim = parser.add_argument_group("OpenSim")
    osim.add_argument("--marker-set", default="mmpose", choices=("mmpose", "openpose"),
                      help="OpenCap's video marker set written to the TRC and used for scaling and IK")  # fmt: skip
    osim.add_argument("--static", type=float, nargs=2, metavar=("START", "END"), default=None,
                      help="seconds of the static trial for the scaling (default: the longest still, standing "
                      "stretch of at least 0.5 s)")  # fmt: skip
    osim.add_argument("--mass", type=float, default=75.0, help="the subject's mass in kg (default 75)")
    osim.add_argument("--height", type=float, default=None, help="the subject's height in m (recorded only)")
    osim.add_argument("--model-file", default=None, help="your own OpenSim model (.osim) instead of LaiUhlrich2022")
    osim.add_argument("--marker-file", default=None, help="its marker set (.xml) with OpenCap's marker names")
    osim.add_argument("--no-opensim", action="store_true",
                      help="skip scaling and IK (markers, gait, ergonomics from the trajectories alone)")  # fmt: skip
    work = parser.add_argument_group("ergonomics (what the video does not show)")
    work.add_argument("--load-kg", type=float, default=0.0, help="load handled, kg (default 0)")
    work.add_argument("--repeated", action="store_true",
                      help="postures held over a minute or repeated over 4 times a minute")  # fmt: skip
    work.add_argument("--coupling", type=int, default=0, choices=(0, 1, 2, 3),
                      help="REBA coupling: 0 good, 1 fair, 2 poor, 3 unacceptable")  # fmt: skip
    work.add_argument("--seated", action="store_true", help="the person sits")
    work.add_argument("--arm-supported", action="store_true", help="the arms rest on something")
    out = parser.add_argument_group("output")
    out.add_argument("--no-report", action="store_true", help="no HTML and PDF report")
    parser.set_defaults(func=run)


def _is_mocap_output(text: str) -> bool:
    path = Path(text)
    name = path.name
    return name.endswith(("_mocap", "_mocap.json")) or (
        path.suffix in (".csv", ".parquet") and "_points" in name)  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from ..biomech.ergonomics import WorkConditions
    from ..biomech.run import BiomechOptions, run_biomech
    from ..video.run import run_each, video_stem

    try:
        options = BiomechOptions(marker_set=args.marker_set, static=tuple(args.static) if args.static else None,
                                 mass=args.mass, height=args.height, model=args.model_file, markers=args.marker_file,
                                 opensim=not args.no_opensim, report=not args.no_report,
                                 conditions=WorkConditions(load_kg=args.load_kg, static_or_repeated=args.repeated,
                                                           coupling=args.coupling, seated=args.seated,
                                                           arm_supported=args.arm_supported))  # fmt: skip
    except ValueError as error:
        message = flag_message(error, BiomechOptions, {"model": "--model-file", "markers": "--marker-file"})
        report_error(flag_message(ValueError(message), WorkConditions, {"static_or_repeated": "--repeated"}))
        return 2
    for flag, value in (("--model-file", args.model_file), ("--marker-file", args.marker_file)):
        if value is not None and not Path(value).is_file():
            report_error(f"{flag} {value}: no such file")
            return 2
    try:
        if options.opensim:
            from ..biomech.osim import import_opensim

            import_opensim()
        if options.report:
            from ..biomech.report import import_matplotlib

            import_matplotlib()
    except ImportError as error:
        report_error(f"{error} (or run with --no-opensim --no-report)")
        return 2
    videos = [i for i in args.inputs if not _is_mocap_output(i)]
    status = 0
    sources = [i for i in args.inputs if _is_mocap_output(i)]
    if videos:
        if args.output is None:
            report_error(f"{videos[0]}: a video needs -o OUTPUT (where sapiens2 mocap writes its files)")
            return 2
        # sapiens2 mocap's own run on the videos, with the flags it shares with this command: its checks and errors
        capture = argparse.Namespace(**{**vars(args), "inputs": videos})
        needed = [f for f in ("csv", "trc") if f not in [x.strip() for x in capture.formats.split(",")]]
        capture.formats = ",".join([capture.formats, *needed])  # biomech reads the trajectories and the TRC
        status = mocap.run(capture)
        if status == 2:
            return 2
        for video in videos:  # a video mocap could not read has had its error line
            stem = video_stem(video, args.output)
            if (stem.parent / f"{stem.name}_mocap").is_dir():
                sources.append(str(stem.parent / f"{stem.name}_mocap"))
    else:
        note_unused_model_flags(args, [])  # only mocap outputs: no model is loaded
    missing = [s for s in sources if not Path(s).exists()]
    for source in missing:
        report_error(f"{source}: no such file or folder")
    found = [s for s in sources if s not in missing]
    status = max(status, run_each(found, lambda source: run_biomech(source, args.output, options)))
    return max(status, int(bool(missing)))
