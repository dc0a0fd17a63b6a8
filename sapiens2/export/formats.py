"""Deployable files of a Sapiens2 network: ONNX, torch.export ``.pt2``, AOTInductor package, TensorRT engine,
OpenVINO IR (``.xml`` + ``.bin``), ExecuTorch ``.pte``, LiteRT ``.tflite`` and Core ML ``.mlpackage``.

Every format starts from the same ``export_program`` (dynamic batch, float32 in and out, MODEL.md §4 for what the
official deployment scripts did). Each file carries the task, arch, input size and dtype (ONNX metadata properties,
``.pt2`` extra file ``sapiens2.json``, OpenVINO ``rt_info`` under ``sapiens2``, the ``.pte`` constant method
``sapiens2_metadata``, the ``.tflite`` metadata entry ``sapiens2``, Core ML user-defined metadata), which
``sapiens2.export.runtime`` reads back.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..labels import METADATA_KEY, is_released_set
from ..messages import library_noise_muted
from ..models.task_model import TaskModel
from .bf16 import SPLIT_FACTOR, emulate_bfloat16, has_bfloat16
from .program import INPUT_NAME, ExportError, backbone_of, default_input_size, export_program, output_names

__all__ = [
    "EXTERNAL_DATA_BYTES",
    "FORMATS",
    "METADATA_FILE",
    "MIN_OPSET",
    "OPENVINO_DTYPES",
    "export_aoti",
    "export_coreml",
    "export_executorch",
    "export_litert",
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


def _quiet(export: Callable) -> Callable:
    """``export`` without the exporters' lines that are not the user's concern (``messages.library_noise_muted``)."""

    @functools.wraps(export)
    def quietly(*args: Any, **kwargs: Any) -> Any:
        with library_noise_muted():
            return export(*args, **kwargs)

    return quietly


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
            if made.is_dir() and (path.parent / made.name).is_dir():  # a package folder (.mlpackage) replaced whole
                shutil.rmtree(path.parent / made.name)
            os.replace(made, path.parent / made.name)
    return path


def _weight_bytes(model: nn.Module, dtype: str) -> int:
    itemsize = 4 if dtype == "fp32" else 2
    return sum(tensor.numel() * itemsize for tensor in model.state_dict().values() if tensor.is_floating_point())


@_quiet
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


@_quiet
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


@_quiet
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


@_quiet
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


@_quiet
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


def _fixed_batch_program(
    model: nn.Module, input_size: Sequence[int] | None, dtype: str, batch: int, rounding: str = "cast"
) -> tuple[tuple[int, int], torch.export.ExportedProgram, dict[str, str]]:
    """The input size (H, W); the float32 program at a fixed ``batch`` (for runtimes that plan memory statically:
    ExecuTorch, LiteRT, Core ML), its bf16 RoPE emulated with ``rounding`` (``emulate_bfloat16``); the file's
    metadata (with ``sapiens2.batch``; ``dtype`` is the file's precision)."""
    if int(batch) < 1:
        raise ExportError(f"batch must be >= 1, got {batch}")
    size = tuple(input_size or default_input_size(model))
    program = export_program(model, size, "fp32", batch=int(batch))
    if has_bfloat16(program):
        program = emulate_bfloat16(program, rounding=rounding)
    return size, program, network_metadata(model, size, dtype) | {"sapiens2.batch": str(int(batch))}


EXECUTORCH_EXTRA = "install the executorch extra: pip install 'sapiens2[executorch]'"
EXECUTORCH_METADATA = "sapiens2_metadata"  # the .pte's constant method holding network_metadata as UTF-8 JSON bytes


@_quiet
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
    try:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower
    except ImportError:
        raise ExportError(f"ExecuTorch export needs the 'executorch' package, which is not installed; "
                          f"{EXECUTORCH_EXTRA}") from None  # fmt: skip
    _, program, metadata = _fixed_batch_program(model, input_size, dtype, batch)
    constants = {EXECUTORCH_METADATA: torch.tensor(list(json.dumps(metadata).encode()), dtype=torch.uint8)}
    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()], constant_methods=constants)
    buffer = lowered.to_executorch().buffer
    return _write_into_place(Path(path), lambda staged: staged.write_bytes(buffer))


