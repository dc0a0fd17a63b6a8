"""Network throughput of one model at one batch size and precision: ``sapiens2 benchmark`` (issue #11).

``run_benchmark(BenchmarkOptions(...))`` times the forward pass (random normalised input, random or loaded weights)
after warm-up and reports images/s, latency percentiles per batch, peak memory, achieved TFLOP/s and the model FLOPs
utilisation (MFU): FLOPs per image are the arch table's backbone formula (``Arch.flops``) plus the decode head's,
counted by ``torch.utils.flop_counter`` on a ``meta`` copy; the device peak comes from ``GPU_PEAK_TFLOPS``, on a
CPU from ``cpu_info()`` (``CpuInfo.peak_tflops``: FLOP per cycle per core for the ISA and dtype x cores used x
clock), or from ``peak_tflops``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import resource
import statistics
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from .checkpoints import load_backbone, load_model
from .models import Sapiens2
from .models.fast import LINEAR_PATHS, CompiledBuckets, attention_backends, fast_precision, linear_path_of, make_fast
from .models.input_size import model_input_size
from .models.lowp import QUANTIZATIONS, quantize
from .models.task_model import build_model
from .models.threads import available_cores, check_threads, set_threads, wait_policy
from .models.zoo import Arch, get_arch
from .tasks import TASKS

__all__ = [
    "BACKBONE",
    "GPU_PEAK_TFLOPS",
    "BenchmarkOptions",
    "BenchmarkReport",
    "CpuInfo",
    "cpu_info",
    "device_peak_tflops",
    "parse_cpuinfo",
    "run_benchmark",
]

logger = logging.getLogger(__name__)

BACKBONE = "backbone"
"""The ``task`` that times the bare backbone (featmap output), no head."""

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Dense peak TFLOP/s (no sparsity) of known GPUs from the vendors' data sheets: (bf16/fp16 tensor cores, fp32 without
# TF32). Matched against torch.cuda.get_device_name() in this order (first pattern that matches).
GPU_PEAK_TFLOPS: dict[str, tuple[float, float]] = {
    r"H100.*PCIe": (756.0, 51.2),
    r"H100.*NVL": (835.0, 60.0),
    r"H100": (989.4, 66.9),  # SXM (HBM3)
    r"H200": (989.4, 66.9),
    r"B200": (2250.0, 80.0),
    r"A100": (312.0, 19.5),
    r"L40S": (362.1, 91.6),
    r"\bL4\b": (121.0, 30.3),
    r"\bA10\b": (125.0, 31.2),
    r"RTX 4090": (165.2, 82.6),
}


def device_peak_tflops(device: torch.device, dtype: torch.dtype) -> float | None:
    """The dense peak TFLOP/s of ``device`` for ``dtype`` from ``GPU_PEAK_TFLOPS``; None for CPUs and unknown GPUs."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for pattern, (tensor_core, fp32) in GPU_PEAK_TFLOPS.items():
        if re.search(pattern, name):
            return fp32 if dtype == torch.float32 else tensor_core
    return None


# ISA features read from /proc/cpuinfo's flags, in the order they are printed: (name, the flags that must all be set).
CPU_FEATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("AVX2", ("avx2",)),
    ("FMA", ("fma",)),
    ("AVX-512", ("avx512f",)),
    ("AVX-512 VNNI", ("avx512_vnni",)),
    ("AVX-512 BF16", ("avx512_bf16",)),
    ("AVX-512 FP16", ("avx512_fp16",)),
    ("AVX-VNNI", ("avx_vnni",)),
    ("AMX-BF16", ("amx_tile", "amx_bf16")),
    ("AMX-INT8", ("amx_tile", "amx_int8")),
    ("AMX-FP16", ("amx_tile", "amx_fp16")),
)


