"""Exported networks on the CPU against our PyTorch model: eager, our fast path, onnxruntime and OpenVINO, one run.

The backbone (random weights, LayerScale 1) runs four ways on the same input in the same process: PyTorch eager
(the reference), our fast path (``make_fast``: the block linears through oneDNN), the fp32 ONNX export
(``sapiens2.export.export_onnx``) on onnxruntime's CPU provider and the OpenVINO IR export
(``sapiens2.export.export_openvino``, ``--openvino-dtype`` weights) on OpenVINO's CPU plugin, both through
``sapiens2.export.load_network`` as ``Predictor`` runs them. The runtimes alternate, ``--repeats`` rounds of one
timed forward each after warm-ups, so drifting machine load hits all alike. Every runtime gets ``--threads``.
Prints a Markdown table: median ms per image, speed-up over eager PyTorch, and the parity of each output against
eager PyTorch by the fixtures' tensor rule. OpenVINO is left out (and said so) when not installed.

    python benchmarks/bench_export.py --arch tiny --arch sapiens2_0.1b --input-size 256 192 --batch 1 --threads 2
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

import torch

from sapiens2 import Sapiens2
from sapiens2.export import export_onnx, export_openvino, load_network
from sapiens2.export.check import tensor_rule
from sapiens2.models.fast import make_fast

TINY = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}


def timed(function, x: torch.Tensor) -> float:
    start = time.perf_counter()
    function(x)
    return time.perf_counter() - start


def _backbone(arch: str, input_size: tuple[int, int]) -> Sapiens2:
    torch.manual_seed(0)
    model = Sapiens2(TINY if arch == "tiny" else arch, img_size=input_size).eval()
    with torch.no_grad():
        for block in model.blocks:  # LayerScale 1: the attention branch (and its RoPE) matters for the parity figure
            block.attn.gamma.weight.fill_(1.0)
    return model


def runtimes(arch: str, input_size: tuple[int, int], openvino_dtype: str | None, folder: Path) -> tuple[dict, dict]:
    """name -> callable mapping images to the features, and name -> seconds its export took."""
    model = _backbone(arch, input_size)
    fast = _backbone(arch, input_size)
    make_fast(fast)

    def eager(network):
        def run(images: torch.Tensor) -> torch.Tensor:
            with torch.inference_mode():
                return network(images)[0]

        return run

    found = {"PyTorch": eager(model), "ours fast": eager(fast)}
    export_seconds = {}
    start = time.perf_counter()
    found["onnxruntime"] = load_network(export_onnx(model, folder / f"{arch}.onnx", input_size=input_size))
    export_seconds["onnxruntime"] = time.perf_counter() - start
    if openvino_dtype is not None:
        start = time.perf_counter()
        path = export_openvino(model, folder / f"{arch}.xml", input_size=input_size, dtype=openvino_dtype)
        found["OpenVINO"] = load_network(path)
        export_seconds["OpenVINO"] = time.perf_counter() - start
    return found, export_seconds


def bench(arch: str, input_size, batch: int, repeats: int, warmup: int, openvino_dtype, folder: Path) -> dict:
    found, export_seconds = runtimes(arch, input_size, openvino_dtype, folder)
    x = torch.randn(batch, 3, *input_size, generator=torch.Generator().manual_seed(1))
    for _ in range(warmup):
        for run in found.values():
            run(x)
    times: dict[str, list[float]] = {name: [] for name in found}
    for _ in range(repeats):  # alternating, so load changes hit every runtime alike
        for name, run in found.items():
            times[name].append(timed(run, x))
    reference = found["PyTorch"](x).numpy()
    rows = {}
    for name, run in found.items():
        milliseconds = 1000 * sorted(times[name])[repeats // 2] / batch
        max_rel, rms_rel = tensor_rule(run(x).numpy(), reference)
        rows[name] = {"ms": milliseconds, "max_rel": max_rel, "rms_rel": rms_rel, "export_s": export_seconds.get(name)}
    for row in rows.values():
        row["speedup"] = rows["PyTorch"]["ms"] / row["ms"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", default=None, help="tiny or an arch name (repeatable)")
    parser.add_argument("--input-size", nargs=2, type=int, default=(256, 192), metavar=("H", "W"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="threads for every runtime (default: torch's)")
    parser.add_argument("--openvino-dtype", choices=("fp32", "fp16", "int8"), default="fp32",
                        help="the OpenVINO IR's weights (it computes in float32 either way)")  # fmt: skip
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import onnxruntime

    versions = f"onnxruntime {onnxruntime.__version__}"
    openvino_dtype = args.openvino_dtype
    if importlib.util.find_spec("openvino") is None:
        openvino_dtype = None
        versions += ", OpenVINO not installed (pip install 'sapiens2[openvino]'): left out"
    else:
        import openvino

        versions += f", OpenVINO {openvino.get_version()} ({args.openvino_dtype} weights)"
    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads), {versions}, input "
          f"{args.input_size[0]}x{args.input_size[1]}, batch {args.batch}, median of {args.repeats}")  # fmt: skip
    print()
    print("| backbone | runtime | ms/img | speed-up over PyTorch | max_rel | rms_rel | export s |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for arch in args.arch or ["tiny", "sapiens2_0.1b"]:
            rows = bench(arch, tuple(args.input_size), args.batch, args.repeats, args.warmup, openvino_dtype,
                         Path(folder))  # fmt: skip
            for name, row in rows.items():
                export = "" if row["export_s"] is None else f"{row['export_s']:.0f}"
                print(
                    f"| {arch} | {name} | {row['ms']:.2f} | {row['speedup']:.2f}x | {row['max_rel']:.1e} | "
                    f"{row['rms_rel']:.1e} | {export} |"
                )


if __name__ == "__main__":
    main()
