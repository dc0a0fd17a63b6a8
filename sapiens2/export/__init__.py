"""Deployment: Sapiens2 networks as ONNX, torch.export ``.pt2``, AOTInductor, TensorRT, OpenVINO IR, ExecuTorch,
LiteRT and Core ML files, runtimes that run them under ``Predictor``, and the parity figures of an export against
PyTorch on an image.

>>> from sapiens2.export import export_onnx
>>> export_onnx(load_model("seg", "1b"), "seg.onnx")  # then Predictor("seg", model="seg.onnx")
"""

from .bf16 import emulate_bfloat16
from .formats import (
    COREML_DTYPES,
    FORMATS,
    LITERT_DTYPES,
    OPENVINO_DTYPES,
    export_aoti,
    export_coreml,
    export_executorch,
    export_litert,
    export_onnx,
    export_openvino,
    export_pt2,
    export_tensorrt,
    tensorrt_problem,
)
from .program import EXPORT_DTYPES, OUTPUT_NAMES, ExportError, default_input_size, export_program
from .runtime import (
    CoreMLNetwork,
    ExecuTorchNetwork,
    LiteRtNetwork,
    NetworkFileError,
    OnnxNetwork,
    OpenVinoNetwork,
    Pt2Network,
    is_network_file,
    load_network,
)

__all__ = [
    "COREML_DTYPES",
    "EXPORT_DTYPES",
    "FORMATS",
    "LITERT_DTYPES",
    "OPENVINO_DTYPES",
    "OUTPUT_NAMES",
    "CoreMLNetwork",
    "ExecuTorchNetwork",
    "ExportError",
    "NetworkFileError",
    "OnnxNetwork",
    "OpenVinoNetwork",
    "Pt2Network",
    "default_input_size",
    "emulate_bfloat16",
    "export_aoti",
    "export_coreml",
    "export_executorch",
    "export_litert",
    "export_onnx",
    "export_openvino",
    "export_program",
    "export_pt2",
    "export_tensorrt",
    "is_network_file",
    "LiteRtNetwork",
    "load_network",
    "tensorrt_problem",
]