@dataclass(frozen=True)
class CpuInfo:
    """A CPU as ``/proc/cpuinfo`` describes it (``parse_cpuinfo``), for the ISA line and the peak of the MFU.

    Attributes:
        model: the ``model name``.
        vendor: ``GenuineIntel``, ``AuthenticAMD``, ...; family: the ``cpu family`` number (AMD 25: Zen 3/4, 26: Zen 5).
        flags: the ``flags`` of the first processor.
        logical: processors listed; cores: physical cores (distinct ``physical id``/``core id`` pairs, else
            ``cpu cores`` per socket, else ``logical``).
        ghz: the clock the peak assumes: the nominal one in the model name (``@ 2.50GHz``), else the highest
            ``cpu MHz`` listed (a momentary reading: it may be a boost or an idle clock); None when neither is there.
        capability: the kernels torch picked (``torch.backends.cpu.get_cpu_capability()``: ``AVX512``, ``AVX2``...).
    """

    model: str
    vendor: str = ""
    family: int | None = None
    flags: frozenset[str] = frozenset()
    logical: int = 1
    cores: int = 1
    ghz: float | None = None
    capability: str | None = None

    @property
    def features(self) -> list[str]:
        """The ISA features of ``CPU_FEATURES`` this CPU has, e.g. ``["AVX2", "FMA", "AVX-512", "AMX-BF16"]``."""
        return [name for name, needed in CPU_FEATURES if all(flag in self.flags for flag in needed)]

    def flops_per_cycle(self, dtype: str) -> int:
        """Dense FLOP per cycle per core for ``dtype`` (``fp32``, ``bf16``, ``fp16``, ``int8``: int8 ops), a
        multiply-add counting 2. The assumptions (docs/benchmarks.md, "CPU peak"):

        - fp32: AVX-512 with two 512-bit FMA units 64 (Intel Xeon Scalable; AMD from Zen 5, family >= 26); AMD
          Zen 4 runs AVX-512 on two 256-bit units, 32; AVX2 + FMA 32; AVX 16; SSE 8.
        - bf16: AMX 1024 (16x32 tiles); AVX-512 BF16 (``vdpbf16ps``, two bf16 products per fp32 lane) twice the
          fp32 rate; without either, bf16 is widened to fp32 and runs at its rate.
        - fp16: AMX-FP16 1024; AVX-512 FP16 twice the fp32 rate; else the fp32 rate.
        - int8: AMX-INT8 2048; AVX-512 VNNI / AVX-VNNI (``vpdpbusd``, four int8 products per 32-bit lane) four
          times the fp32 rate of its width; else twice the fp32 rate (``vpmaddubsw`` pairs).
        """
        has = self.flags.__contains__
        amd_half_width = self.vendor == "AuthenticAMD" and (self.family or 0) < 26
        if has("avx512f"):
            fp32 = 32 if amd_half_width else 64
        elif has("avx2") and has("fma"):
            fp32 = 32
        else:
            fp32 = 16 if has("avx") else 8
        amx = has("amx_tile")
        if dtype == "fp32":
            return fp32
        if dtype == "bf16":
            return 1024 if amx and has("amx_bf16") else 2 * fp32 if has("avx512_bf16") else fp32
        if dtype == "fp16":
            return 1024 if amx and has("amx_fp16") else 2 * fp32 if has("avx512_fp16") else fp32
        if dtype == "int8":
            if amx and has("amx_int8"):
                return 2048
            if has("avx512_vnni"):
                return 4 * fp32
            return 4 * min(fp32, 32) if has("avx_vnni") else 2 * fp32
        raise ValueError(f"dtype must be fp32, bf16, fp16 or int8, got {dtype!r}")

    def peak_tflops(self, dtype: str, cores: int) -> float | None:
        """``flops_per_cycle(dtype)`` x ``cores`` x ``ghz`` in TFLOP/s; None without a clock."""
        return None if self.ghz is None else self.flops_per_cycle(dtype) * cores * self.ghz / 1e3

    def threads_per_core(self) -> int:
        return max(1, round(self.logical / max(self.cores, 1)))


def parse_cpuinfo(text: str, capability: str | None = None) -> CpuInfo:
    """A ``CpuInfo`` from the text of ``/proc/cpuinfo`` (x86 Linux; other layouts give what they have)."""
    blocks = [block for block in re.split(r"\n\s*\n", text.strip()) if block.strip()]
    processors = []
    for block in blocks:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() not in fields:
                fields[key.strip()] = value.strip()
        processors.append(fields)
    first = processors[0] if processors else {}
    model = first.get("model name") or first.get("Hardware") or "unknown CPU"
    clock = re.search(r"@\s*([\d.]+)\s*GHz", model)
    mhz = [float(p["cpu MHz"]) for p in processors if re.fullmatch(r"[\d.]+", p.get("cpu MHz", ""))]
    ghz = float(clock.group(1)) if clock else max(mhz) / 1000 if mhz else None
    pairs = {(p.get("physical id"), p.get("core id")) for p in processors if "core id" in p}
    sockets = {p.get("physical id") for p in processors if "physical id" in p}
    logical = max(1, sum(1 for p in processors if "processor" in p))
    if pairs:
        cores = len(pairs)
    elif first.get("cpu cores", "").isdigit():
        cores = min(logical, int(first["cpu cores"]) * max(1, len(sockets)))
    else:
        cores = logical
    family = first.get("cpu family", "")
    return CpuInfo(
        model=re.sub(r"\s+", " ", model),
        vendor=first.get("vendor_id", ""),
        family=int(family) if family.isdigit() else None,
        flags=frozenset((first.get("flags") or first.get("Features") or "").split()),
        logical=logical,
        cores=max(1, cores),
        ghz=ghz,
        capability=capability,
    )


