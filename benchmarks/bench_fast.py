"""Fast mode against reference mode, transformers' port and the official demo's way, in one run (issue #11).

Every variant runs the same network (random weights, LayerScale 1 so activations have realistic magnitudes) on the
same random normalised batch; the variants alternate, one timed call each per round, after warm-up. Prints a
Markdown table: median ms per image, speed against the official demo's way and against our reference mode, minor
page faults per image, and the output's distance from the fp32 reference (max|d| / max|ref|).

With ``--pose-people N`` the pose pipeline is timed end to end through ``Predictor`` instead (N person boxes on one
1080x1920 image: crops, forward with flip test, decode): the official way is one crop per forward with the flipped
crop in a second forward and the numpy decoder; fast mode puts the crops and their mirrors in one forward and decodes
in torch.

Variants: the official demo's way (fp32, one image per forward: our reference network, which is the official op
order), ours reference, ours fast (fp32; bf16 with ``--bf16``), transformers' port (fp32; bf16 with ``--bf16``).

    python benchmarks/bench_fast.py --task backbone --arch sapiens2_0.1b --resolution 512 384 --threads 2 --bf16
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from sapiens2 import Sapiens2, build_model, save_transformers
from sapiens2.benchmark import device_peak_tflops
from sapiens2.models.fast import CompiledBuckets, attention_backends, make_fast
from sapiens2.models.zoo import get_arch
from sapiens2.transformers_format import TRANSFORMERS_CLASSES

TINY_ARCH = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}
"""``--arch tiny``: a 2-block model of width 32, to check the script (``benchmarks/gpu_session.sh --tiny``)."""


def _network(
    task: str, arch: str, size: tuple[int, int], dtype: torch.dtype, state: dict | None, device: str = "cpu"
) -> torch.nn.Module:
    """The network with ``state`` (or seeded random weights), built straight on ``device`` in ``dtype``."""
    torch.manual_seed(0)
    options = {"device": device, "dtype": dtype}
    arch = TINY_ARCH if arch == "tiny" else arch
    model = (
        Sapiens2(arch, img_size=size, out_type="featmap", **options)
        if task == "backbone"
        else build_model(task, arch, input_size=size, **options)
    )
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def _transformers(
    task: str, model: torch.nn.Module, folder: Path, dtype: torch.dtype, device: torch.device
) -> Callable:
    import transformers

    save_transformers(model, folder)
    name = "Sapiens2Model" if task == "backbone" else TRANSFORMERS_CLASSES[task]
    hf = getattr(transformers, name).from_pretrained(folder, dtype=dtype).to(device).eval()
    if task == "backbone":

        def featmap(x: torch.Tensor) -> torch.Tensor:  # (B, 9 + Hp*Wp, D) -> (B, D, Hp, Wp), as ours
            tokens = hf(pixel_values=x).last_hidden_state[:, 9:]
            return tokens.reshape(x.shape[0], x.shape[2] // 16, x.shape[3] // 16, -1).permute(0, 3, 1, 2)

        return featmap
    return lambda x: hf(pixel_values=x)


def _first_tensor(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return _first_tensor(output[0])
    for value in output.values():  # a transformers ModelOutput
        if isinstance(value, torch.Tensor):
            return value
    raise TypeError(f"no tensor in {type(output).__name__}")


def pose_end_to_end(args: argparse.Namespace) -> None:
    """Persons/s of Predictor("pose") on one 1080x1920 image with ``--pose-people`` given boxes."""
    from sapiens2 import Predictor

    size = tuple(args.resolution)
    state = _network("pose", args.arch, size, torch.float32, None, args.device).state_dict()  # init on the device
    rng = torch.Generator().manual_seed(2)
    image = torch.randint(0, 256, (1080, 1920, 3), generator=rng, dtype=torch.uint8).numpy()
    boxes = [[100 + 280 * i, 150 + 20 * i, 330 + 280 * i, 900 + 20 * i] for i in range(args.pose_people)]
    people = args.pose_people
    runs = {}  # label: (mode, dtype, crops per forward, compile, fused kernels)
    if not args.no_official:
        runs["official demo's way (fp32, 1 crop/forward, numpy decode)"] = ("reference", torch.float32, 1, False, False)
    runs[f"ours reference fp32, {people} crops/forward"] = ("reference", torch.float32, people, False, False)
    if not args.no_fp32:
        runs[f"ours fast fp32, {people} crops + mirrors in one forward, torch decode"] = (
            "fast", torch.float32, people, False, False)  # fmt: skip
    if args.bf16:
        runs[f"ours reference bf16, {people} crops/forward"] = ("reference", torch.bfloat16, people, False, False)
        runs[f"ours fast bf16, {people} crops + mirrors in one forward"] = (
            "fast", torch.bfloat16, people, False, False)  # fmt: skip
        if args.fused:
            runs[f"ours fast bf16 + fused kernels, {people} crops + mirrors"] = (
                "fast", torch.bfloat16, people, False, True)  # fmt: skip
        if args.compile and not args.fused:  # with --fused only the compiled row with the kernels (compile time)
            runs[f"ours fast bf16 compiled, {people} crops + mirrors"] = ("fast", torch.bfloat16, people, True, False)
        if args.compile and args.fused:
            runs[f"ours fast bf16 compiled + fused kernels, {people} crops + mirrors"] = (
                "fast", torch.bfloat16, people, True, True)  # fmt: skip
    predictors = {}
    for label, (mode, dtype, batch, compiled, fused) in runs.items():
        model = _network("pose", args.arch, size, dtype, state, args.device)
        options = {"input_size": size, "batch_size": batch, "detector": None, "mode": mode, "compile": compiled}
        predictors[label] = Predictor("pose", model=model, device=args.device, dtype=dtype, **options)
        if mode == "fast":  # the Predictor's default is on where the kernels run: each row says which it times
            make_fast(predictors[label].model, pack_linears=False if compiled else None, fused_kernels=fused)
    device = torch.device(args.device)
    times: dict[str, list[float]] = {label: [] for label in runs}
    results = {}
    for label, predictor in predictors.items():  # warm-up (compiles), with progress: a time limit may cut it short
        start = time.perf_counter()
        results[label] = predictor(image, boxes=boxes)
        print(f"warm-up {label}: {time.perf_counter() - start:.1f} s", flush=True)
    for _ in range(args.repeats):
        for label, predictor in predictors.items():
            _synchronize(device)
            start = time.perf_counter()
            predictor(image, boxes=boxes)
            _synchronize(device)
            times[label].append(time.perf_counter() - start)
    want = next(iter(results.values())).keypoints
    baseline = statistics.median(next(iter(times.values())))
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{args.threads} threads"
    print(f"\npose {args.arch} {size[0]}x{size[1]}, {people} people on a 1080x1920 image, {where}, "
          f"{args.repeats} alternating rounds, torch {torch.__version__}")  # fmt: skip
    # Random weights give flat heatmaps whose peaks are unstable: the median movement is the meaningful figure.
    bf16 = next((statistics.median(v) for label, v in times.items() if label.startswith("ours reference bf16")), None)
    print("| run | ms/image | persons/s | vs first row | vs ours reference bf16 | median keypoint px vs first row |")
    print("|---|---|---|---|---|---|")
    for label, values in times.items():
        median = statistics.median(values)
        moved = float(np.median(np.abs(results[label].keypoints - want)))
        versus = "-" if bf16 is None else f"{bf16 / median:.2f}×"
        print(f"| {label} | {1000 * median:.0f} | {people / median:.2f} | {baseline / median:.2f}× | {versus} | "
              f"{moved:.3f} |")  # fmt: skip


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="backbone", choices=("backbone", *TRANSFORMERS_CLASSES, "albedo"))
    parser.add_argument("--arch", default="sapiens2_0.1b", help="an arch name, or tiny (checks the script)")
    parser.add_argument("--resolution", type=int, nargs=2, default=(512, 384), metavar=("H", "W"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--bf16", action="store_true", help="add bf16 rows (ours reference, ours fast, transformers)")
    parser.add_argument("--compile", action="store_true", help="add ours fast compiled (static shapes; CUDA graphs)")
    parser.add_argument("--fused", action="store_true",
                        help="add fast bf16 rows with the fused Triton kernels (CUDA; the other fast rows go without)")
    parser.add_argument("--no-official", action="store_true", help="leave out the official demo's way (fp32 rows)")
    parser.add_argument("--no-fp32", action="store_true", help="leave out every fp32 row but the reference")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--pose-people", type=int, default=0, help="time Predictor('pose') end to end instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.pose_people:
        pose_end_to_end(args)
        return
    size = tuple(args.resolution)
    reference = _network(args.task, args.arch, size, torch.float32, None, args.device)
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            if name.endswith("gamma.weight"):
                parameter.fill_(1.0)
    state = reference.state_dict()
    x = torch.randn(args.batch, 3, *size, generator=torch.Generator().manual_seed(1)).to(device)
    batch = args.batch

    def fast(dtype: torch.dtype, compiled: bool = False, fused: bool = False) -> Callable:
        network = _network(args.task, args.arch, size, dtype, state, args.device)
        # Inductor packs the weights itself: the eager oneDNN packing is left out of a compiled network.
        network = make_fast(network, pack_linears=False if compiled else None, fused_kernels=fused)
        return CompiledBuckets(network, cuda_graphs=True) if compiled else network

    variants: dict[str, tuple[Callable, torch.dtype]] = {}
    if not args.no_official:
        variants["official demo's way (fp32, 1 image/forward)"] = (
            lambda images: torch.cat([_first_tensor(reference(image[None])) for image in images]),
            torch.float32,
        )
    variants[f"ours reference fp32, batch {batch}"] = (reference, torch.float32)
    if not args.no_fp32:
        variants[f"ours fast fp32, batch {batch}"] = (fast(torch.float32), torch.float32)
    if args.bf16:
        variants[f"ours reference bf16, batch {batch}"] = (
            _network(args.task, args.arch, size, torch.bfloat16, state, args.device),
            torch.bfloat16,
        )
        variants[f"ours fast bf16, batch {batch}"] = (fast(torch.bfloat16), torch.bfloat16)
        if args.fused:
            variants[f"ours fast bf16 + fused kernels, batch {batch}"] = (
                fast(torch.bfloat16, fused=True), torch.bfloat16)  # fmt: skip
        if args.compile:
            variants[f"ours fast bf16 compiled, batch {batch}"] = (fast(torch.bfloat16, True), torch.bfloat16)
        if args.compile and args.fused:
            variants[f"ours fast bf16 compiled + fused kernels, batch {batch}"] = (
                fast(torch.bfloat16, True, fused=True), torch.bfloat16)  # fmt: skip
    if args.compile and not args.no_fp32:
        variants[f"ours fast fp32 compiled, batch {batch}"] = (fast(torch.float32, True), torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_transformers and args.task != "albedo":
            dtypes = (torch.float32, torch.bfloat16) if args.bf16 else (torch.float32,)
            for dtype in dtypes[1:] if args.no_fp32 else dtypes:
                label = f"transformers {str(dtype).removeprefix('torch.')}, batch {batch}"
                folder = Path(tmp) / label[:20]
                variants[label] = (_transformers(args.task, reference, folder, dtype, device), dtype)
        times: dict[str, list[float]] = {label: [] for label in variants}
        faults: dict[str, list[int]] = {label: [] for label in variants}
        cpu: dict[str, list[float]] = {label: [] for label in variants}
        extra_memory: dict[str, float] = {}
        outputs: dict[str, torch.Tensor] = {}
        with torch.inference_mode(), attention_backends(device):
            for label, (function, dtype) in variants.items():
                _synchronize(device)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                resident = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
                start = time.perf_counter()
                for _ in range(args.warmup):
                    outputs[label] = _first_tensor(function(x.to(dtype))).float().clone()
                _synchronize(device)
                print(f"warm-up {label}: {time.perf_counter() - start:.1f} s", flush=True)
                if device.type == "cuda":
                    extra_memory[label] = (torch.cuda.max_memory_allocated(device) - resident) / 2**30
            for _ in range(args.repeats):
                for label, (function, dtype) in variants.items():
                    inputs = x.to(dtype)
                    _synchronize(device)
                    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    start, start_cpu = time.perf_counter(), time.process_time()
                    function(inputs)
                    _synchronize(device)
                    times[label].append(time.perf_counter() - start)
                    cpu[label].append(time.process_time() - start_cpu)
                    faults[label].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    ours_label = f"ours reference fp32, batch {batch}"
    want = outputs[ours_label].cpu()
    baseline = statistics.median(next(iter(times.values())))
    ours = statistics.median(times[ours_label])
    where = (
        f"{torch.cuda.get_device_name(device)}"
        if device.type == "cuda"
        else f"{args.threads} threads, CPU capability {torch.backends.cpu.get_cpu_capability()}"
    )
    print(
        f"\n{args.task} {args.arch} {size[0]}x{size[1]} batch {batch}, {where}, {args.repeats} alternating rounds, "
        f"torch {torch.__version__}"
    )
    if device.type == "cuda":
        # FLOPs of the backbone from the arch table (heads not counted here: `sapiens2 benchmark` counts them).
        flops = get_arch(args.arch).flops(size)
        print("| run | ms/image | vs first row | vs ours reference fp32 | backbone TFLOP/s | MFU | "
              "activation peak GiB | max rel vs fp32 ref |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
    else:
        print("| run | ms/image | vs official way | vs ours reference | CPU s/image (ratio vs ours reference) | "
              "page faults/image | max rel vs fp32 ref |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
    ours_cpu = statistics.median(cpu[ours_label])
    for label, values in times.items():
        median = statistics.median(values)
        got = outputs[label].cpu()
        distance = "(layout differs)"
        if got.shape == want.shape:
            distance = f"{float((got - want).abs().max() / want.abs().max()):.1e}"
        if device.type == "cuda":
            tflops = flops * batch / median / 1e12
            peak = device_peak_tflops(device, variants[label][1])
            mfu = f"{100 * tflops / peak:.1f} %" if peak else "n/a"
            print(
                f"| {label} | {1000 * median / batch:.2f} | {baseline / median:.2f}× | {ours / median:.2f}× | "
                f"{tflops:.0f} | {mfu} | {extra_memory[label]:.2f} | {distance} |"
            )
            continue
        print(
            f"| {label} | {1000 * median / batch:.1f} | {baseline / median:.2f}× | {ours / median:.2f}× | "
            f"{statistics.median(cpu[label]) / batch:.2f} ({ours_cpu / statistics.median(cpu[label]):.2f}×) | "
            f"{statistics.median(faults[label]) / batch:.0f} | {distance} |"
        )


if __name__ == "__main__":
    main()
