"""Exported networks as callables for ``Predictor``: an ONNX file through onnxruntime, a ``.pt2`` through torch, an
OpenVINO IR ``.xml`` through OpenVINO's CPU plugin, an ExecuTorch ``.pte`` through ExecuTorch's runtime, a LiteRT
``.tflite`` through the LiteRT interpreter, a Core ML ``.mlpackage`` through Core ML (macOS only).

Each adapter maps float32 images (B, 3, H, W) to the network's raw outputs as float32 tensors on the images' device
(one tensor, or a tuple for pointmap), and tells its ``task`` and fixed ``input_size`` read from the file. The
sapiens2 model code is not involved, so the pre/post-processing of ``Predictor`` runs unchanged on top. onnxruntime,
OpenVINO, ExecuTorch, LiteRT and coremltools are imported only when a file of theirs is opened.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..labels import METADATA_KEY, LabelSet, label_set_from_json
from ..messages import library_noise_muted
from .formats import (
    COREML_EXTRA,
    EXECUTORCH_EXTRA,
    EXECUTORCH_METADATA,
    EXPORT_EXTRA,
    LITERT_METADATA,
    LITERT_RUNTIME_EXTRA,
    METADATA_FILE,
    OPENVINO_EXTRA,
)
from .program import OUTPUT_NAMES

__all__ = [
    "NETWORK_SUFFIXES",
    "InputSizeError",
    "CoreMLNetwork",
    "ExecuTorchNetwork",
    "LiteRtNetwork",
    "NetworkFileError",
    "OnnxNetwork",
    "OpenVinoNetwork",
    "Pt2Network",
    "is_network_file",
    "load_network",
]

# onnxruntime execution providers in order of preference, when installed and usable.
PREFERRED_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


class NetworkFileError(ValueError):
    """An exported network file that cannot be used: the message names the file and the problem."""


class InputSizeError(ValueError):
    """An input size other than the one an exported network was built for."""


def is_network_file(source: Any) -> bool:
    """Whether ``source`` names an exported network (``.onnx``, ``.pt2``, ``.xml``, ``.pte``, ``.tflite``,
    ``.mlpackage``) rather than weights."""
    return isinstance(source, (str, os.PathLike)) and Path(source).suffix.lower() in NETWORK_SUFFIXES


def _first_line(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _existing_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.is_file():
        raise NetworkFileError(f"{path}: no such file")
    return path


def _parse_size(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    height, _, width = text.partition("x")
    return int(height), int(width)


def network_labels(text: str | None, path: Path) -> LabelSet | None:
    """The label set an exported file carries (``network_metadata``); None when it carries none."""
    if text is None:
        return None
    try:
        return label_set_from_json(text, f"{path}: metadata 'sapiens2.{METADATA_KEY}'")
    except ValueError as error:
        raise NetworkFileError(str(error)) from None


class _Network:
    """Shared checks and fields of the adapters."""

    path: Path
    task: str | None
    input_size: tuple[int, int]
    dtype: str
    output_names: tuple[str, ...]
    labels: LabelSet | None = None  # a label set of its own (sapiens2.labels), None: the task's released one

    def _check_task(self, task: str | None) -> None:
        if task is None:
            return
        if self.task is not None and self.task != task:
            raise NetworkFileError(f"{self.path} holds a '{self.task}' network, not '{task}'")
        expected = len(OUTPUT_NAMES[task]) if task in OUTPUT_NAMES else None
        if expected is not None and len(self.output_names) != expected:
            raise NetworkFileError(
                f"{self.path} has {len(self.output_names)} outputs ({', '.join(self.output_names)}); a '{task}' "
                f"network has {expected} ({', '.join(OUTPUT_NAMES[task])})"
            )

    @staticmethod
    def _pack(outputs: Sequence[torch.Tensor]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _read_metadata(self, metadata: dict[str, str]) -> None:
        """The fields of ``network_metadata`` (and ``sapiens2.batch`` of fixed-batch programs); an input size
        found in the file before is kept when the metadata has none."""
        self.task = metadata.get("sapiens2.task")
        self.dtype = metadata.get("sapiens2.dtype", "fp32")
        self.labels = network_labels(metadata.get(f"sapiens2.{METADATA_KEY}"), self.path)
        self.output_names = tuple(filter(None, metadata.get("sapiens2.outputs", "").split(",")))
        self.input_size = _parse_size(metadata.get("sapiens2.input_size")) or getattr(self, "input_size", (0, 0))
        self.batch = int(metadata.get("sapiens2.batch", "1"))

    def _in_batches(self, images: torch.Tensor, run) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Run a fixed-batch program (``self.batch``) on any batch: in chunks of it, the last one padded with zero
        images (each image is computed on its own). ``run`` maps a float32 chunk to a sequence of output tensors."""
        x = images.detach().to("cpu", torch.float32).contiguous()
        chunks = []
        for start in range(0, len(x), self.batch):
            chunk = x[start : start + self.batch]
            count = len(chunk)
            if count < self.batch:
                chunk = torch.cat([chunk, chunk.new_zeros(self.batch - count, *chunk.shape[1:])])
            chunks.append([torch.as_tensor(output)[:count].clone() for output in run(chunk)])
        return self._pack([torch.cat(parts).to(images.device) for parts in zip(*chunks, strict=True)])

    def __repr__(self) -> str:
        size = f"{self.input_size[0]}x{self.input_size[1]}"
        return f"{type(self).__name__}({str(self.path)!r}, task={self.task!r}, input_size={size}, dtype={self.dtype})"


