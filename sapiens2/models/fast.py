"""The fast mode of a Sapiens2 network: the same weights, rearranged for speed, in place (issue #11).

``make_fast(model)`` turns a loaded backbone or task model into its fast form:

- one fused ``wqkv`` projection per attention instead of ``wq``/``wk``/``wv`` (the state dict keeps the official
  keys: ``state_dict`` splits the fused tensors, ``load_state_dict`` joins them); GQA runs inside SDPA without
  repeated K/V (``enable_gqa``); the FFN's gate/up projection ``w12`` is fused in the official layout already;
- RoPE sin/cos tables cached per token grid (``RopePositionEmbedding.cache_tables``);
- on CPU, glibc's allocator keeps freed blocks up to 32 MiB in the heap instead of unmapping them
  (``keep_freed_host_memory``): otherwise a process that runs another network in between (or frees a large
  buffer) page-faults ~0.4 GB back in per 0.1b forward;
- on CPU (``pack_linears``), every linear layer of the blocks runs through oneDNN with its weight reordered once
  into oneDNN's blocked layout (``PackedLinear``), in the model's dtype where this CPU's oneDNN packs it, else (bf16
  or fp16 on an AVX2-only CPU) in float32 with the activations converted: ``choose_linear_path`` picks the path;
- in the precision this device computes fastest when none is asked for (``fast_precision``): bf16 on CUDA GPUs
  that have it and on CPUs that compute bf16 natively (AVX-512 BF16 or AMX-BF16), float32 on other CPUs (issue #38);
- on CUDA with Triton installed (``fused_kernels``, issue #25), q/k-norm + RoPE, SiLU(gate) * up and LayerScale +
  residual run as fused ops (``layers/fused.py``: Triton kernels on CUDA, the reference torch ops elsewhere), in
  eager and compiled forwards alike.

The fast mode keeps the model's numerics recipe (bf16 RoPE, op order of each block) and moves results only in the
last bits of float32 (different GEMM shapes and kernels); ``tests/test_fast_agreement.py`` bounds the movement on the
parity fixtures. The reference mode is the model as loaded: nothing here runs unless asked.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..memory import keep_freed_host_memory
from .layers import Attention, RopePositionEmbedding, SwiGLUFFN, TransformerBlock
from .layers.fused import triton_available

__all__ = [
    "BATCH_BUCKETS",
    "LINEAR_PATHS",
    "FUSED_KERNELS_ON_CUDA",
    "CompiledBuckets",
    "PackedLinear",
    "Precision",
    "attention_backends",
    "choose_linear_path",
    "fast_precision",
    "fused_kernels_supported",
    "is_fast",
    "linear_path_of",
    "make_fast",
    "onednn_linear_available",
    "onednn_packs",
]

logger = logging.getLogger(__name__)


def onednn_linear_available() -> bool:
    """True when this torch build has oneDNN (``mkldnn``) with the prepacked linear ops used by ``PackedLinear``."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (
        torch.backends.mkldnn.is_available()
        and ops is not None
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    )


LINEAR_PATHS = {
    "onednn": "oneDNN, weights packed in the model's dtype",
    "onednn-fp32": "oneDNN, weights packed in float32, bf16/fp16 activations converted in and out",
    "plain": "F.linear (MKL or ATen)",
}
"""How the blocks' linear layers run on a CPU in fast mode (``choose_linear_path``, ``make_fast(pack_linears=...)``)."""