def cpu_info(path: str | os.PathLike = "/proc/cpuinfo") -> CpuInfo:
    """This machine's CPU (``parse_cpuinfo`` of ``path``), with the kernels torch picked for it."""
    capability = torch.backends.cpu.get_cpu_capability()
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return parse_cpuinfo(file.read(), capability)
    except OSError:  # not Linux: the name platform gives, no flags, no clock
        import platform

        return CpuInfo(model=platform.processor() or "unknown CPU", logical=os.cpu_count() or 1,
                       cores=os.cpu_count() or 1, capability=capability)  # fmt: skip


def cpu_cores_used(info: CpuInfo, threads: int) -> int:
    """Physical cores ``threads`` torch threads can keep busy: at most the cores this process may run on."""
    usable = max(1, available_cores() // info.threads_per_core())
    return max(1, min(threads, usable, info.cores))


@dataclass(frozen=True)
class BenchmarkOptions:
    """What to time (the flags of ``sapiens2 benchmark``).

    Attributes:
        task: ``"backbone"`` (featmap output, no head) or a task name [``--task``].
        model: an arch name or size (random weights: speed does not depend on them), or a checkpoint source as
            ``load_model`` takes it [``--model``].
        batch_size: images per forward [``--batch-size``].
        dtype: ``fp32``, ``bf16`` or ``fp16``; None: in fast mode the device's fastest (``fast_precision``: bf16
            on CUDA and on CPUs with native bf16, else fp32), in reference mode fp32 [``--dtype``]. The report says
            which and why (``precision``).
        input_size: network input (H, W); None: the size the model was built for (a file's: 1024x768 or what its
            pointmap scale MLP takes; an arch name: its training size) [``--input-size H W``].
        device: ``cpu``, ``cuda``, ``cuda:1``...; None: CUDA when available [``--device``].
        mode: ``fast`` or ``reference`` network (``sapiens2.models.fast``) [``--mode``].
        compile: ``torch.compile`` with static shapes (fast mode) [``--compile``].
        quantize: ``fp8``, ``int8`` or ``int8-weight`` linear layers in the blocks through torchao
            (``sapiens2.models.lowp``) [``--quantize``].
        peak_tflops: the device's peak for the MFU, overriding the known-GPU table and the CPU's estimate
            (``CpuInfo.peak_tflops``) [``--peak-tflops``].
        iters, warmup: timed and untimed forwards [``--iters``, ``--warmup``].
        threads: torch's CPU threads (``sapiens2.models.threads``); None: as they are [``--threads``].
    """

    task: str = BACKBONE
    model: str = "1b"
    batch_size: int = 1
    dtype: str | None = None
    input_size: tuple[int, int] | None = None
    device: str | None = None
    mode: str = "fast"
    compile: bool = False
    quantize: str | None = None
    peak_tflops: float | None = None
    iters: int = 20
    warmup: int = 3
    threads: int | None = None


@dataclass
class BenchmarkReport:
    """Figures of one benchmark run; ``str(report)`` is the printed summary."""

    options: BenchmarkOptions
    device: str
    arch: str
    dtype: str
    input_size: tuple[int, int]
    latencies_ms: list[float] = field(repr=False)
    images_per_s: float
    peak_memory_gib: float
    memory_kind: str
    flops_per_image: float
    peak_tflops: float | None
    cpu: CpuInfo | None = None
    peak_note: str = ""
    linear_path: str = ""
    precision: str = ""

    def percentile(self, q: float) -> float:
        """Latency per forward (ms) at percentile ``q`` in [0, 100] (nearest rank)."""
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]

    @property
    def achieved_tflops(self) -> float:
        return self.images_per_s * self.flops_per_image / 1e12

    @property
    def mfu(self) -> float | None:
        return None if not self.peak_tflops else self.achieved_tflops / self.peak_tflops

    def __str__(self) -> str:
        o = self.options
        mfu = "n/a (give --peak-tflops)" if self.mfu is None else f"{100 * self.mfu:.1f} % of {self.peak_tflops:.4g}"
        lines = [
            f"sapiens2 benchmark: {o.task} {self.arch} on {self.device}, {self.dtype}, batch {o.batch_size}, "
            f"{self.input_size[0]}x{self.input_size[1]}, {o.mode} mode{', compiled' if o.compile else ''}"
            f"{f', {o.quantize} blocks' if o.quantize else ''}",
            f"images/s          {self.images_per_s:.2f}",
            f"latency ms/batch  p50 {self.percentile(50):.1f}  p90 {self.percentile(90):.1f}  "
            f"p99 {self.percentile(99):.1f}  ({len(self.latencies_ms)} timed forwards)",
            f"peak memory       {self.peak_memory_gib:.2f} GiB ({self.memory_kind})",
            f"FLOPs per image   {self.flops_per_image / 1e9:.1f} GFLOP (backbone from the arch table + head counted)",
            f"achieved          {self.achieved_tflops:.3f} TFLOP/s",
            f"MFU               {mfu}{f' ({self.peak_note})' if self.peak_note and self.mfu is not None else ''}",
        ]
        if self.cpu is not None:
            cpu = self.cpu
            lines.insert(1, f"cpu               {cpu.model}, {cpu.cores} cores / {cpu.logical} threads; ISA "
                            f"{' '.join(cpu.features) or 'no AVX2'}; torch kernels {cpu.capability or 'unknown'}")
        if self.linear_path:
            lines.insert(2, f"block linears     {self.linear_path}")
        if self.precision:
            lines.insert(1, f"precision         {self.precision}")
        return "\n".join(lines)


