"""Our fast mode against onnxruntime and OpenVINO running our ONNX export on the CPU, in one alternating run.

Issue #38's CPU comparison: for each ``--arch`` and ``--batch``, the backbone (random weights, LayerScale 1) runs these
ways on the same input in the same process, alternating, ``--repeats`` rounds of one timed forward each after
warm-ups, so drifting machine load hits all alike; every runtime gets ``--threads``:

- ``PyTorch``: our reference mode in float32 (the official numerics), the baseline of the speed-up column;
- ``ours fast``: ``make_fast`` in the precision fast mode picks for this CPU (``fast_precision``: bf16 only where
  the CPU computes it natively, with the reason printed), and with ``--compiled`` also through ``CompiledBuckets``
  (Inductor, weights frozen);
- ``onnxruntime``: the fp32 ONNX export (``sapiens2.export.export_onnx``) on its CPU provider, through
  ``sapiens2.export.load_network`` as ``Predictor`` runs it (it computes in float32);
- ``OpenVINO f32``: the OpenVINO IR export (``--openvino-dtype`` weights) on its CPU plugin through ``load_network``,
  computing in float32 as ``Predictor`` runs it;
- ``OpenVINO default``: the same ONNX file compiled by OpenVINO's CPU plugin with its own default precision (bf16
  on CPUs with native bf16): what a user picking OpenVINO for speed gets.

Prints one Markdown table per model and batch (median ms per image, speed-up over ``PyTorch``, the precision each
computes in, and the parity of each output against ``PyTorch`` by the fixtures' tensor rule), then the goal table:
ours fast (the faster of its rows) against the faster of onnxruntime and OpenVINO (issue #38: >= 1.2x). OpenVINO is
left out (and said so) when not installed.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_export.py --arch sapiens2_0.1b --arch sapiens2_0.4b \
        --input-size 512 384 --batch 1 4 --threads 2 --repeats 10 --compiled
    python benchmarks/bench_export.py --arch tiny --input-size 64 48 --batch 1 4 --repeats 2   # checks the script
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sapiens2 import Sapiens2
from sapiens2.benchmark import cpu_info
from sapiens2.export import export_onnx, export_openvino, load_network
from sapiens2.export.check import tensor_rule
from sapiens2.models.fast import CompiledBuckets, fast_precision, make_fast
from sapiens2.models.threads import wait_policy

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


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def runtimes(arch: str, input_size: tuple[int, int], openvino_dtype: str | None, compiled: bool,
             folder: Path) -> tuple[dict, dict, dict]:  # fmt: skip
    """name -> callable mapping float32 images to float32 features, name -> seconds its export took, name -> the
    precision it computes in."""
    model = _backbone(arch, input_size)
    precision = fast_precision("cpu").dtype

    def eager(network, dtype=torch.float32):
        def run(images: torch.Tensor) -> torch.Tensor:
            with torch.inference_mode():
                return network(images.to(dtype))[0].float()

        return run

    found = {"PyTorch": eager(model)}
    computes = {"PyTorch": "fp32"}
    fast = make_fast(_backbone(arch, input_size).to(precision))
    found[f"ours fast {_dtype_name(precision)}"] = eager(fast, precision)
    if compiled:  # Inductor packs the weights itself (freezing): a model without the eager oneDNN packing
        network = CompiledBuckets(make_fast(_backbone(arch, input_size).to(precision), pack_linears=False))
        found[f"ours fast {_dtype_name(precision)} compiled"] = eager(network, precision)
    for name in found:
        computes.setdefault(name, _dtype_name(precision))
    export_seconds = {}
    start = time.perf_counter()
    onnx_path = export_onnx(model, folder / f"{arch}.onnx", input_size=input_size)
    found["onnxruntime"] = load_network(onnx_path)
    export_seconds["onnxruntime"], computes["onnxruntime"] = time.perf_counter() - start, "fp32"
    if openvino_dtype is not None:
        start = time.perf_counter()
        path = export_openvino(model, folder / f"{arch}.xml", input_size=input_size, dtype=openvino_dtype)
        found["OpenVINO f32"] = load_network(path)
        export_seconds["OpenVINO f32"], computes["OpenVINO f32"] = time.perf_counter() - start, "fp32"
        found["OpenVINO default"], computes["OpenVINO default"] = _openvino_default(onnx_path)
    return found, export_seconds, computes


def _openvino_default(onnx_path: Path) -> tuple:
    """Our ONNX compiled by OpenVINO's CPU plugin as it comes (only the thread count set), and the precision it
    picked (``INFERENCE_PRECISION_HINT``)."""
    import openvino

    compiled = openvino.Core().compile_model(str(onnx_path), "CPU", {"INFERENCE_NUM_THREADS": torch.get_num_threads()})
    request = compiled.create_infer_request()

    def run(images: torch.Tensor) -> torch.Tensor:
        request.infer({0: images.contiguous().numpy()})
        return torch.from_numpy(request.get_output_tensor(0).data.copy())

    hint = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
    return run, {"<Type: 'bfloat16'>": "bf16", "<Type: 'float32'>": "fp32", "<Type: 'float16'>": "fp16"}.get(
        hint, hint)  # fmt: skip


def bench(found: dict, input_size, batch: int, repeats: int, warmup: int) -> dict:
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
        milliseconds = 1000 * statistics.median(times[name]) / batch
        max_rel, rms_rel = tensor_rule(run(x).numpy(), reference)
        rows[name] = {"ms": milliseconds, "max_rel": max_rel, "rms_rel": rms_rel}
    for row in rows.values():
        row["speedup"] = rows["PyTorch"]["ms"] / row["ms"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", default=None, help="tiny or an arch name (repeatable)")
    parser.add_argument("--input-size", nargs=2, type=int, default=(512, 384), metavar=("H", "W"))
    parser.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes (default 1)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="threads for every runtime (default: torch's)")
    parser.add_argument("--compiled", action="store_true", help="add ours fast through torch.compile (freezing)")
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

        versions += f", OpenVINO {openvino.get_version()} (IR with {args.openvino_dtype} weights)"
    info = cpu_info()
    print(f"{info.model}; ISA {' '.join(info.features)}; torch {torch.__version__} kernels {info.capability}, "
          f"{torch.get_num_threads()} threads, OMP_WAIT_POLICY {wait_policy()}; {versions}; input "
          f"{args.input_size[0]}x{args.input_size[1]}, median of {args.repeats} alternating rounds")  # fmt: skip
    print(f"ours fast: {fast_precision('cpu').reason}")
    goal = []
    size = tuple(args.input_size)
    with tempfile.TemporaryDirectory() as folder:
        for arch in args.arch or ["tiny", "sapiens2_0.1b"]:
            found, export_seconds, computes = runtimes(arch, size, openvino_dtype, args.compiled, Path(folder))
            for batch in args.batch:
                rows = bench(found, size, batch, args.repeats, args.warmup)
                print(f"\n### {arch}, batch {batch}\n")
                print("| runtime | computes in | ms/img | speed-up over PyTorch | max_rel | rms_rel | export s |")
                print("|---|---|---|---|---|---|---|")
                for name, row in rows.items():
                    export = "" if name not in export_seconds else f"{export_seconds[name]:.0f}"
                    print(f"| {name} | {computes[name]} | {row['ms']:.2f} | {row['speedup']:.2f}x | "
                          f"{row['max_rel']:.1e} | {row['rms_rel']:.1e} | {export} |", flush=True)  # fmt: skip
                ours = min((n for n in rows if n.startswith("ours")), key=lambda n: rows[n]["ms"])
                other = min((n for n in rows if not n.startswith(("ours", "PyTorch"))), key=lambda n: rows[n]["ms"])
                goal.append((arch, batch, ours, other, rows[ours]["ms"], rows[other]["ms"]))
            del found
    print("\n### Goal (issue #38): ours fast >= 1.2x the faster of onnxruntime and OpenVINO\n")
    print("| model | batch | ours (fastest row) | ms/img | faster runtime | ms/img | ours vs it | >= 1.2x |")
    print("|---|---|---|---|---|---|---|---|")
    for arch, batch, ours, other, mine, theirs in goal:
        print(f"| {arch} | {batch} | {ours} | {mine:.2f} | {other} | {theirs:.2f} | {theirs / mine:.2f}x | "
              f"{'met' if theirs / mine >= 1.2 else 'not met'} |")  # fmt: skip


if __name__ == "__main__":
    main()