LITERT_EXTRA = (
    "install the litert extra, in an environment of its own (litert-torch pins packages that other extras need "
    "newer): pip install 'sapiens2[litert]'"
)
LITERT_RUNTIME_EXTRA = "install the litert-runtime extra: pip install 'sapiens2[litert-runtime]'"
LITERT_METADATA = "sapiens2"  # the .tflite metadata entry holding network_metadata as UTF-8 JSON
# LiteRT precisions: float32; float16 weights (expanded when loaded); dynamic-range int8 (int8 weights per output
# channel, activations quantised on the fly around each int8 matmul/convolution).
LITERT_DTYPES = ("fp32", "fp16", "int8")
# The alignment LiteRT wants of weight buffers in a .tflite flatbuffer (its converter's ``force_align: 16``).
TFLITE_BUFFER_ALIGNMENT = 16
FLATBUFFER_BYTES = 2**31 - 2**20  # what one flatbuffer can address, less room for the metadata
# ai-edge-quantizer (0.10.0) quantises a weight over 32 MiB in chunks of rows after flattening it to 2-D, which fails
# for a weight of more than two dimensions ("input operand has more dimensions than allowed by the axis remapping"):
# convolutions with more float32 weight bytes than this are split by output channels before an int8 conversion.
QUANTISER_CHUNKED_BYTES = 32 * 2**20


class _NamedOutputs(nn.Module):
    """A float32 network as LiteRT converts it: the input ``images``, the outputs a dict named as the task's."""

    def __init__(self, network: nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.network = network
        self.names = tuple(names)
        self.training = False  # an exported program's module cannot be switched with .eval(); it is inference-only

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.network(images), strict=True))


def _tflite_with_metadata(flatbuffer: bytes, metadata: dict[str, str]) -> bytes:
    """``flatbuffer`` (a .tflite model) with ``metadata`` added as the metadata entry ``LITERT_METADATA``.

    Repacked through the schema's object API, every weight buffer inside the flatbuffer and 16-byte aligned as the
    converter writes them.
    """
    try:  # both come with litert-torch
        import flatbuffers
        from ai_edge_litert import schema_py_generated as schema
    except ImportError as error:
        raise ExportError(f"LiteRT export needs the '{error.name}' package, which is not installed; "
                          f"{LITERT_EXTRA}") from None  # fmt: skip

    class AlignedBuffer(schema.BufferT):
        def Pack(self, builder):  # noqa: N802 (the schema's method name)
            data = None
            if self.data is not None and len(self.data):
                payload = np.asarray(self.data, dtype=np.uint8).tobytes()
                builder.StartVector(1, len(payload), TFLITE_BUFFER_ALIGNMENT)
                builder.head -= len(payload)
                builder.Bytes[builder.head : builder.head + len(payload)] = payload
                data = builder.EndVector(len(payload))
            schema.BufferStart(builder)
            if data is not None:
                schema.BufferAddData(builder, data)
            schema.BufferAddOffset(builder, self.offset)
            schema.BufferAddSize(builder, self.size)
            return schema.BufferEnd(builder)

    model = schema.ModelT.InitFromPackedBuf(flatbuffer, 0)
    if len(flatbuffer) > FLATBUFFER_BYTES:
        raise ExportError(f"the LiteRT model is {len(flatbuffer) / 2**30:.1f} GB, over the 2 GB one flatbuffer "
                          "holds; export --dtype int8, or a smaller model")  # fmt: skip
    buffers = []
    for buffer in model.buffers or ():
        aligned = AlignedBuffer()
        aligned.data = buffer.data
        if buffer.offset > 1:  # stored past the flatbuffer (as LiteRT's quantizer writes them): moved inside
            aligned.data = np.frombuffer(flatbuffer, dtype=np.uint8, count=buffer.size, offset=buffer.offset)
        buffers.append(aligned)
    payload = AlignedBuffer()
    payload.data = np.frombuffer(json.dumps(metadata).encode(), dtype=np.uint8)
    entry = schema.MetadataT()
    entry.name, entry.buffer = LITERT_METADATA, len(buffers)
    model.buffers = [*buffers, payload]
    model.metadata = [item for item in model.metadata or () if item.name != LITERT_METADATA.encode()] + [entry]
    builder = flatbuffers.Builder(len(flatbuffer) + 4096)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