def _check(options: BenchmarkOptions) -> tuple[torch.device, torch.dtype, str]:
    """The device, the dtype and why that dtype (``--dtype``, ``fast_precision``'s choice or a mode's default)."""
    if options.task != BACKBONE and options.task not in TASKS:
        raise ValueError(f"--task must be {BACKBONE} or one of {', '.join(TASKS)}, got {options.task!r}")
    for flag, value, least in (("--batch-size", options.batch_size, 1), ("--iters", options.iters, 1),
                               ("--warmup", options.warmup, 0)):  # fmt: skip
        if value < least:
            raise ValueError(f"{flag} {value}: must be >= {least}")
    if options.mode not in ("fast", "reference"):
        raise ValueError(f"--mode must be fast or reference, got {options.mode!r}")
    if options.compile and options.mode != "fast":
        raise ValueError("--compile needs --mode fast")
    if options.quantize is not None and options.quantize not in QUANTIZATIONS:
        raise ValueError(f"--quantize must be one of {', '.join(QUANTIZATIONS)}, got {options.quantize!r}")
    if options.peak_tflops is not None and options.peak_tflops <= 0:
        raise ValueError(f"--peak-tflops must be > 0, got {options.peak_tflops}")
    check_threads(options.threads, "--threads")
    device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available; use --device cpu")
    if options.dtype is not None:
        if options.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {options.dtype!r}")
        return device, DTYPES[options.dtype], f"{options.dtype}: asked for (--dtype)"
    if options.mode == "reference":
        return device, torch.float32, "fp32: reference mode's default (the official numerics)"
    dtype, reason = fast_precision(device)
    return device, dtype, f"{reason} (fast mode's pick; --dtype overrides)"


def _named_arch(model: str) -> Arch | None:
    try:
        return get_arch(model)
    except ValueError:
        return None


def _build(options: BenchmarkOptions, input_size: tuple[int, int] | None, device, dtype) -> nn.Module:
    arch = _named_arch(options.model)
    if arch is not None:  # random weights, made on the target device
        size = input_size or arch.img_size
        if options.task == BACKBONE:
            return Sapiens2(arch, img_size=size, out_type="featmap", device=device, dtype=dtype)
        return build_model(options.task, arch, input_size=size, device=device, dtype=dtype)
    if options.task == BACKBONE:
        return load_backbone(options.model, out_type="featmap", device=device, dtype=dtype)
    return load_model(options.task, options.model, device=device, dtype=dtype)


