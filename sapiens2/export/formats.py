"""Deployable files of a Sapiens2 network: ONNX, torch.export ``.pt2``, AOTInductor package, TensorRT engine,
OpenVINO IR (``.xml`` + ``.bin``).

Every format starts from the same ``export_program`` (dynamic batch, float32 in and out, MODEL.md §4 for what the
official deployment scripts did). Each file carries the task, arch, input size and dtype (ONNX metadata properties,
``.pt2`` extra file ``sapiens2.json``, OpenVINO ``rt_info`` under ``sapiens2``), which ``sapiens2.export.runtime``
reads back.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..labels import METADATA_KEY, is_released_set
from ..models.task_model import TaskModel
from .bf16 import emulate_bfloat16, has_bfloat16
from .program import ExportError, backbone_of, default_input_size, export_program, output_names

__all__ = [
    "EXTERNAL_DATA_BYTES",
    "FORMATS",
    "METADATA_FILE",
    "MIN_OPSET",
    "OPENVINO_DTYPES",
    "export_aoti",
    "export_executorch",
    "export_onnx",
    "export_openvino",
    "export_pt2",
    "export_tensorrt",
    "network_metadata",
]

MIN_OPSET = 18
# ONNX files are protobufs, limited to 2 GB: above this many bytes of weights they go to a ``<file>.data`` beside it.
EXTERNAL_DATA_BYTES = int(1.8 * 2**30)
METADATA_FILE = "sapiens2.json"  # inside .pt2 archives
EXPORT_EXTRA = "install the export extra: pip install 'sapiens2[export]'"
OPENVINO_EXTRA = "install the openvino extra: pip install 'sapiens2[openvino]'"
# OpenVINO IR precisions: the float32 graph with float32, float16 or int8 (per-channel, asymmetric) weights.
OPENVINO_DTYPES = ("fp32", "fp16", "int8")


def network_metadata(model: nn.Module, input_size: Sequence[int], dtype: str) -> dict[str, str]:
    """What an exported file records about its network (all values strings, as ONNX metadata needs)."""
    try:
        version = importlib.metadata.version("sapiens2")
    except importlib.metadata.PackageNotFoundError:  # a source checkout that was never installed
        version = "unknown"
    backbone = backbone_of(model)
    metadata = {
        "sapiens2.task": model.task if isinstance(model, TaskModel) else "backbone",
        "sapiens2.arch": backbone.arch.name,
        "sapiens2.input_size": f"{int(input_size[0])}x{int(input_size[1])}",
        "sapiens2.dtype": dtype,
        "sapiens2.outputs": ",".join(output_names(model)),
        "sapiens2.version": version,
    }
    labels = getattr(model, "labels", None)  # a label set of its own (sapiens2.labels): the runtimes read it back
    if isinstance(model, TaskModel) and labels is not None and not is_released_set(labels.for_task(model.task)):
        metadata[f"sapiens2.{METADATA_KEY}"] = labels.to_json()
    return metadata


def _check_suffix(path: str | os.PathLike, suffixes: tuple[str, ...], what: str) -> Path:
    """Refuse a file name whose suffix names another format: files are read back by their suffix."""
    path = Path(path)
    if path.suffix.lower() not in suffixes:
        raise ExportError(f"{path}: {what} is written to a {' or '.join(suffixes)} file (files are read back by "
                          f"their suffix); name it {path.with_suffix(suffixes[0]).name}")  # fmt: skip
    return path


def _require(module: str, purpose: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ExportError(f"{purpose} needs the '{module}' package, which is not installed; {EXPORT_EXTRA}")


def _write_into_place(path: Path, write) -> Path:
    """Run ``write(temporary_path)`` in a fresh folder beside ``path``, then move every file it made into place.

    The file at ``path`` is moved last, so a half-finished export never stands under the final name.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as folder:
        staged = Path(folder) / path.name
        write(staged)
        for made in sorted(Path(folder).iterdir(), key=lambda item: item == staged):
            os.replace(made, path.parent / made.name)
    return path