class _OutputChannelParts(nn.Module):
    """``convolution`` (``nn.Conv2d`` or ``nn.ConvTranspose2d``, one group) as convolutions over consecutive slices of
    its output channels of at most ``channels`` each, their outputs concatenated: the same function, in weights that
    each fit ``QUANTISER_CHUNKED_BYTES``. Per-output-channel int8 scales are those of the whole weight."""

    def __init__(self, convolution: nn.Conv2d | nn.ConvTranspose2d, channels: int) -> None:
        super().__init__()
        transposed = isinstance(convolution, nn.ConvTranspose2d)
        options = {name: getattr(convolution, name) for name in ("kernel_size", "stride", "padding", "dilation",
                                                                 "padding_mode")}  # fmt: skip
        if transposed:
            options["output_padding"] = convolution.output_padding
        weight = convolution.weight.detach()
        bias = None if convolution.bias is None else convolution.bias.detach()
        self.parts = nn.ModuleList()
        for start in range(0, convolution.out_channels, channels):
            stop = min(start + channels, convolution.out_channels)
            part = type(convolution)(convolution.in_channels, stop - start, bias=bias is not None, **options,
                                     device=weight.device, dtype=weight.dtype)  # fmt: skip
            with torch.no_grad():
                part.weight.copy_(weight[:, start:stop] if transposed else weight[start:stop])
                if bias is not None:
                    part.bias.copy_(bias[start:stop])
            self.parts.append(part)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=1)