def _flops_per_image(model: nn.Module, arch: Arch, options: BenchmarkOptions, size: tuple[int, int]) -> float:
    """The arch table's backbone FLOPs plus the head's, counted on a meta copy of the head (no memory, no compute)."""
    from torch.utils.flop_counter import FlopCounterMode

    flops = float(arch.flops(size))
    head = getattr(model, "decode_head", None)
    if head is None:
        return flops
    meta_model = build_model(options.task, arch, input_size=size, device="meta", **_head_kwargs(head, options.task))
    grid = (size[0] // 16, size[1] // 16)
    featmap = torch.empty(1, arch.embed_dims, *grid, device="meta")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        meta_model.decode_head(featmap)
    return flops + counter.get_total_flops()


def _head_kwargs(head: nn.Module, task: str) -> dict:
    from .models.heads import infer_head_config

    config = infer_head_config(task, {k: v for k, v in head.state_dict().items()})
    config.pop("in_channels", None)
    return config


def _peak_memory_gib(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30, "CUDA max allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "process peak RSS"


def run_benchmark(options: BenchmarkOptions) -> BenchmarkReport:
    """Build or load the network, run ``warmup`` + ``iters`` forwards of ``batch_size`` random images, report.

    Raises:
        ValueError: bad options (named by their CLI flags), or a model source that is neither an arch nor loadable.
    """
    device, dtype, precision = _check(options)
    set_threads(options.threads)
    model = _build(options, options.input_size, device, dtype).eval()
    backbone = model if isinstance(model, Sapiens2) else model.backbone
    arch = backbone.arch
    size = tuple(options.input_size or model_input_size(model))  # the size the model was built or trained for
    flops = _flops_per_image(model, arch, options, size)
    if options.mode == "fast":
        model = make_fast(model, pack_linears=False if options.compile or options.quantize else None)
    if options.quantize:
        model = quantize(model, options.quantize)
    network = CompiledBuckets(model, cuda_graphs=True) if options.compile else model
    x = torch.randn(options.batch_size, 3, *size, generator=torch.Generator().manual_seed(0)).to(device, dtype)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    latencies = []
    backends = attention_backends(device) if options.mode == "fast" else contextlib.nullcontext()
    with torch.inference_mode(), backends:
        for _ in range(options.warmup):
            network(x)
        synchronize()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(options.iters):
            start = time.perf_counter()
            network(x)
            synchronize()
            latencies.append(1000 * (time.perf_counter() - start))
    peak_memory, memory_kind = _peak_memory_gib(device)
    dtype_name = {v: k for k, v in DTYPES.items()}[dtype]
    peak, note, cpu, path = options.peak_tflops or device_peak_tflops(device, dtype), "", None, ""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        path = (f"{options.quantize} through torchao" if options.quantize
                else "compiled (Inductor packs them)" if options.compile else linear_path_of(model))  # fmt: skip
        path = f"{path}: {LINEAR_PATHS[path]}" if path in LINEAR_PATHS else path
        cpu, threads = cpu_info(), torch.get_num_threads()
        name = f"cpu ({threads} threads, OpenMP wait policy {wait_policy()})"
        if peak is None:
            peak, note = _cpu_peak(cpu, "int8" if options.quantize == "int8" else dtype_name, threads)
    return BenchmarkReport(
        options=options,
        device=name,
        arch=arch.name,
        dtype=dtype_name,
        input_size=size,
        latencies_ms=latencies,
        images_per_s=options.batch_size * 1000 / statistics.median(latencies),
        peak_memory_gib=peak_memory,
        memory_kind=memory_kind,
        flops_per_image=flops,
        peak_tflops=peak,
        cpu=cpu,
        peak_note=note,
        linear_path=path,
        precision=precision,
    )


def _cpu_peak(cpu: CpuInfo, dtype: str, threads: int) -> tuple[float | None, str]:
    """The CPU's estimated peak for ``dtype`` on the cores ``threads`` keep busy, and how it was reckoned."""
    cores = cpu_cores_used(cpu, threads)
    peak = cpu.peak_tflops(dtype, cores)
    if peak is None:
        return None, ""
    return peak, f"{dtype} peak {cores} cores x {cpu.flops_per_cycle(dtype)} FLOP/cycle x {cpu.ghz:.2f} GHz"
