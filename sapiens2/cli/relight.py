"""``sapiens2 relight``: the flags, parsed into a ``PredictOptions`` (models, inputs) and a ``vfx.RelightOptions``
for ``sapiens2.vfx.run.relight_files``."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from ..messages import report_error, report_note
from .predict import (
    add_frame_range_flags,
    add_max_megapixels_flag,
    add_model_flags,
    cli_option,
    model_options,
    model_sources,
    note_unused_model_flags,
)

LIGHT_HELP = (
    "a light (repeatable): dir:az=DEG,el=DEG[,color=R,G,B][,intensity=I] (az 0: from the camera, 90: from the "
    "image's right, 180: from behind; el 90: from above) or point:x=M,y=M,z=M[,color=R,G,B][,intensity=I] "
    "(metres, camera frame: x right, y down, z forward; intensity at 1 m); color is linear RGB or #rrggbb"
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    from ..vfx.lights import PRESETS
    from ..vfx.relight import MAX_EXPOSURE
    from ..vfx.run import MATTES

    parser = commands.add_parser(
        "relight",
        help="relight people in images or videos from the predicted normals and albedo",
        description="Relight the people in photos and videos from Sapiens2's normals and albedo, composited over "
        "the plate through the matte. Example: sapiens2 relight photo.jpg --env neon -o out/  or  "
        "sapiens2 relight clip.mp4 --light dir:az=-40,el=30,color=1,0.9,0.8,intensity=1.5 -o out/",
    )
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="image files, folders (recursive), glob patterns or videos")  # fmt: skip
    parser.add_argument("--sample", action="store_true", help="(also) relight the sample photo shipped with sapiens2")
    parser.add_argument("-o", "--output", required=True, type=Path, help="output folder (mirrors the input layout)")
    light = parser.add_argument_group("light (docs/vfx.md, Relighting)")
    light.add_argument("--light", action="append", default=[], metavar="SPEC", help=LIGHT_HELP)
    light.add_argument("--env", default=None, metavar="NAME|FILE",
                       help="an environment: a preset (" + ", ".join(PRESETS) + ") or an equirectangular .hdr/.exr "
                       "panorama (centre: where the camera looks; .exr needs pip install 'sapiens2[exr]')")  # fmt: skip
    light.add_argument("--env-rotate", type=_finite, default=0.0, metavar="DEG",
                       help="turn the environment about the vertical axis (positive: to the right)")  # fmt: skip
    light.add_argument("--env-intensity", type=_non_negative, default=1.0, help="scale the environment")
    light.add_argument("--specular", type=_non_negative, default=None,
                       help="Blinn-Phong highlight strength of the lights (default: the preset's, else 0)")  # fmt: skip
    light.add_argument("--shininess", type=_positive, default=None, help="highlight exponent (default 32)")
    light.add_argument("--matte", default=None, choices=MATTES,
                       help="where the relit person replaces the plate: the matting model's soft alpha (the "
                       "default), the seg model's foreground (a hard edge: hair and motion blur are cut; the "
                       "default when --model seg=PATH is given and no --model matting=PATH), or none (every "
                       "pixel)")  # fmt: skip
    light.add_argument("--keep-shading", action="store_true",
                       help="keep the original's shading detail: plate / (albedo x its estimated shading)")  # fmt: skip
    stops = f"from -{MAX_EXPOSURE:g} to {MAX_EXPOSURE:g}"
    exposure = _number(f"a number of stops {stops}", lambda value: abs(value) <= MAX_EXPOSURE)
    light.add_argument("--exposure", type=exposure, default=0.0, metavar="STOPS",
                       help=f"brighten (+) or darken (-), {stops} stops")  # fmt: skip
    light.add_argument("--distance", type=_positive, default=3.0, metavar="M",
                       help="metres from the camera to the person, for point lights and highlights (default 3)")
    light.add_argument("--focal", type=_positive, default=None, metavar="PX",
                       help="focal length in pixels (default: the longer image side)")  # fmt: skip
    add_model_flags(parser, "normal, albedo (no weights are released: --model albedo=PATH), and matting or seg for "
                    "the matte (see --matte)", batch_help="images per forward pass")  # fmt: skip
    out = parser.add_argument_group("inputs and outputs")
    out.add_argument("--skip-existing", action="store_true", help="skip inputs whose relit output exists")
    out.add_argument("--no-recursive", action="store_true", help="do not descend into subfolders")
    add_max_megapixels_flag(out)
    video = parser.add_argument_group("video (.mp4/.mov/.mkv/.webm/.avi ...)")
    video.add_argument("--frames", action="store_true", help="read each folder INPUT as one video (frames in order)")
    add_frame_range_flags(video)
    parser.set_defaults(func=run)


def _number(want: str, ok: Callable[[float], bool]) -> Callable[[str], float]:
    """An argparse type: a finite number for which ``ok`` holds (NaN and inf never light anything)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}")
        return value

    return parse


