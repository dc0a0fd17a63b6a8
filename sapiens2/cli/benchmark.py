"""``sapiens2 benchmark``: the flags, parsed into a ``BenchmarkOptions`` for ``sapiens2.benchmark.run_benchmark``."""

from __future__ import annotations

import argparse

from ..benchmark import BACKBONE, DTYPES, BenchmarkOptions, run_benchmark
from ..checkpoints import CheckpointMismatchError, CheckpointNotFoundError
from ..messages import report_error
from ..models.lowp import QUANTIZATIONS
from ..tasks import TASKS
from .predict import add_input_size_flag, add_threads_flag

_USER_ERRORS = (CheckpointNotFoundError, CheckpointMismatchError, FileNotFoundError, ValueError)


def _resolution(text: str) -> tuple[int, int]:
    """``--resolution HxW``: the deprecated spelling of ``--input-size H W``."""
    match = text.lower().split("x")
    if len(match) != 2 or not all(part.isdigit() and int(part) >= 16 for part in match):
        raise argparse.ArgumentTypeError(f"must be HxW in pixels, each >= 16, e.g. 1024x768; got {text!r}")
    return int(match[0]), int(match[1])


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "benchmark",
        help="time a network: images/s, latency percentiles, peak memory, TFLOP/s and MFU",
        description="Time the forward pass of one network on random input. "
        "Example: sapiens2 benchmark --task seg --model 1b --batch-size 8 --dtype bf16 --compile. "
        "(The old spellings --batch N and --resolution HxW still work; they are deprecated.)",
    )
    parser.add_argument(
        "--task", default=BACKBONE, choices=(BACKBONE, *TASKS), help="a task model, or the bare backbone (default)"
    )
    parser.add_argument(
        "--model", default="1b", help="arch or size (random weights), or a weight file / repo id (default 1b)"
    )
    parser.add_argument("--batch-size", type=int, default=1, help="images per forward (default 1)")
    parser.add_argument("--batch", dest="batch_size", type=int, help=argparse.SUPPRESS)  # deprecated spelling
    parser.add_argument(
        "--dtype",
        default=None,
        choices=tuple(DTYPES),
        help="default: fast mode's pick for the device (bf16 on CUDA and on CPUs with native bf16: AVX-512 BF16, AMX; "
        "else fp32; printed with its reason), fp32 in reference mode",
    )
    add_input_size_flag(parser)
    parser.add_argument("--resolution", dest="input_size", type=_resolution, help=argparse.SUPPRESS)  # deprecated
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    parser.add_argument("--mode", default="fast", choices=("fast", "reference"), help="network mode (default fast)")
    parser.add_argument("--compile", action="store_true", help="torch.compile with static shapes (fast mode)")
    parser.add_argument(
        "--quantize",
        default=None,
        choices=QUANTIZATIONS,
        help="low-precision linear layers in the blocks through torchao: fp8 (GPUs with FP8), int8, int8-weight",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="device peak TFLOP/s for the MFU (default: the known-GPU table; on a CPU cores x FLOP/cycle of its ISA "
        "x clock, docs/benchmarks.md)",
    )
    add_threads_flag(parser)
    parser.add_argument("--iters", type=int, default=20, help="timed forwards (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed forwards first (default 3)")
    parser.set_defaults(func=run)


def options_from_args(args: argparse.Namespace) -> BenchmarkOptions:
    return BenchmarkOptions(
        task=args.task,
        model=args.model,
        batch_size=args.batch_size,
        dtype=args.dtype,
        input_size=tuple(args.input_size) if args.input_size else None,
        device=args.device,
        mode=args.mode,
        compile=args.compile,
        quantize=args.quantize,
        peak_tflops=args.peak_tflops,
        iters=args.iters,
        warmup=args.warmup,
        threads=args.threads,
    )


def run(args: argparse.Namespace) -> int:
    try:
        report = run_benchmark(options_from_args(args))
    except _USER_ERRORS as error:
        report_error(str(error))
        return 2
    print(report)
    return 0