@functools.cache
def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs and multiplies ``dtype`` weights on this CPU, found by packing a tiny weight once.

    float32 packs wherever oneDNN is built in; bf16 needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT, fp16 AVX512-FP16
    or AVX-NE-CONVERT: on a CPU with AVX2 only (AMD Zen 3, most laptops) PyTorch refuses to pack either. The probe
    asks the very call ``PackedLinear`` makes, so it agrees with it whatever limits the CPU, the torch build or
    ``ONEDNN_MAX_CPU_ISA`` set.
    """
    if not onednn_linear_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), 8)
    except RuntimeError:
        return False
    return True


def choose_linear_path(dtype: torch.dtype, *, native: bool | None = None) -> str:
    """The fastest way (a key of ``LINEAR_PATHS``) for a CPU model of ``dtype`` to run its blocks' linear layers.

    ``"onednn"`` where oneDNN packs ``dtype`` on this CPU (``onednn_packs``); for bf16/fp16 where it does not,
    ``"onednn-fp32"``: the weights packed in float32 and the activations converted, which multiplies in float32 as
    oneDNN's bf16 kernels accumulate anyway. On an AVX2-only CPU (emulated with ``ONEDNN_MAX_CPU_ISA=AVX2``,
    2 threads, docs/benchmarks.md) the 0.1b block linears took 19 ms that way against 87 ms through ``F.linear``
    in bf16 (192 rows; 75 against 357 ms at 768), whose bf16 GEMM falls back to ATen's own loops there. ``"plain"``
    only without oneDNN. ``native`` overrides the probe (tests force either answer on any machine).
    """
    if not onednn_linear_available():
        return "plain"
    if dtype == torch.float32 or (onednn_packs(dtype) if native is None else native):
        return "onednn"
    return "onednn-fp32"


# oneDNN's ISA levels (``ONEDNN_MAX_CPU_ISA``, also spelt ``DNNL_MAX_CPU_ISA``) below AVX512_CORE_BF16, the first with
# bf16 dot products (``vdpbf16ps``); a limit at one of these makes oneDNN widen bf16 to float32 on any CPU.
_ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


class Precision(NamedTuple):
    """The dtype ``fast_precision`` picked and why, in words ``sapiens2 benchmark`` prints."""

    dtype: torch.dtype
    reason: str


def _native_bf16_features() -> list[str]:
    """The bf16 instruction sets of this CPU as torch's cpuinfo reads them from CPUID (no switch hides them)."""
    capabilities = getattr(torch.cpu, "get_capabilities", dict)()
    return [name for key, name in (("avx512_bf16", "AVX-512 BF16"), ("amx_bf16", "AMX-BF16")) if capabilities.get(key)]


@functools.cache
def fast_precision(device: torch.device | str = "cpu") -> Precision:
    """The dtype fast mode runs in on ``device`` when none is asked for, and the reason (issue #38).

    bf16 where the hardware computes it natively: a CUDA GPU with bf16 (``torch.cuda.is_bf16_supported``), a CPU with
    AVX-512 BF16 (AMD Zen 4/5, Intel Cooper Lake) or AMX-BF16 (Intel Sapphire Rapids on) whose oneDNN uses it (not
    limited below AVX512_CORE_BF16 by ``ONEDNN_MAX_CPU_ISA``) and packs bf16 weights (``onednn_packs``). Elsewhere
    float32: without those instructions oneDNN and ATen widen bf16 to float32 around every op, and bf16 ran 3-3.5x
    slower than float32 on an AVX-512 Cascade Lake and 0.7x on an AVX2-only CPU (docs/benchmarks.md), while on a
    Zen 4 fast bf16 ran 1.65x fast float32. The one place this choice is made: ``Predictor`` (fast mode, no dtype)
    and ``sapiens2 benchmark`` (fast mode, no ``--dtype``) ask it.
    """
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return Precision(torch.bfloat16, "bf16: this GPU computes bf16 on its tensor cores")
        return Precision(torch.float32, "fp32: this GPU has no bf16")
    if device.type != "cpu":
        return Precision(torch.float32, f"fp32: the default on {device.type}")
    native = _native_bf16_features()
    if not native:
        return Precision(torch.float32, "fp32: this CPU has no native bf16 (neither AVX-512 BF16 nor AMX-BF16), so "
                                        "bf16 would be widened to fp32 around every op, slower than fp32")  # fmt: skip
    limit = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    if limit in _ONEDNN_ISAS_WITHOUT_BF16:
        return Precision(torch.float32, f"fp32: the CPU has {' and '.join(native)} but oneDNN is limited to {limit} "
                                        "(ONEDNN_MAX_CPU_ISA), below its bf16 instructions")  # fmt: skip
    if not onednn_packs(torch.bfloat16):
        return Precision(torch.float32, f"fp32: the CPU has {' and '.join(native)} but this torch's oneDNN does not "
                                        "pack bf16 weights")  # fmt: skip
    return Precision(torch.bfloat16, f"bf16: this CPU computes bf16 natively ({' and '.join(native)}) and oneDNN "
                                     "packs bf16 weights")  # fmt: skip


def linear_path_of(model: nn.Module) -> str:
    """The ``LINEAR_PATHS`` key ``model``'s block linears took in ``make_fast`` (``"plain"`` when none is packed)."""
    for module in model.modules():
        if isinstance(module, PackedLinear):
            return "onednn" if module.packed.dtype == module.weight.dtype else "onednn-fp32"
    return "plain"