@contextlib.contextmanager
def _quantisable_convolutions(model: nn.Module) -> Iterator[None]:
    """While in the block, ``model``'s convolutions with more than ``QUANTISER_CHUNKED_BYTES`` of float32 weights
    (the 0.1b pose head's 12.6 M-value deconvolution, the normal head's 21 M-value convolution) are
    ``_OutputChannelParts`` that ai-edge-quantizer can quantise; put back after it."""
    large = [
        (name, module) for name, module in model.named_modules()
        if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)) and module.groups == 1
        and module.weight.numel() * 4 > QUANTISER_CHUNKED_BYTES
    ]  # fmt: skip
    swapped = []
    try:
        for name, convolution in large:
            parent, _, child = name.rpartition(".")
            channel_bytes = convolution.weight.numel() // convolution.out_channels * 4
            parts = _OutputChannelParts(convolution, max(1, QUANTISER_CHUNKED_BYTES // channel_bytes))
            setattr(model.get_submodule(parent), child, parts)
            swapped.append((parent, child, convolution))
        yield
    finally:
        for parent, child, convolution in swapped:
            setattr(model.get_submodule(parent), child, convolution)


@_quiet
def export_litert(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    input_size: Sequence[int] | None = None,
    dtype: str = "fp32",
    batch: int = 1,
) -> Path:
    """Write ``model`` as a LiteRT (TensorFlow Lite) flatbuffer (``.tflite``) through litert-torch, for phones.

    The ``torch.export`` program of every format at a fixed ``batch`` (the runtime splits and pads other batches),
    with the bf16 RoPE rounded by Veltkamp's splitting in float32 (``emulate_bfloat16(rounding="split")``: LiteRT has
    no bfloat16 type, not even for a constant). One signature ``serving_default``: input ``images``, the outputs by
    the task's names (``OUTPUT_NAMES``). The metadata is the flatbuffer metadata entry ``sapiens2`` (UTF-8 JSON).

    - ``fp32``: the reference numerics;
    - ``fp16``: float16 weights, expanded to float32 when loaded;
    - ``int8``: dynamic-range int8 (int8 weights per output channel, activations quantised on the fly), every
      weight of every task: litert-torch's ``full_dynamic_recipe`` (ai-edge-quantizer), after splitting each
      convolution whose float32 weight is over 32 MiB (the 0.1b pose and normal heads' largest) by output channels
      into convolutions that are not (ai-edge-quantizer 0.10.0 fails on such a weight; ``_OutputChannelParts``).

    Needs litert-torch (``pip install 'sapiens2[litert]'``, best in an environment of its own); running the file
    needs only ai-edge-litert.

    Example:
        >>> export_litert(load_model("pose", "0.4b"), "pose.tflite", input_size=(256, 192))
        >>> Predictor("pose", model="pose.tflite")("photo.jpg")  # the LiteRT interpreter, XNNPACK on the CPU
    """
    _check_suffix(path, (".tflite",), "a LiteRT model")
    if dtype not in LITERT_DTYPES:
        raise ExportError(f"LiteRT export is {', '.join(LITERT_DTYPES)}, not {dtype!r}")
    try:
        import litert_torch
        from litert_torch.generative.quantize import quant_recipes
    except ImportError as error:
        raise ExportError(f"LiteRT export needs the 'litert-torch' package, which is not installed"
                          f"{'' if error.name and error.name.startswith('litert') else f' ({error})'}; "
                          f"{LITERT_EXTRA}") from None  # fmt: skip
    with _quantisable_convolutions(model) if dtype == "int8" else contextlib.nullcontext():
        size, program, metadata = _fixed_batch_program(model, input_size, dtype, batch, rounding="split")
    recipes = {"fp16": quant_recipes.full_fp16_recipe, "int8": quant_recipes.full_dynamic_recipe}
    example = torch.zeros(int(batch), 3, *size)
    try:
        converted = litert_torch.convert(
            _NamedOutputs(program.module(), output_names(model)),
            sample_kwargs={INPUT_NAME: example},  # a keyword argument names the signature's input
            quant_config=recipes[dtype]() if dtype in recipes else None,
        )
    except ValueError as error:  # a weight ai-edge-quantizer refuses that _quantisable_convolutions does not foresee
        if dtype == "fp32" or "quantization" not in str(error):
            raise
        reason = str(error).strip().splitlines()[0]
        raise ExportError(f"LiteRT's quantiser (ai-edge-quantizer) cannot make this network {dtype}: {reason}; "
                          "export --dtype fp16 or fp32") from None  # fmt: skip
    flatbuffer = _tflite_with_metadata(converted.model_content(), metadata)
    return _write_into_place(Path(path), lambda staged: staged.write_bytes(flatbuffer))


COREML_EXTRA = "install the coreml extra: pip install 'sapiens2[coreml]'"
# Core ML ML Program precisions: float32; float16 compute (weights and activations; the bf16 RoPE rounding stays
# float32); int8 weights (linear, symmetric, per output channel) with float32 compute.
COREML_DTYPES = ("fp32", "fp16", "int8")


def _is_bf16_split(op: Any) -> bool:
    """Whether a MIL op is part of the bf16 rounding by Veltkamp's splitting (``emulate_bfloat16(rounding="split")``):
    the product by ``SPLIT_FACTOR`` or one of the two differences reading it. It must compute in float32: in
    float16 the factor overflows."""

    def is_scaled(var: Any) -> bool:
        producer = var.op
        if producer is None or producer.op_type != "mul":
            return False
        return any(
            operand is not None and operand.val is not None and float(np.asarray(operand.val).max()) == SPLIT_FACTOR
            and float(np.asarray(operand.val).min()) == SPLIT_FACTOR
            for operand in (producer.inputs.get("x"), producer.inputs.get("y"))
        )  # fmt: skip

    if op.op_type == "mul":
        return is_scaled(op.outputs[0])
    return op.op_type == "sub" and is_scaled(op.inputs["x"])


@_quiet
def export_coreml(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    input_size: Sequence[int] | None = None,
    dtype: str = "fp32",
    batch: int = 1,
) -> Path:
    """Write ``model`` as a Core ML ML Program (``.mlpackage``, a folder) through coremltools, for Apple devices.

    The ``torch.export`` program of every format at a fixed ``batch``, with the bf16 RoPE rounded by Veltkamp's
    splitting in float32 (Core ML has no bfloat16 type). Input ``images`` (batch, 3, H, W) float32, outputs by the
    task's names (``OUTPUT_NAMES``) float32; the metadata in the model's user-defined metadata (``sapiens2.*``).

    - ``fp32``: float32 weights and compute, the reference numerics;
    - ``fp16``: float16 weights and compute (the GPU and Neural Engine compute in float16), except the bf16
      rounding ops, which stay float32;
    - ``int8``: weights quantised to int8 (linear, symmetric, per output channel), float32 compute.

    Converting works on any OS; running the file takes macOS (``Predictor`` says so elsewhere).

    Example:
        >>> export_coreml(load_model("seg", "0.4b"), "seg.mlpackage", input_size=(512, 384), dtype="fp16")
        >>> Predictor("seg", model="seg.mlpackage")("photo.jpg")  # on macOS
    """
    _check_suffix(path, (".mlpackage",), "a Core ML ML Program")
    if dtype not in COREML_DTYPES:
        raise ExportError(f"Core ML export is {', '.join(COREML_DTYPES)}, not {dtype!r}")
    try:
        import coremltools
        from coremltools.optimize import coreml as optimize
    except ImportError:
        raise ExportError(f"Core ML export needs the 'coremltools' package, which is not installed; "
                          f"{COREML_EXTRA}") from None  # fmt: skip
    size, program, metadata = _fixed_batch_program(model, input_size, dtype, batch, rounding="split")
    program = program.run_decompositions({})  # coremltools converts the ATen dialect
    precision = (
        coremltools.transform.FP16ComputePrecision(op_selector=lambda op: not _is_bf16_split(op))
        if dtype == "fp16"
        else coremltools.precision.FLOAT32
    )
    names = output_names(model)
    converted = coremltools.convert(
        program,
        inputs=[coremltools.TensorType(name=INPUT_NAME, shape=(int(batch), 3, *size), dtype=np.float32)],
        outputs=[coremltools.TensorType(name=name, dtype=np.float32) for name in names],
        convert_to="mlprogram",
        compute_precision=precision,
        minimum_deployment_target=coremltools.target.iOS17,
    )
    if dtype == "int8":
        config = optimize.OptimizationConfig(global_config=optimize.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int8", granularity="per_channel"))  # fmt: skip
        converted = optimize.linear_quantize_weights(converted, config=config)
    converted.user_defined_metadata.update(metadata)
    converted.short_description = f"Sapiens2 {metadata['sapiens2.task']} ({metadata['sapiens2.arch']}), {dtype}"
    return _write_into_place(Path(path), lambda staged: converted.save(str(staged)))


FORMATS = {
    "onnx": export_onnx,
    "pt2": export_pt2,
    "aoti": export_aoti,
    "tensorrt": export_tensorrt,
    "openvino": export_openvino,
    "executorch": export_executorch,
    "litert": export_litert,
    "coreml": export_coreml,
}
"""Network formats of ``sapiens2 export`` (``safetensors`` and ``transformers`` write weights, not networks)."""