def _weight_bytes(model: nn.Module, dtype: str) -> int:
    itemsize = 4 if dtype == "fp32" else 2
    return sum(tensor.numel() * itemsize for tensor in model.state_dict().values() if tensor.is_floating_point())


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    input_size: Sequence[int] | None = None,
    dtype: str = "fp32",
    opset: int = MIN_OPSET,
    external_data: bool | None = None,
) -> Path:
    """Write ``model`` as an ONNX file through ``torch.onnx.export(dynamo=True)``.

    The graph has one input ``images`` (batch, 3, H, W) float32 and the outputs of ``OUTPUT_NAMES`` (backbone:
    ``features``), float32; the batch is dynamic. The official bf16 RoPE runs as float32 ops with explicit bf16
    rounding (``sapiens2.export.bf16``), so fp32 and fp16 files run on any onnxruntime provider; a ``bf16`` file
    computes natively in bfloat16, for GPU providers (onnxruntime's CPU provider lacks bf16 kernels).

    Args:
        model: a ``TaskModel`` or ``Sapiens2`` backbone (not modified).
        path: the ``.onnx`` file to write.
        input_size: network input (H, W); default the model's own.
        dtype: ``"fp32"`` (the reference numerics), ``"fp16"`` or ``"bf16"``.
        opset: ONNX opset, at least 18.
        external_data: weights in ``<path>.data`` beside the file; default when they exceed ~1.8 GB (1b and
            larger in fp32), as protobuf files cannot exceed 2 GB.

    Returns:
        ``path``.

    Example:
        >>> export_onnx(load_model("seg", "0.4b"), "seg.onnx")
        >>> Predictor("seg", model="seg.onnx")("photo.jpg")
    """
    _check_suffix(path, (".onnx",), "an ONNX network")
    _require("onnx", "ONNX export")
    _require("onnxscript", "ONNX export")
    if int(opset) < MIN_OPSET:
        raise ExportError(f"opset {opset} is too old: the exporter needs opset >= {MIN_OPSET}")
    size = tuple(input_size or default_input_size(model))
    program = export_program(model, size, dtype)
    if dtype != "bf16" and has_bfloat16(program):
        program = emulate_bfloat16(program)
    onnx_program = torch.onnx.export(
        program,
        dynamo=True,
        opset_version=int(opset),
        input_names=["images"],
        output_names=list(output_names(model)),
        verbose=False,
    )
    onnx_program.model.metadata_props.update(network_metadata(model, size, dtype))
    if external_data is None:
        external_data = _weight_bytes(model, dtype) > EXTERNAL_DATA_BYTES
    return _write_into_place(Path(path), lambda staged: onnx_program.save(staged, external_data=bool(external_data)))


def export_pt2(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    input_size: Sequence[int] | None = None,
    dtype: str = "fp32",
) -> Path:
    """Write ``model`` as a ``torch.export`` archive (``torch.export.save``).

    ``torch.export.load(path).module()`` runs it without the sapiens2 package: float32 images (batch, 3, H, W) in,
    a tuple of float32 outputs out. The bf16 RoPE stays native (PyTorch has the kernels), so the program computes
    the same bits as the eager model on the same machine.

    Example:
        >>> export_pt2(load_model("normal", "1b"), "normal.pt2")
    """
    _check_suffix(path, (".pt2",), "a torch.export program")
    size = tuple(input_size or default_input_size(model))
    program = export_program(model, size, dtype)
    extra = {METADATA_FILE: json.dumps(network_metadata(model, size, dtype))}
    return _write_into_place(Path(path), lambda staged: torch.export.save(program, staged, extra_files=extra))


def _compiler() -> str | None:
    return next((name for name in ("c++", "g++", "clang++") if shutil.which(name)), None)