_finite = _number("a finite number", lambda value: True)
_non_negative = _number("a finite number >= 0", lambda value: value >= 0)
_positive = _number("a finite number > 0", lambda value: value > 0)


def lighting_from_args(args: argparse.Namespace):
    """``--light``, ``--env`` and the highlight flags as a ``vfx.lights.Lighting``; ValueError (one line, naming
    the flag) for a bad spec, an unreadable panorama or no light at all."""
    from ..vfx.lights import PRESETS, Lighting, load_environment, parse_light

    lights = []
    for spec in args.light:
        try:
            lights.append(parse_light(spec))
        except ValueError as error:
            raise ValueError(f"--{error}") from None
    base = None
    if args.env is not None:
        try:
            base = load_environment(args.env, rotate=args.env_rotate, intensity=args.env_intensity,
                                    max_megapixels=args.max_megapixels)  # fmt: skip
        except (ValueError, OSError, ImportError) as error:
            raise ValueError(f"--env {args.env}: {str(error).removeprefix(args.env + ': ')}") from None
    if not lights and base is None:
        raise ValueError("give a light: --light dir:az=30,el=45 (repeatable) and/or --env NAME|FILE "
                         f"(presets: {', '.join(PRESETS)})")  # fmt: skip
    specular = args.specular if args.specular is not None else (base.specular if base else 0.0)
    shininess = args.shininess if args.shininess is not None else (base.shininess if base else 32.0)
    return Lighting((*(base.lights if base else ()), *lights), base.environment if base else None,
                    specular, shininess, name=args.env or "lights")  # fmt: skip


def default_matte(args: argparse.Namespace) -> str:
    """``--matte`` when not given: seg's foreground when the user names a seg model and no matting model (offline,
    with local files for normal, albedo and seg only), with a note; else the matting model's alpha."""
    models = model_sources(args.model)[1]
    if args.matte is not None:
        return args.matte
    if "seg" in models and "matting" not in models:
        report_note("the matte is the seg model's foreground (--model seg=... and no --model matting=...); "
                    "--matte matting takes the matting model's soft alpha instead")  # fmt: skip
        return "seg"
    return "matting"


def run(args: argparse.Namespace) -> int:
    from ..predict.options import PredictOptions
    from ..vfx.run import RelightOptions, relight_files
    from ..video.run import VideoOptions

    try:
        lighting = lighting_from_args(args)
        video = VideoOptions(start=args.start, end=args.end, stride=args.stride, fps=args.fps)
    except ValueError as error:
        message = str(error)
        if not message.startswith("--") and not message.startswith("give"):  # VideoOptions: "start must be ..."
            message = "--" + message.replace("_", "-")
        report_error(message)
        return 2
    options = PredictOptions(tasks=(), output=args.output, inputs=args.inputs, sample=args.sample,
                             **model_options(args), skip_existing=args.skip_existing,
                             recursive=not args.no_recursive, max_megapixels=args.max_megapixels)  # fmt: skip
    relight_options = RelightOptions(lighting=lighting, matte=default_matte(args), keep_shading=args.keep_shading,
                                     exposure=args.exposure, distance=args.distance, focal=args.focal,
                                     video=video, frames=args.frames)  # fmt: skip
    note_unused_model_flags(args, relight_options.tasks())
    return relight_files(options, relight_options, option=cli_option)

