"""The CPU levers of issue #25 on one machine, in alternating rounds: fast mode, bf16, Inductor with freezing, int8.

Every variant runs the same 0.1b-style backbone (random weights, LayerScale 1 so activations have realistic
magnitudes) on the same normalised photo crop; the variants alternate, one timed call each per round, after a
warm-up (which compiles the compiled ones). Prints a Markdown table: median ms per image, speed and CPU-time ratio
against our fp32 reference, and the distance of the output from the fp32 reference (max|d| / max|ref| and the
cosine similarity of the feature maps). ``--profile VARIANT`` prints where one variant's time goes instead.

    python benchmarks/cpu_levers.py --batch 1 --repeats 3
    python benchmarks/cpu_levers.py --batch 4 --repeats 2 --variants ref-fp32 fast-bf16 int8
    python benchmarks/cpu_levers.py --profile fast-fp32
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/cpu_levers.py \
        --threads 2 --variants fast-fp32 ref-bf16 fast-bf16-plain fast-bf16-onednn-fp32   # an AVX2-only CPU
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from sapiens2 import Sapiens2, save_transformers
from sapiens2.benchmark import cpu_info
from sapiens2.data.io import read_image
from sapiens2.models.fast import LINEAR_PATHS, CompiledBuckets, make_fast
from sapiens2.models.lowp import quantize
from sapiens2.models.threads import wait_policy

PHOTO = Path(__file__).resolve().parent.parent / "tests" / "data" / "astronaut.png"
VARIANTS = ("ref-fp32", "fast-fp32", "fast-fp32-compiled", "fast-bf16", "fast-bf16-compiled", "transformers-fp32",
            "transformers-bf16", "int8", "int8-compiled", "int8-weight")  # fmt: skip
PATH_VARIANTS = ("ref-bf16", "fast-bf16-onednn", "fast-bf16-onednn-fp32", "fast-bf16-plain")
# fast-bf16-PATH: the block linears forced onto one of models.fast.LINEAR_PATHS (fast-bf16: choose_linear_path's pick);
# on an AVX2-only CPU (or under ONEDNN_MAX_CPU_ISA=AVX2) fast-bf16-onednn is refused, so leave it out there.


def build(variant: str, arch: str, size: tuple[int, int], state: dict, folder: Path) -> Callable:
    dtype = torch.bfloat16 if "bf16" in variant else torch.float32
    if variant.startswith("transformers"):
        import transformers

        hf = transformers.Sapiens2Model.from_pretrained(folder, dtype=dtype).eval()

        def featmap(x: torch.Tensor) -> torch.Tensor:  # tokens after the 9 prefix ones, as our (B, D, Hp, Wp)
            tokens = hf(pixel_values=x).last_hidden_state[:, 9:]
            return tokens.reshape(x.shape[0], x.shape[2] // 16, x.shape[3] // 16, -1).permute(0, 3, 1, 2)

        return featmap
    model = Sapiens2(arch, img_size=size, out_type="featmap", dtype=dtype)
    model.load_state_dict(state)
    model.eval()
    if variant.startswith("ref-"):
        return model
    compiled = variant.endswith("compiled")
    quantized = variant.startswith("int8")
    path = next((p for p in LINEAR_PATHS if variant == f"fast-bf16-{p}"), None)
    model = make_fast(model, pack_linears=False if compiled or quantized else path)
    if quantized:
        model = quantize(model, "int8-weight" if variant == "int8-weight" else "int8")
    return CompiledBuckets(model) if compiled else model


def first_tensor(output) -> torch.Tensor:
    while isinstance(output, (tuple, list)):
        output = output[0]
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sapiens2_0.1b")
    parser.add_argument("--input-size", type=int, nargs=2, default=(512, 384), metavar=("H", "W"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS + PATH_VARIANTS)
    parser.add_argument("--profile", choices=VARIANTS + PATH_VARIANTS, default=None, help="profile one variant instead")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    size = tuple(args.input_size)
    torch.manual_seed(0)
    reference = Sapiens2(args.arch, img_size=size, out_type="featmap").eval()
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            if name.endswith("gamma.weight"):
                parameter.fill_(1.0)
    state = reference.state_dict()
    image = torch.from_numpy(np.ascontiguousarray(read_image(PHOTO))).permute(2, 0, 1).float()
    image = torch.nn.functional.interpolate(image[None], size=size, mode="bilinear", antialias=True)
    mean, std = torch.tensor([123.675, 116.28, 103.53]), torch.tensor([58.395, 57.12, 57.375])
    x = ((image - mean[:, None, None]) / std[:, None, None]).repeat(args.batch, 1, 1, 1)
    info = cpu_info()
    print(f"{info.model}; ISA {' '.join(info.features)}; torch {torch.__version__} kernels {info.capability}; "
          f"{torch.get_num_threads()} threads, OMP_WAIT_POLICY {wait_policy()}; {args.arch} {size[0]}x{size[1]} "
          f"batch {args.batch}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        if any(v.startswith("transformers") for v in (*args.variants, args.profile or "")):
            save_transformers(reference, tmp)
        if args.profile:
            network = build(args.profile, args.arch, size, state, Path(tmp))
            xv = x.to(torch.bfloat16 if "bf16" in args.profile else torch.float32)
            network(xv)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                network(xv)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
            return
        networks = {}
        for variant in args.variants:
            networks[variant] = build(variant, args.arch, size, state, Path(tmp))
        outputs, wall, cpu = {}, {v: [] for v in networks}, {v: [] for v in networks}
        for variant, network in networks.items():  # warm-up: compiles, packs, caches
            outputs[variant] = first_tensor(network(x.to(torch.bfloat16 if "bf16" in variant else torch.float32)))
            outputs[variant] = outputs[variant].float()
        for _ in range(args.repeats):
            for variant, network in networks.items():
                xv = x.to(torch.bfloat16 if "bf16" in variant else torch.float32)
                start, start_cpu = time.perf_counter(), time.process_time()
                network(xv)
                wall[variant].append(time.perf_counter() - start)
                cpu[variant].append(time.process_time() - start_cpu)
    ref = outputs[args.variants[0]]
    base_wall, base_cpu = statistics.median(wall[args.variants[0]]), statistics.median(cpu[args.variants[0]])
    print(f"\n| variant | ms/image | vs {args.variants[0]} (wall) | CPU time ratio | max rel vs {args.variants[0]} "
          "| cosine |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for variant in networks:
        w, c = statistics.median(wall[variant]), statistics.median(cpu[variant])
        out = outputs[variant]
        rel = float((out - ref).abs().max() / ref.abs().max())
        cosine = float(torch.nn.functional.cosine_similarity(out.flatten(1), ref.flatten(1)).min())
        print(f"| {variant} | {1000 * w / args.batch:.0f} | {base_wall / w:.2f}× | {base_cpu / c:.2f}× | {rel:.1e} "
              f"| {cosine:.5f} |")  # fmt: skip


if __name__ == "__main__":
    main()