class OnnxNetwork(_Network):
    """An ONNX export run by onnxruntime (TensorRT, CUDA or CPU execution provider, the first one available).

    Args:
        path: the ``.onnx`` file (its ``.data`` file, if any, beside it).
        task: when given, the file must hold a network of this task.
        providers: onnxruntime execution providers to use, in order; default ``PREFERRED_PROVIDERS`` that exist.

    Raises:
        NetworkFileError: a missing, corrupt or non-sapiens2 file, another task's network, or no onnxruntime.
    """

    def __init__(self, path: str | os.PathLike, task: str | None = None, providers: Sequence[str] | None = None):
        self.path = _existing_file(path)
        try:
            import onnxruntime
        except ImportError:
            raise NetworkFileError(f"{self.path}: running an ONNX file needs onnxruntime; {EXPORT_EXTRA}") from None
        available = onnxruntime.get_available_providers()
        self.providers = list(providers) if providers else [p for p in PREFERRED_PROVIDERS if p in available]
        options = onnxruntime.SessionOptions()
        # As many threads as torch uses, and no spin-waiting after a run: the pre/post-processing (and, in a
        # benchmark, PyTorch) runs on the same cores right after, and spinning threads would steal them.
        options.intra_op_num_threads = torch.get_num_threads()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = onnxruntime.InferenceSession(str(self.path), options, providers=self.providers)
        except Exception as error:  # onnxruntime raises its own exception types for every kind of bad file
            hint = ""
            if "NOT_IMPLEMENTED" in str(error):
                hint = " (a bf16 export needs a GPU provider; export fp32 or fp16 to run on the CPU)"
            raise NetworkFileError(f"{self.path}: not a usable ONNX model: {_first_line(error)}{hint}") from None
        inputs = self.session.get_inputs()
        shape = inputs[0].shape if len(inputs) == 1 else None
        if (
            shape is None
            or len(shape) != 4
            or shape[1] != 3
            or not all(isinstance(side, int) for side in shape[2:])
            or inputs[0].type != "tensor(float)"
        ):
            found = ", ".join(f"{item.name} {item.type} {item.shape}" for item in inputs)
            raise NetworkFileError(
                f"{self.path}: expected one float32 input (batch, 3, H, W) as sapiens2 exports have, found: {found}"
            )
        self.input_name = inputs[0].name
        self.input_size = (int(shape[2]), int(shape[3]))
        metadata = self.session.get_modelmeta().custom_metadata_map
        self.task = metadata.get("sapiens2.task")
        self.dtype = metadata.get("sapiens2.dtype", "fp32")
        self.labels = network_labels(metadata.get(f"sapiens2.{METADATA_KEY}"), self.path)
        self.output_names = tuple(output.name for output in self.session.get_outputs())
        self._check_task(task)

    def __call__(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        array = images.detach().to("cpu", torch.float32).contiguous().numpy()
        outputs = self.session.run(None, {self.input_name: array})
        return self._pack([torch.from_numpy(output).to(images.device) for output in outputs])


def _is_aoti_package(path: Path) -> bool:
    with zipfile.ZipFile(path) as archive:
        return any("/data/aotinductor/" in name for name in archive.namelist())


class Pt2Network(_Network):
    """A ``torch.export`` archive (``export_pt2``) or an AOTInductor package (``export_aoti``), run by torch alone.

    Runs on the CPU (an exported program keeps the device it was traced on); outputs come back on the images'
    device.

    Raises:
        NetworkFileError: a missing or unreadable file, or another task's network.
    """

    def __init__(self, path: str | os.PathLike, task: str | None = None):
        self.path = _existing_file(path)
        try:
            if _is_aoti_package(self.path):
                self._load_aoti()
            else:
                self._load_program()
        except (zipfile.BadZipFile, RuntimeError, ValueError, KeyError, OSError) as error:
            raise NetworkFileError(f"{self.path}: not a usable .pt2 archive: {_first_line(error)}") from None
        self._check_task(task)

    def _load_program(self) -> None:
        extra = {METADATA_FILE: ""}
        program = torch.export.load(self.path, extra_files=extra)
        self.runner = program.module()
        user_input = next(node for node in program.graph.nodes if node.op == "placeholder" and node.users and
                          node.name in program.graph_signature.user_inputs)  # fmt: skip
        shape = user_input.meta["val"].shape
        self.input_size = (int(shape[2]), int(shape[3]))
        self._read_metadata(json.loads(extra[METADATA_FILE] or "{}"))
        if not self.output_names:
            self.output_names = tuple(str(spec.arg.name) for spec in program.graph_signature.output_specs)

    def _load_aoti(self) -> None:
        self.runner = torch._inductor.aoti_load_package(str(self.path))
        metadata = dict(self.runner.get_metadata())
        self.input_size = (0, 0)
        self._read_metadata(metadata)
        if "sapiens2.input_size" not in metadata:
            raise ValueError("the package records no sapiens2 input size (not made by sapiens2 export)")

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        outputs = self.runner(images.detach().to("cpu", torch.float32).contiguous())
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        return self._pack([output.to(images.device) for output in outputs])


class OpenVinoNetwork(_Network):
    """An OpenVINO IR export (``export_openvino``: ``.xml`` and its ``.bin``) compiled for OpenVINO's CPU plugin.

    The plugin computes in float32 (``INFERENCE_PRECISION_HINT``; by default it would pick bf16 on CPUs that have
    it, ~20x outside the parity tiers) with as many threads as torch uses; fp16 and int8 weights are expanded when
    compiled. The network is compiled for a static batch (``_compile`` says why): the largest batch seen so far.
    Outputs come back on the images' device.

    Raises:
        NetworkFileError: a missing or unreadable file or ``.bin``, not an image network, another task's network,
            or no openvino.
    """

    def __init__(self, path: str | os.PathLike, task: str | None = None):
        self.path = _existing_file(path)
        try:
            import openvino
        except ImportError:
            raise NetworkFileError(
                f"{self.path}: running an OpenVINO IR file needs openvino; {OPENVINO_EXTRA}"
            ) from None
        core = openvino.Core()
        try:
            network = core.read_model(str(self.path))
        except Exception as error:  # OpenVINO raises RuntimeError subclasses of its own for every kind of bad file
            raise NetworkFileError(f"{self.path}: not a usable OpenVINO IR model: {_first_line(error)}") from None
        inputs = network.inputs
        shape = inputs[0].get_partial_shape() if len(inputs) == 1 else None
        if (
            shape is None
            or shape.rank.is_dynamic
            or len(shape) != 4
            or not all(side.is_static for side in list(shape)[1:])
            or shape[1].get_length() != 3
            or inputs[0].get_element_type() != openvino.Type.f32
        ):
            found = ", ".join(f"{item.get_any_name()} {item.get_element_type()} {item.get_partial_shape()}"
                              for item in inputs)  # fmt: skip
            raise NetworkFileError(
                f"{self.path}: expected one float32 input (batch, 3, H, W) as sapiens2 exports have, found: {found}"
            )
        self.input_size = (shape[2].get_length(), shape[3].get_length())
        metadata = self._metadata(network)
        self.task = metadata.get("task")
        self.dtype = metadata.get("dtype", "fp32")
        self.labels = network_labels(metadata.get(METADATA_KEY), self.path)
        self.output_names = tuple(output.get_any_name() for output in network.outputs)
        self._check_task(task)
        self._core, self._network = core, network
        self._config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": torch.get_num_threads()}
        self._compile(1)

    def _compile(self, batch: int) -> None:
        """Compile the network for a static ``batch``, replacing the one compiled before.

        Static, because on a dynamic batch the CPU plugin runs the bf16 rounding of the RoPE recipe (``Convert``
        to bf16 and back) as stand-alone nodes that do not round to nearest even (OpenVINO 2026.4: about a fifth of
        the values land on the other bf16 neighbour, which put the fixture backbone 2.3x outside its tier, nearly
        as far as a float32 RoPE); with static shapes they are fused into its generated kernels, which round exactly.
        """
        self._network.reshape([batch, 3, *self.input_size])
        try:
            self.compiled = self._core.compile_model(self._network, "CPU", self._config)
        except Exception as error:
            raise NetworkFileError(f"{self.path}: OpenVINO cannot compile it: {_first_line(error)}") from None
        self.batch = batch

    @staticmethod
    def _metadata(network: Any) -> dict[str, str]:
        """The ``sapiens2.*`` fields ``export_openvino`` wrote into the model's ``rt_info``, without the prefix."""
        if not network.has_rt_info(["sapiens2"]):
            return {}
        fields = network.get_rt_info(["sapiens2"]).astype(dict)
        return {name: value.astype(str) for name, value in fields.items()}

    def __call__(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Run a batch: compiled anew for a batch larger than any before, a smaller one padded with zero images
        (each image is computed on its own: the padding changes no result, and one compiled network is kept)."""
        array = images.detach().to("cpu", torch.float32).contiguous().numpy()
        count = len(array)
        if count > self.batch:
            self._compile(count)
        if count < self.batch:
            array = np.concatenate([array, np.zeros((self.batch - count, *array.shape[1:]), np.float32)])
        results = self.compiled(array)
        return self._pack(
            [torch.from_numpy(results[output][:count].copy()).to(images.device) for output in self.compiled.outputs]
        )


class ExecuTorchNetwork(_Network):
    """An ExecuTorch program (``export_executorch``: ``.pte``, XNNPACK delegate) run by ExecuTorch's Python runtime.

    The program has a fixed batch: a batch is run in chunks of it, the last one padded with zero images (each
    image is computed on its own). Outputs come back on the images' device.

    Raises:
        NetworkFileError: a missing or unreadable file, one without sapiens2 metadata, another task's network, or
            no executorch.
    """

    def __init__(self, path: str | os.PathLike, task: str | None = None):
        self.path = _existing_file(path)
        try:
            with library_noise_muted():  # its import brings torchao's
                from executorch.runtime import Runtime
        except ImportError:
            raise NetworkFileError(
                f"{self.path}: running an ExecuTorch program needs executorch; {EXECUTORCH_EXTRA}"
            ) from None
        try:
            program = Runtime.get().load_program(self.path)
            if EXECUTORCH_METADATA not in program.method_names:
                raise ValueError("it holds no sapiens2 metadata (not made by sapiens2 export)")
            [raw] = program.load_method(EXECUTORCH_METADATA).execute([])
            metadata = json.loads(bytes(raw.tolist()).decode())
            with _native_lines_dropped(_CPUINFO_LINE):
                self.method = program.load_method("forward")
        except Exception as error:  # the runtime raises RuntimeError for any bad file, without naming it
            raise NetworkFileError(f"{self.path}: not a usable ExecuTorch program: {_first_line(error)}") from None
        self._read_metadata(metadata)
        self._check_task(task)

    def __call__(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return self._in_batches(images, lambda chunk: self.method.execute([chunk]))


# The XNNPACK delegate's first load in a process reports, from C++ and on stderr, each ARM CPU file it looks for.
_CPUINFO_LINE = b"[cpuinfo_utils.cpp:"


@contextmanager
def _native_lines_dropped(prefix: bytes) -> Iterator[None]:
    """Within: what native code writes on stderr (file descriptor 2) is held, then written out but for the lines
    that start with ``prefix``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True) if not line.startswith(prefix)]
            if kept:
                os.write(2, b"".join(kept))


