"""``sapiens2 export MODEL -o PATH [--format FORMAT] [--check IMAGE]``.

FORMAT: onnx, pt2, aoti, tensorrt, openvino, executorch, litert, coreml, safetensors or transformers.

MODEL is anything ``load_model`` accepts (a file, folder, repo id or size) or a training run folder / checkpoint.
The name of PATH says the format (``.onnx``, ``.pt2``, ``.engine``/``.plan``, ``.xml``, ``.pte``, ``.tflite``,
``.mlpackage``, ``.safetensors``; a folder: ``transformers``); ``--format`` picks another of the same suffix
(``aoti``: ``.pt2``), and a mismatch is refused.
Networks are exported at the size the model was built or trained for unless ``--input-size`` says otherwise.
Network formats go through ``sapiens2.export``; ``safetensors`` (the default for a training run) through
``sapiens2.train.export_run``; ``transformers`` through ``sapiens2.save_transformers``. ``--check IMAGE`` runs the
written network and PyTorch on the image through the task's pre/post-processing and prints the parity figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ..messages import report_error
from .predict import add_input_size_flag

NETWORK_FORMATS = ("onnx", "pt2", "aoti", "tensorrt", "openvino", "executorch", "litert", "coreml")
FORMATS = (*NETWORK_FORMATS, "safetensors", "transformers")
# Formats whose files Predictor (and so --check) runs here (Core ML: on macOS only).
RUNNABLE_FORMATS = ("onnx", "pt2", "aoti", "openvino", "executorch", "litert") + (
    ("coreml",) if sys.platform == "darwin" else ()
)
# The file name tells the format (the first one listed; --format picks another of the same suffix): ``Predictor``
# and ``load_model`` read files by their suffix. transformers writes a folder.
SUFFIX_FORMATS = {
    ".onnx": ("onnx",),
    ".pt2": ("pt2", "aoti"),
    ".engine": ("tensorrt",),
    ".plan": ("tensorrt",),
    ".xml": ("openvino",),
    ".pte": ("executorch",),
    ".tflite": ("litert",),
    ".mlpackage": ("coreml",),
    ".safetensors": ("safetensors",),
}
# User-input problems: one line on stderr and exit status 2, no traceback.
_USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, KeyError)


def add_parser(commands: argparse._SubParsersAction) -> None:
    """Add the ``export`` subcommand."""
    from ..tasks import TASKS

    parser = commands.add_parser(
        "export",
        help="write a model as ONNX, .pt2, an AOTInductor package, a TensorRT engine, OpenVINO IR, an ExecuTorch "
        "program, a LiteRT model, a Core ML package, safetensors or transformers",
        description="Export a model for deployment (or a training run's weights). Predictor runs .onnx, .pt2, "
        "OpenVINO .xml, ExecuTorch .pte, LiteRT .tflite and (on macOS) Core ML .mlpackage files: "
        "Predictor(task, model='model.onnx').",
    )
    parser.add_argument(
        "model",
        help="a model file, folder, Hugging Face repo id or size (1b), or a training run folder / checkpoint .pt",
    )
    parser.add_argument(
        "-o", "--output", required=True, help="the file to write (its suffix names the format), or a folder for "
        "--format transformers"
    )  # fmt: skip
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="default: from the -o name (.onnx, .pt2, .engine/.plan: tensorrt, .xml: openvino, .pte: executorch, "
        ".tflite: litert, .mlpackage: coreml, .safetensors); give it for aoti (a .pt2 name) and transformers "
        "(a folder)",
    )
    parser.add_argument(
        "--task",
        choices=(*TASKS, "backbone"),
        default=None,
        help="the model's task; read from a local file when not given",
    )
    parser.add_argument("--dtype", choices=("fp32", "fp16", "bf16", "int8"), default=None, help="network precision "
                        "(default fp32; tensorrt: fp16; openvino: the weights' fp32, fp16 or int8, computing in "
                        "float32; litert: fp16 weights or dynamic-range int8; coreml: fp16 compute or int8 weights); "
                        "inputs and outputs stay float32")  # fmt: skip
    add_input_size_flag(parser)
    parser.add_argument("--opset", type=int, default=18, help="ONNX opset (>= 18)")
    parser.add_argument("--check", metavar="IMAGE", default=None,
                        help="run the export and PyTorch on IMAGE and print how far apart they are")  # fmt: skip
    parser.set_defaults(func=run_export)


def is_training_run(source: str) -> bool:
    """A training run folder (``checkpoints/`` inside) or one of its ``checkpoints/step_<N>.pt`` files."""
    path = Path(source)
    return (path.is_dir() and (path / "checkpoints").is_dir()) or (
        path.is_file() and path.suffix == ".pt" and path.parent.name == "checkpoints"
    )


def _detect_task(source: str) -> str:
    from ..checkpoints import detect_task, locate_checkpoint, read_state_dict

    path = locate_checkpoint(source)  # a path that does not exist: not found
    if not isinstance(path, Path):  # a repo id or size: nothing local to read the task from
        raise ValueError(f"give --task for '{source}' (the task is read only from local files)")
    return detect_task(read_state_dict(path, "bf16", device="meta")) or "backbone"


def _load(source: str, task: str | None):
    from ..checkpoints import load_backbone, load_model

    task = task or _detect_task(source)
    if task == "backbone":
        return load_backbone(source, out_type="raw"), task
    return load_model(task, source), task


def _check(model, task: str, path: Path, image: str, input_size: tuple[int, int]) -> int:
    from ..data.io import read_image
    from ..export.check import check_on_image
    from ..export.runtime import load_network

    network = load_network(path, None if task == "backbone" else task)
    result = check_on_image(task, model, network, read_image(image), input_size)
    print(f"check on {image} ({path.name} vs PyTorch float32):")
    for line in result.lines():
        print(f"  {line}")
    return 0 if result.passed else 1


def run_export(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except _USER_ERRORS as error:
        message = str(error).strip().splitlines()
        report_error(message[0] if message else type(error).__name__)
        return 2


def output_format(output: str, format_: str | None) -> str:
    """The format ``-o OUTPUT`` names by its suffix, checked against ``--format`` when both are given."""
    suffix = Path(output).suffix.lower()
    named = SUFFIX_FORMATS.get(suffix)
    suffixes = ", ".join(SUFFIX_FORMATS)
    if format_ == "transformers":
        if named:
            raise ValueError(f"-o {output}: --format transformers writes a folder, not a {suffix} file")
        return format_
    if format_ is None:
        if named:
            return named[0]
        if not suffix:
            raise ValueError(
                f"-o {output}: give the file a format suffix ({suffixes}) or --format transformers for a folder"
            )
    elif named and format_ in named:
        return format_
    wanted = [name for name, formats in SUFFIX_FORMATS.items() if format_ in formats]
    if named:
        raise ValueError(f"-o {output} names a {named[0]} file but --format is {format_}: name it "
                         f"{Path(output).with_suffix(wanted[0])} or leave --format out")  # fmt: skip
    problem = f"unknown file suffix '{suffix}'" if suffix else "no file suffix"
    if not wanted:
        raise ValueError(f"-o {output}: {problem}; use one of {suffixes}")
    raise ValueError(f"-o {output}: {problem}; a --format {format_} file ends in {' or '.join(wanted)}, e.g. "
                     f"{Path(output).with_suffix(wanted[0])}")  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    from ..train.run import ExportOptions, export_run

    run = is_training_run(args.model)
    format_ = output_format(args.output, args.format)
    if args.check and format_ not in RUNNABLE_FORMATS:
        why = f" (Core ML runs only on macOS; this is {sys.platform})" if format_ == "coreml" else ""
        raise ValueError(f"--check runs {', '.join(RUNNABLE_FORMATS)} files, not --format {format_}{why}")
    if format_ == "safetensors":
        if not run:
            raise ValueError(f"--format safetensors exports a training run folder or checkpoint, not '{args.model}'")
        print(f"wrote {export_run(ExportOptions(args.model, args.output))}")
        return 0
    with tempfile.TemporaryDirectory() as folder:
        source = args.model
        if run:  # a training run: its weights first, then the model from them
            source = str(export_run(ExportOptions(args.model, Path(folder) / "weights.safetensors")))
        model, task = _load(source, args.task)
    if format_ == "transformers":
        from ..transformers_format import save_transformers

        if task == "backbone":
            raise ValueError("--format transformers writes task models; give a task model")
        print(f"wrote {save_transformers(model, args.output)}")
        return 0
    from ..export import FORMATS as EXPORTERS
    from ..export import default_input_size

    input_size = tuple(args.input_size) if args.input_size else default_input_size(model)
    options = {"input_size": input_size, "dtype": args.dtype or ("fp16" if format_ == "tensorrt" else "fp32")}
    if format_ == "onnx":
        options["opset"] = args.opset
    path = EXPORTERS[format_](model, args.output, **options)
    print(f"wrote {path} ({task}, {input_size[0]}x{input_size[1]}, {options['dtype']}, {format_})")
    if args.check:
        return _check(model, task, Path(path), args.check, input_size)
    return 0