def export_aoti(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    input_size: Sequence[int] | None = None,
    dtype: str = "fp32",
) -> Path:
    """Compile ``model`` ahead of time with AOTInductor into a ``.pt2`` package for the current device kind.

    ``torch._inductor.aoti_load_package(path)`` runs it without the sapiens2 package. Compiling takes a C++
    compiler and minutes for real sizes; the package runs only on the device kind (CPU or CUDA) it was built on.
    The bf16 RoPE is compiled through the same explicit rounding as the ONNX export, so inductor's fusion cannot
    drop the per-op bf16 roundings (MODEL.md §1.4 "Dtype traps").
    """
    _check_suffix(path, (".pt2",), "an AOTInductor package")
    if _compiler() is None:
        raise ExportError(
            "AOTInductor compiles C++ and no C++ compiler (c++, g++, clang++) was found; install one, or export "
            "--format pt2 (torch.export, no compiler needed) or --format onnx"
        )
    size = tuple(input_size or default_input_size(model))
    program = export_program(model, size, dtype)
    if dtype != "bf16" and has_bfloat16(program):
        program = emulate_bfloat16(program)

    configs = {"aot_inductor.metadata": network_metadata(model, size, dtype)}  # read back by runtime.Pt2Network

    def write(staged: Path) -> None:
        torch._inductor.aoti_compile_and_package(program, package_path=str(staged), inductor_configs=configs)

    return _write_into_place(Path(path), write)


def tensorrt_problem() -> str | None:
    """Why a TensorRT engine cannot be built here, or None when it can."""
    missing = []
    if importlib.util.find_spec("tensorrt") is None:
        missing.append("the 'tensorrt' package is not installed")
    if not torch.cuda.is_available():
        missing.append("no CUDA GPU is available")
    return " and ".join(missing) or None


def export_tensorrt(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    input_size: Sequence[int] | None = None,
    dtype: str = "fp16",
    max_batch: int = 8,
) -> Path:
    """Build a serialized TensorRT engine from the ONNX export (fp16 or bf16 kernels allowed when asked).

    The engine has a dynamic batch 1..``max_batch`` (optimised for ``max_batch``) and runs only on the GPU kind it
    was built on. Needs ``tensorrt`` and a CUDA GPU.
    """
    _check_suffix(path, (".engine", ".plan"), "a TensorRT engine")
    problem = tensorrt_problem()
    if problem is not None:
        raise ExportError(
            f"TensorRT export is not possible here: {problem}. Export --format onnx and build the engine on the "
            "target GPU machine (trtexec --onnx=model.onnx --fp16 --saveEngine=model.engine), or use onnxruntime's "
            "TensorRT provider with the ONNX file"
        )
    try:
        import tensorrt as trt
    except ImportError as error:  # tensorrt_problem() found the package, but it does not import
        raise ExportError(f"TensorRT export is not possible here: tensorrt does not import ({error})") from None

    size = tuple(input_size or default_input_size(model))
    with tempfile.TemporaryDirectory() as folder:
        onnx_path = export_onnx(model, Path(folder) / "network.onnx", input_size=size, dtype="fp32")
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(index)) for index in range(parser.num_errors))
            raise ExportError(f"TensorRT could not parse the ONNX export: {errors}")
        config = builder.create_builder_config()
        if dtype == "fp16":
            config.set_flag(trt.BuilderFlag.FP16)
        elif dtype == "bf16":
            config.set_flag(trt.BuilderFlag.BF16)
        profile = builder.create_optimization_profile()
        shape: Any = (3, *size)
        profile.set_shape("images", (1, *shape), (max_batch, *shape), (max_batch, *shape))
        config.add_optimization_profile(profile)
        engine = builder.build_serialized_network(network, config)
        if engine is None:
            raise ExportError("TensorRT failed to build an engine from the ONNX export (see its log above)")
    return _write_into_place(Path(path), lambda staged: staged.write_bytes(bytes(engine)))


