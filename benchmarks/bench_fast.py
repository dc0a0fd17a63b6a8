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
from sapiens2.models.fast import make_fast
from sapiens2.transformers_format import TRANSFORMERS_CLASSES


def _network(task: str, arch: str, size: tuple[int, int], dtype: torch.dtype, state: dict | None) -> torch.nn.Module:
    torch.manual_seed(0)
    model = (
        Sapiens2(arch, img_size=size, out_type="featmap")
        if task == "backbone"
        else build_model(task, arch, input_size=size)
    )
    if state is not None:
        model.load_state_dict(state)
    return model.to(dtype).eval()


def _transformers(task: str, model: torch.nn.Module, folder: Path, dtype: torch.dtype) -> Callable:
    import transformers

    save_transformers(model, folder)
    name = "Sapiens2Model" if task == "backbone" else TRANSFORMERS_CLASSES[task]
    hf = getattr(transformers, name).from_pretrained(folder, dtype=dtype).eval()
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
    state = _network("pose", args.arch, size, torch.float32, None).state_dict()
    rng = torch.Generator().manual_seed(2)
    image = torch.randint(0, 256, (1080, 1920, 3), generator=rng, dtype=torch.uint8).numpy()
    boxes = [[100 + 280 * i, 150 + 20 * i, 330 + 280 * i, 900 + 20 * i] for i in range(args.pose_people)]
    people = args.pose_people
    runs = {
        "official demo's way (fp32, 1 crop/forward, numpy decode)": ("reference", torch.float32, 1),
        f"ours reference fp32, {people} crops/forward": ("reference", torch.float32, people),
        f"ours fast fp32, {people} crops + mirrors in one forward, torch decode": ("fast", torch.float32, people),
    }
    if args.bf16:
        runs[f"ours fast bf16, {people} crops + mirrors in one forward"] = ("fast", torch.bfloat16, people)
    predictors = {}
    for label, (mode, dtype, batch) in runs.items():
        model = _network("pose", args.arch, size, dtype, state)
        options = {"input_size": size, "batch_size": batch, "detector": None, "mode": mode}
        predictors[label] = Predictor("pose", model=model, device="cpu", dtype=dtype, **options)
    times: dict[str, list[float]] = {label: [] for label in runs}
    results = {label: predictor(image, boxes=boxes) for label, predictor in predictors.items()}  # warm-up
    for _ in range(args.repeats):
        for label, predictor in predictors.items():
            start = time.perf_counter()
            predictor(image, boxes=boxes)
            times[label].append(time.perf_counter() - start)
    want = next(iter(results.values())).keypoints
    baseline = statistics.median(next(iter(times.values())))
    print(f"\npose {args.arch} {size[0]}x{size[1]}, {people} people on a 1080x1920 image, {args.threads} threads, "
          f"{args.repeats} alternating rounds, torch {torch.__version__}")  # fmt: skip
    # Random weights give flat heatmaps whose peaks are unstable: the median movement is the meaningful figure.
    print("| run | ms/image | persons/s | vs official way | median keypoint px vs official way |")
    print("|---|---|---|---|---|")
    for label, values in times.items():
        median = statistics.median(values)
        moved = float(np.median(np.abs(results[label].keypoints - want)))
        print(f"| {label} | {1000 * median:.0f} | {people / median:.2f} | {baseline / median:.2f}× | {moved:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="backbone", choices=("backbone", *TRANSFORMERS_CLASSES, "albedo"))
    parser.add_argument("--arch", default="sapiens2_0.1b")
    parser.add_argument("--resolution", type=int, nargs=2, default=(512, 384), metavar=("H", "W"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--bf16", action="store_true", help="add the bf16 fast mode and bf16 transformers rows")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--pose-people", type=int, default=0, help="time Predictor('pose') end to end instead")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.pose_people:
        pose_end_to_end(args)
        return
    size = tuple(args.resolution)
    reference = _network(args.task, args.arch, size, torch.float32, None)
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            if name.endswith("gamma.weight"):
                parameter.fill_(1.0)
    state = reference.state_dict()
    x = torch.randn(args.batch, 3, *size, generator=torch.Generator().manual_seed(1))

    variants: dict[str, tuple[Callable, torch.dtype]] = {}
    variants["official demo's way (fp32, 1 image/forward)"] = (
        lambda images: torch.cat([_first_tensor(reference(image[None])) for image in images]),
        torch.float32,
    )
    variants[f"ours reference fp32, batch {args.batch}"] = (reference, torch.float32)
    variants[f"ours fast fp32, batch {args.batch}"] = (
        make_fast(_network(args.task, args.arch, size, torch.float32, state)),
        torch.float32,
    )
    if args.bf16:
        fast_bf16 = make_fast(_network(args.task, args.arch, size, torch.bfloat16, state))
        variants[f"ours fast bf16, batch {args.batch}"] = (fast_bf16, torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_transformers and args.task != "albedo":
            for dtype in (torch.float32, torch.bfloat16) if args.bf16 else (torch.float32,):
                label = f"transformers {str(dtype).removeprefix('torch.')}, batch {args.batch}"
                variants[label] = (_transformers(args.task, reference, Path(tmp) / label[:20], dtype), dtype)
        times: dict[str, list[float]] = {label: [] for label in variants}
        faults: dict[str, list[int]] = {label: [] for label in variants}
        cpu: dict[str, list[float]] = {label: [] for label in variants}
        outputs: dict[str, torch.Tensor] = {}
        with torch.inference_mode():
            for label, (function, dtype) in variants.items():
                for _ in range(args.warmup):
                    outputs[label] = _first_tensor(function(x.to(dtype))).float()
            for _ in range(args.repeats):
                for label, (function, dtype) in variants.items():
                    inputs = x.to(dtype)
                    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    start, start_cpu = time.perf_counter(), time.process_time()
                    function(inputs)
                    times[label].append(time.perf_counter() - start)
                    cpu[label].append(time.process_time() - start_cpu)
                    faults[label].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    want = outputs[f"ours reference fp32, batch {args.batch}"]
    baseline = statistics.median(times["official demo's way (fp32, 1 image/forward)"])
    ours = statistics.median(times[f"ours reference fp32, batch {args.batch}"])
    print(
        f"\n{args.task} {args.arch} {size[0]}x{size[1]} batch {args.batch}, {args.threads} threads, "
        f"{args.repeats} alternating rounds, torch {torch.__version__}, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, 'cpu') else '?'}"
    )
    # CPU seconds (all threads) beside wall time: on a machine shared with other work they move less.
    print("| run | ms/image | vs official way | vs ours reference | CPU s/image (ratio vs ours reference) | "
          "page faults/image | max rel vs fp32 ref |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    ours_cpu = statistics.median(cpu[f"ours reference fp32, batch {args.batch}"])
    for label, values in times.items():
        median = statistics.median(values)
        got = outputs[label]
        distance = "(layout differs)"
        if got.shape == want.shape:
            distance = f"{float((got - want).abs().max() / want.abs().max()):.1e}"
        print(
            f"| {label} | {1000 * median / args.batch:.1f} | {baseline / median:.2f}× | {ours / median:.2f}× | "
            f"{statistics.median(cpu[label]) / args.batch:.2f} ({ours_cpu / statistics.median(cpu[label]):.2f}×) | "
            f"{statistics.median(faults[label]) / args.batch:.0f} | {distance} |"
        )


if __name__ == "__main__":
    main()
