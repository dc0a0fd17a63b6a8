"""ONNX export on onnxruntime (CPU) against our PyTorch model on the CPU: same backbone, same weights, same run.

The backbone (random weights) is exported once with ``sapiens2.export.export_onnx`` (fp32: the bf16 RoPE recipe as
float32 ops with explicit bf16 rounding); then PyTorch and onnxruntime forwards alternate, ``--repeats`` rounds of
one timed forward each after warm-ups, so drifting machine load hits both alike. Prints a Markdown table with the
median milliseconds per image, the ratio (PyTorch time / onnxruntime time: above 1 means ONNX is faster) and the
parity of the outputs by the fixtures' tensor rule.

    python benchmarks/bench_export.py --arch tiny --arch sapiens2_0.1b --input-size 256 192 --batch 1 --threads 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from sapiens2 import Sapiens2
from sapiens2.export import export_onnx, load_network
from sapiens2.export.check import tensor_rule

TINY = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}


def timed(function, x: torch.Tensor) -> float:
    start = time.perf_counter()
    function(x)
    return time.perf_counter() - start


def bench(arch: str, input_size: tuple[int, int], batch: int, repeats: int, warmup: int, folder: Path) -> dict:
    torch.manual_seed(0)
    model = Sapiens2(TINY if arch == "tiny" else arch, img_size=input_size).eval()
    with torch.no_grad():
        for block in model.blocks:  # LayerScale 1: the attention branch (and its RoPE) matters for the parity figure
            block.attn.gamma.weight.fill_(1.0)
    start = time.perf_counter()
    network = load_network(export_onnx(model, folder / f"{arch}.onnx", input_size=input_size))
    export_seconds = time.perf_counter() - start
    x = torch.randn(batch, 3, *input_size)

    def pytorch(images: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return model(images)[0]

    for _ in range(warmup):
        pytorch(x)
        network(x)
    torch_times, onnx_times = [], []
    for _ in range(repeats):  # alternating, so load changes hit both
        torch_times.append(timed(pytorch, x))
        onnx_times.append(timed(network, x))
    torch_ms = 1000 * sorted(torch_times)[repeats // 2] / batch
    onnx_ms = 1000 * sorted(onnx_times)[repeats // 2] / batch
    max_rel, rms_rel = tensor_rule(network(x).numpy(), pytorch(x).numpy())
    return {
        "arch": arch,
        "torch_ms": torch_ms,
        "onnx_ms": onnx_ms,
        "ratio": torch_ms / onnx_ms,
        "max_rel": max_rel,
        "rms_rel": rms_rel,
        "export_s": export_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", default=None, help="tiny or an arch name (repeatable)")
    parser.add_argument("--input-size", nargs=2, type=int, default=(256, 192), metavar=("H", "W"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="threads for both runtimes (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import onnxruntime

    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads), onnxruntime {onnxruntime.__version__}, "
          f"input {args.input_size[0]}x{args.input_size[1]}, batch {args.batch}, median of {args.repeats}")  # fmt: skip
    print()
    print("| backbone | PyTorch ms/img | onnxruntime ms/img | PyTorch / ONNX | max_rel | rms_rel | export s |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for arch in args.arch or ["tiny", "sapiens2_0.1b"]:
            row = bench(arch, tuple(args.input_size), args.batch, args.repeats, args.warmup, Path(folder))
            print(
                f"| {row['arch']} | {row['torch_ms']:.2f} | {row['onnx_ms']:.2f} | {row['ratio']:.2f}x | "
                f"{row['max_rel']:.1e} | {row['rms_rel']:.1e} | {row['export_s']:.0f} |"
            )


if __name__ == "__main__":
    main()