def export_openvino(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    input_size: Sequence[int] | None = None,
    dtype: str = "fp32",
) -> Path:
    """Write ``model`` as OpenVINO IR: ``path`` (``.xml``, the graph) and the weights in ``.bin`` beside it.

    The graph is OpenVINO's conversion of the fp32 ONNX export (``export_onnx``: the bf16 RoPE as float32 ops with
    explicit bf16 rounding), so both share one interface: ``images`` (batch, 3, H, W) float32 in, float32 outputs.
    The precision is that of the stored weights; the graph computes in float32 either way:

    - ``fp32``: float32 weights, the reference numerics;
    - ``fp16``: weights stored in float16 (``compress_to_fp16``), half the file, decompressed when loaded;
    - ``int8``: weights compressed to int8 per output channel by NNCF (``nncf.compress_weights``, asymmetric),
      a quarter of the file; activations stay float.

    Example:
        >>> export_openvino(load_model("seg", "0.4b"), "seg.xml", dtype="fp16")
        >>> Predictor("seg", model="seg.xml")("photo.jpg")  # openvino.Core on the CPU
    """
    _check_suffix(path, (".xml",), "an OpenVINO IR network")
    if dtype not in OPENVINO_DTYPES:
        raise ExportError(
            f"OpenVINO IR is written with {', '.join(OPENVINO_DTYPES)} weights, not {dtype!r} (the graph computes "
            "in float32 whatever the weights)"
        )
    try:
        import openvino

        if dtype == "int8":
            import nncf
    except ImportError as error:
        raise ExportError(f"{'int8 ' if dtype == 'int8' else ''}OpenVINO export needs the '{error.name}' package, "
                          f"which is not installed; {OPENVINO_EXTRA}") from None  # fmt: skip

    size = tuple(input_size or default_input_size(model))
    with tempfile.TemporaryDirectory() as folder:
        onnx_path = export_onnx(model, Path(folder) / "network.onnx", input_size=size, dtype="fp32")
        network = openvino.convert_model(str(onnx_path))
    if dtype == "int8":
        network = nncf.compress_weights(network, mode=nncf.CompressWeightsMode.INT8_ASYM)
    for key, value in network_metadata(model, size, dtype).items():
        network.set_rt_info(value, key.split("."))

    def write(staged: Path) -> None:
        openvino.save_model(network, staged, compress_to_fp16=dtype == "fp16")

    return _write_into_place(Path(path), write)


EXECUTORCH_EXTRA = "install the executorch extra: pip install 'sapiens2[executorch]'"
EXECUTORCH_METADATA = "sapiens2_metadata"  # the .pte's constant method holding network_metadata as UTF-8 JSON bytes


def export_executorch(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    input_size: Sequence[int] | None = None,
    dtype: str = "fp32",
    batch: int = 1,
) -> Path:
    """Write ``model`` as an ExecuTorch program (``.pte``) lowered to the XNNPACK delegate, for phones and edge CPUs.

    The ``torch.export`` program of every format, at a fixed ``batch`` (ExecuTorch plans memory statically; the
    runtime splits and pads other batches), with the bf16 RoPE as float32 ops and explicit bf16 rounding as in the
    ONNX export (XNNPACK has no bf16 arithmetic); float32 only. The metadata is the constant method
    ``sapiens2_metadata`` (UTF-8 JSON bytes).

    Example:
        >>> export_executorch(load_model("pose", "0.4b"), "pose.pte", input_size=(256, 192))
        >>> Predictor("pose", model="pose.pte")("photo.jpg")  # the ExecuTorch runtime's Python bindings
    """
    _check_suffix(path, (".pte",), "an ExecuTorch program")
    if dtype != "fp32":
        raise ExportError(f"ExecuTorch export is float32 only, not {dtype!r}")
    if int(batch) < 1:
        raise ExportError(f"batch must be >= 1, got {batch}")
    try:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower
    except ImportError:
        raise ExportError(f"ExecuTorch export needs the 'executorch' package, which is not installed; "
                          f"{EXECUTORCH_EXTRA}") from None  # fmt: skip
    size = tuple(input_size or default_input_size(model))
    program = export_program(model, size, dtype, batch=int(batch))
    if has_bfloat16(program):
        program = emulate_bfloat16(program)
    metadata = json.dumps(network_metadata(model, size, dtype) | {"sapiens2.batch": str(int(batch))})
    constants = {EXECUTORCH_METADATA: torch.tensor(list(metadata.encode()), dtype=torch.uint8)}
    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()], constant_methods=constants)
    buffer = lowered.to_executorch().buffer
    return _write_into_place(Path(path), lambda staged: staged.write_bytes(buffer))


FORMATS = {
    "onnx": export_onnx,
    "pt2": export_pt2,
    "aoti": export_aoti,
    "tensorrt": export_tensorrt,
    "openvino": export_openvino,
    "executorch": export_executorch,
}
"""Network formats of ``sapiens2 export`` (``safetensors`` and ``transformers`` write weights, not networks)."""