class PackedLinear(nn.Module):
    """A CPU ``nn.Linear`` that multiplies through oneDNN's brgemm with a weight reordered once (inference only).

    ``weight``/``bias`` stay the ordinary parameters (same state-dict keys and values); ``packed`` is a copy of the
    weight in oneDNN's blocked layout (neither saved nor moved by ``.to``), so the layer holds its weight twice. A
    float32 ``addmm`` goes through MKL and runs below oneDNN's AVX-512 brgemm on the same shapes; bf16 skips a weight
    reorder per call.
    The packed copy is made for ``batch_hint`` rows and serves any row count.

    ``packed_dtype`` float32 for a bf16/fp16 layer is the ``"onednn-fp32"`` path of CPUs whose oneDNN cannot pack the
    layer's dtype: the packed copy (and bias) in float32, inputs converted to it and outputs back to the layer's dtype
    (a float32 copy of a bf16 weight costs twice the weight's own memory).
    """

    def __init__(self, linear: nn.Linear, batch_hint: int = 1024, packed_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if linear.weight.device.type != "cpu":
            raise ValueError(f"PackedLinear runs on CPU only; this weight is on {linear.weight.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        packed_dtype = packed_dtype or self.weight.dtype
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach().to(packed_dtype), batch_hint)
            bias = None if self.bias is None else self.bias.detach().to(packed_dtype)
        # Plain attributes, not buffers: ``module.to(...)`` must not convert oneDNN's opaque layout (it cannot).
        self.packed, self.packed_bias = packed, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dtype != self.weight.dtype or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)  # training, or moved since packing: the plain path
        leading = x.shape[:-1]
        # oneDNN takes a 2-D row-major input: (..., in) -> (rows, in) -> (rows, out) -> (..., out)
        rows = x.reshape(-1, self.in_features).to(self.packed.dtype).contiguous()
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.packed_bias, "none", [], "")
        return out.to(x.dtype).reshape(*leading, self.out_features)

    def extra_repr(self) -> str:
        path = "oneDNN packed" if self.packed.dtype == self.weight.dtype else f"oneDNN packed in {self.packed.dtype}"
        return f"in_features={self.in_features}, out_features={self.out_features}, {path}"


@contextlib.contextmanager
def attention_backends(device: torch.device | str) -> Iterator[None]:
    """Within this context, SDPA on CUDA tries cuDNN attention first, then FlashAttention, memory-efficient and
    math (the first that supports the call). On an H100 with torch 2.11, cuDNN ran the 1b attention at 397 TFLOP/s
    against FlashAttention-2's 285, GQA blocks included (docs/benchmarks.md). Elsewhere, and on torch builds without
    backend priorities, nothing changes."""
    if torch.device(device).type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    try:
        context = sdpa_kernel(order, set_priority=True)
    except TypeError:  # a torch without set_priority
        context = contextlib.nullcontext()
    with context:
        yield


def is_fast(model: nn.Module) -> bool:
    """True when ``make_fast`` has run on ``model`` (or the model has no attention to fuse)."""
    return all(module.fused for module in model.modules() if isinstance(module, Attention))


FUSED_KERNELS_ON_CUDA = False
"""The one switch that turns the fused Triton kernels on by default (``make_fast(fused_kernels=None)``) wherever they
run as kernels (``fused_kernels_supported``: CUDA, compute capability 8.0 on, Triton installed); they never run
elsewhere. Off until one GPU run of ``benchmarks/gpu_session.sh`` shows both conditions of issue #38 in its summary:
the ``tests`` step passes (the CUDA agreement tests of ``tests/test_fused_kernels.py`` and the fast-mode files) and,
in the ``backbone`` step (1b, bf16, batch 8, compiled, CUDA graphs), the row "compiled, with fused ops" is faster
than "compiled, without" (its ``decision`` line says which). Then set this to True in the same commit as those
figures in docs/benchmarks.md ("Fused GPU kernels"); if they are slower, record by how much and fix or remove them.
The first run (H100, 2026-11-27) timed q/k-norm + RoPE alone at 4x Inductor's fusion, but not the network."""