def _tflite_metadata(path: Path, schema: Any) -> dict[str, str]:
    """The ``sapiens2`` metadata entry of a .tflite file (``export_litert``), read through LiteRT's flatbuffer
    ``schema`` module without loading the weights; empty when the file has none."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if not schema.Model.ModelBufferHasIdentifier(data, 0):
            raise ValueError("not a LiteRT flatbuffer (no TFL3 identifier)")
        model = schema.Model.GetRootAs(data, 0)
        for index in range(model.MetadataLength()):
            entry = model.Metadata(index)
            if entry.Name() == LITERT_METADATA.encode():
                return json.loads(model.Buffers(entry.Buffer()).DataAsNumpy().tobytes().decode())
    return {}


class LiteRtNetwork(_Network):
    """A LiteRT model (``export_litert``: ``.tflite``) run by the LiteRT interpreter (XNNPACK on the CPU) with as
    many threads as torch uses.

    The model has a fixed batch: a batch is run in chunks of it, the last one padded with zero images. Outputs come
    back on the images' device.

    Raises:
        NetworkFileError: a missing or unreadable file, one without sapiens2 metadata, another task's network, or
            no ai-edge-litert.
    """

    def __init__(self, path: str | os.PathLike, task: str | None = None):
        self.path = _existing_file(path)
        try:
            from ai_edge_litert import schema_py_generated as schema
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            raise NetworkFileError(
                f"{self.path}: running a LiteRT model needs ai-edge-litert; {LITERT_RUNTIME_EXTRA}"
            ) from None
        try:
            metadata = _tflite_metadata(self.path, schema)
            if not metadata:
                raise ValueError("it holds no sapiens2 metadata (not made by sapiens2 export)")
            interpreter = Interpreter(model_path=str(self.path), num_threads=torch.get_num_threads())
            [signature] = interpreter.get_signature_list().values()
            [self.input_name] = signature["inputs"]
            self.runner = interpreter.get_signature_runner()
        except Exception as error:  # the interpreter raises ValueError/RuntimeError for any bad file
            raise NetworkFileError(f"{self.path}: not a usable LiteRT model: {_first_line(error)}") from None
        self._read_metadata(metadata)
        self._check_task(task)

    def __call__(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        def run(chunk: torch.Tensor) -> list[np.ndarray]:
            outputs = self.runner(**{self.input_name: chunk.numpy()})
            return [outputs[name] for name in self.output_names]

        return self._in_batches(images, run)


class CoreMLNetwork(_Network):
    """A Core ML ML Program (``export_coreml``: ``.mlpackage``) run by Core ML through coremltools, on macOS only.

    Core ML picks the compute units (CPU, GPU, Neural Engine) itself. The model has a fixed batch: a batch is run in
    chunks of it, the last one padded with zero images. Outputs come back on the images' device. Elsewhere opening
    one is a ``NetworkFileError`` saying so (coremltools converts and reads the spec on any OS, but runs models
    only on macOS). Untested here: the project's machines run Linux.

    Raises:
        NetworkFileError: a missing or unreadable package, another task's network, no coremltools, not macOS.
    """

    def __init__(self, path: str | os.PathLike, task: str | None = None):
        self.path = Path(path)
        if not self.path.is_dir():
            raise NetworkFileError(f"{self.path}: no such Core ML package (a .mlpackage folder)")
        if sys.platform != "darwin":
            raise NetworkFileError(f"{self.path}: Core ML runs only on macOS (this is {sys.platform}); run a .tflite, "
                                   ".pte, .xml or .onnx export here")  # fmt: skip
        try:
            import coremltools
        except ImportError:
            raise NetworkFileError(f"{self.path}: running a Core ML model needs coremltools; {COREML_EXTRA}") from None
        try:
            self.model = coremltools.models.MLModel(str(self.path))
        except Exception as error:  # coremltools raises its own and Core ML's errors for any bad package
            raise NetworkFileError(f"{self.path}: not a usable Core ML model: {_first_line(error)}") from None
        self._read_metadata(dict(self.model.user_defined_metadata))
        self._check_task(task)

    def __call__(self, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        def run(chunk: torch.Tensor) -> list[np.ndarray]:
            outputs = self.model.predict({"images": chunk.numpy()})
            return [np.asarray(outputs[name], dtype=np.float32) for name in self.output_names]

        return self._in_batches(images, run)


# Exported network files by suffix, and the runtime each opens with.
RUNTIMES = {
    ".onnx": OnnxNetwork,
    ".pt2": Pt2Network,
    ".xml": OpenVinoNetwork,
    ".pte": ExecuTorchNetwork,
    ".tflite": LiteRtNetwork,
    ".mlpackage": CoreMLNetwork,
}
NETWORK_SUFFIXES = tuple(RUNTIMES)


def load_network(path: str | os.PathLike, task: str | None = None) -> Any:
    """Open an exported network file by its suffix (``.onnx``: onnxruntime; ``.pt2``: torch; ``.xml``: OpenVINO;
    ``.pte``: ExecuTorch; ``.tflite``: LiteRT; ``.mlpackage``: Core ML, macOS only), checked for ``task``.

    Example:
        >>> network = load_network("seg.onnx", "seg")
        >>> logits = network(images)  # (B, 29, H, W) float32
    """
    runtime = RUNTIMES.get(Path(path).suffix.lower())
    if runtime is None:
        raise NetworkFileError(f"{path}: not an exported network (expected a {' or '.join(NETWORK_SUFFIXES)} file)")
    return runtime(path, task)