def fused_kernels_supported(device: torch.device | str) -> bool:
    """Whether the Triton kernels can run on ``device``: a CUDA GPU of compute capability 8.0 or newer (Ampere on,
    where Triton handles bf16) with Triton installed. Elsewhere the fused ops run their reference torch ops."""
    device = torch.device(device)
    if device.type != "cuda" or not triton_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def _pack_block_linears(model: nn.Module, packed_dtype: torch.dtype | None) -> int:
    """Swap the linear layers inside attention and FFN modules for ``PackedLinear``; returns how many."""
    count = 0
    for module in list(model.modules()):
        if not isinstance(module, (Attention, SwiGLUFFN)):
            continue
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PackedLinear(child, packed_dtype=packed_dtype))
                count += 1
    return count


@torch.no_grad()
def make_fast(
    model: nn.Module,
    *,
    pack_linears: bool | str | None = None,
    tune_allocator: bool | None = None,
    fused_kernels: bool | None = None,
) -> nn.Module:
    """Turn ``model`` (a ``Sapiens2`` backbone, a ``TaskModel`` or anything holding them) into its fast form, in place.

    Args:
        model: the loaded network, on its final device and dtype (move it first: packed weights do not move).
        pack_linears: how the blocks' linear layers run on the CPU, a key of ``LINEAR_PATHS``: ``"onednn"``
            (through oneDNN with prepacked weights, ``PackedLinear``), ``"onednn-fp32"`` (the same with float32
            weights, for bf16/fp16 where this CPU's oneDNN cannot pack them) or ``"plain"``. None: on a CPU,
            ``choose_linear_path`` for the model's dtype (on a model made fast before, the path it took then); True:
            ``choose_linear_path``, required; False: ``"plain"``. A packed
            path costs a second copy of those weights (``linear_path_of`` tells which path a model took).
        tune_allocator: call ``keep_freed_host_memory`` (process-wide). None: when the model is on the CPU.
        fused_kernels: run q/k-norm + RoPE, SiLU(gate) * up and LayerScale + residual as the fused ops of
            ``layers/fused.py`` (Triton kernels on CUDA; on other devices their reference torch ops, the same
            numbers as without). None: ``FUSED_KERNELS_ON_CUDA`` on a device where they run as Triton kernels
            (``fused_kernels_supported``), else off. False turns them off again.

    Raises:
        ValueError: a packed path without a CPU model and oneDNN, ``"onednn"`` for a dtype this CPU's oneDNN does not
            pack (bf16 on an AVX2-only CPU); ``fused_kernels=True`` for a CUDA model without
            Triton installed.

    Returns:
        ``model`` itself. Calling it twice is harmless.

    Example:
        >>> model = make_fast(load_model("seg", "1b").eval())
        >>> logits = model(images)  # same keys in model.state_dict(), last-bit differences in the outputs
    """
    made_fast = any(isinstance(module, Attention) and module.fused for module in model.modules())
    for module in model.modules():
        if isinstance(module, Attention):
            module.fuse_qkv()
        elif isinstance(module, RopePositionEmbedding):
            module.cache_tables = True
    parameter = next(model.parameters(), None)
    on_cpu = parameter is not None and parameter.device.type == "cpu"
    device = parameter.device if parameter is not None else torch.device("cpu")
    if fused_kernels is None:
        fused_kernels = FUSED_KERNELS_ON_CUDA and fused_kernels_supported(device)
    fused_kernels = bool(fused_kernels)
    if fused_kernels and device.type == "cuda" and not triton_available():
        raise ValueError("fused_kernels=True on CUDA needs Triton (pip install triton; CUDA builds of torch ship it)")
    for module in model.modules():
        if isinstance(module, (Attention, SwiGLUFFN, TransformerBlock)):
            module.fused_kernels = bool(fused_kernels)
    if tune_allocator if tune_allocator is not None else on_cpu:
        keep_freed_host_memory()
    dtype = parameter.dtype if parameter is not None else torch.float32
    if pack_linears is None and made_fast:  # a second call keeps the path the first one took
        pack_linears = linear_path_of(model)
    elif pack_linears is None:
        pack_linears = choose_linear_path(dtype) if on_cpu else "plain"
    elif pack_linears is True or pack_linears is False:
        pack_linears = choose_linear_path(dtype) if pack_linears else "plain"
    if pack_linears not in LINEAR_PATHS:
        raise ValueError(f"pack_linears must be one of {', '.join(map(repr, LINEAR_PATHS))}, True, False or None, "
                         f"got {pack_linears!r}")  # fmt: skip
    if pack_linears != "plain" and linear_path_of(model) == "plain":  # a second call leaves the packing as it is
        if not on_cpu or not onednn_linear_available():
            raise ValueError("pack_linears needs a CPU model and a torch build with oneDNN")
        if pack_linears == "onednn" and not onednn_packs(dtype):
            raise ValueError(f"pack_linears='onednn': oneDNN cannot pack {dtype} weights on this CPU (it needs "
                             "AVX-512 or AVX-NE-CONVERT); use 'onednn-fp32' or leave pack_linears unset")  # fmt: skip
        packed_dtype = torch.float32 if pack_linears == "onednn-fp32" else dtype
        logger.debug("packed %d linear layers for oneDNN (%s)", _pack_block_linears(model, packed_dtype), pack_linears)
    return model


BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
"""Batch sizes ``CompiledBuckets`` compiles for; a batch runs padded up to the next one."""


class CompiledBuckets:
    """Run a network through ``torch.compile`` with static shapes, compiled once per bucket and reused.

    A bucket is (input shape with the batch rounded up to the next of ``buckets``, dtype, device): a batch of 3 runs
    as 4 with zero images appended, whose outputs are cut off again (every image is computed independently, so the
    padding does not touch the others). Larger batches round up to a multiple of the largest bucket. A new input
    size or batch bucket compiles once (seconds to minutes); later calls reuse it. Before compiling a bucket, a fast
    model runs once eagerly to cache its RoPE tables: the compiled graph reads them instead of recomputing sin/cos.
    On the CPU the weights are frozen into the compiled code (Inductor's ``freezing``, which packs them for oneDNN):
    after loading other weights into ``model``, make a new ``CompiledBuckets``.

    Args:
        model: the network (fast or reference form), on its device and dtype, in eval mode.
        buckets: ascending batch sizes to compile for.
        cuda_graphs: CUDA only: capture each bucket as a CUDA graph (``mode="reduce-overhead"``); ignored elsewhere.
        compile_options: extra keyword arguments for ``torch.compile``.

    Example:
        >>> network = CompiledBuckets(make_fast(model))
        >>> heatmaps = network(crops)  # compiles for crops.shape with the batch rounded up, then reuses it
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        buckets: Sequence[int] = BATCH_BUCKETS,
        cuda_graphs: bool = False,
        **compile_options: Any,
    ) -> None:
        buckets = tuple(int(b) for b in buckets)
        if not buckets or any(b < 1 for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ValueError(f"buckets must be ascending positive batch sizes, got {buckets}")
        self.model = model
        self.buckets = buckets
        self.cuda_graphs = cuda_graphs
        self.compile_options = compile_options
        self.compiled: dict[tuple, Any] = {}

    def bucket(self, batch: int) -> int:
        """The batch size a batch of ``batch`` images runs at."""
        for size in self.buckets:
            if batch <= size:
                return size
        largest = self.buckets[-1]
        return -(-batch // largest) * largest

    def _compiled_for(self, x: torch.Tensor) -> Any:
        key = (tuple(x.shape), x.dtype, x.device)
        if key not in self.compiled:
            options = dict(self.compile_options)
            if self.cuda_graphs and x.device.type == "cuda":  # CUDA graphs exist on CUDA only
                options.setdefault("mode", "reduce-overhead")
            if x.device.type == "cpu" and "mode" not in options:
                # Inductor's weight freezing packs the linear layers for oneDNN, as PackedLinear does in eager mode;
                # without it a compiled CPU network multiplies through MKL's slower addmm (docs/benchmarks.md).
                options["options"] = {"freezing": True, **options.get("options", {})}
            if not torch.is_grad_enabled() and any(getattr(m, "cache_tables", False) for m in self.model.modules()):
                self.model(x)  # one eager call caches the RoPE tables, which the compiled graph reads as inputs
            logger.info("compiling %s for input %s %s on %s", type(self.model).__name__, tuple(x.shape), x.dtype,
                        x.device)  # fmt: skip
            self.compiled[key] = torch.compile(self.model, dynamic=False, **options)
        return self.compiled[key]

    def __call__(self, x: torch.Tensor) -> Any:
        batch = x.shape[0]
        size = self.bucket(batch)
        if size != batch:
            x = torch.cat([x, x.new_zeros((size - batch, *x.shape[1:]))])
        output = self._compiled_for(x)(x)
        if size == batch:
            return output
        if isinstance(output, (tuple, list)):
            return type(output)(o[:batch] for o in output)
        return output[:batch]

    def __getattr__(self, name: str) -> Any:
        # Attributes the callers read off the network (``backbone``, ``task``, ...) come from the wrapped model.
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)
