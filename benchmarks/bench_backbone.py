"""Backbone forward speed and peak memory: sapiens2 against transformers' Sapiens2 port (the baseline), same run.

Both models hold the same random weights (official layout, loaded by each side's own loader). Prints a Markdown
table with milliseconds per image, images/s, peak GPU memory and the ratio to the baseline.

    python benchmarks/bench_backbone.py --arch sapiens2_1b --dtype bf16 --batch 4 --device cuda
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from sapiens2 import Sapiens2, load_backbone


def timed(fn, x, warmup: int, iters: int, device: torch.device) -> tuple[float, float]:
    """Median seconds per call and peak memory (GiB, CUDA only)."""
    with torch.inference_mode():
        for _ in range(warmup):
            fn(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            fn(x)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    return sorted(times)[len(times) // 2], peak


def baseline_model(model: Sapiens2, folder: Path, dtype: torch.dtype, device: torch.device):
    import transformers

    arch = model.arch
    config = transformers.Sapiens2Config(
        hidden_size=arch.embed_dims,
        intermediate_size=arch.feedforward_channels,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_attention_heads=arch.num_heads // 2,
        image_size=[1024, 768],
        patch_size=16,
    )
    config.save_pretrained(folder)
    hf = transformers.Sapiens2Model.from_pretrained(folder, dtype=dtype).to(device).eval()
    return lambda x: hf(pixel_values=x).last_hidden_state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sapiens2_0.4b")
    parser.add_argument("--dtype", default="bf16", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--size", type=int, nargs=2, default=(1024, 768))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        reference = Sapiens2(args.arch, device="cpu").eval()
        save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(folder / "model.safetensors"))
        del reference
        x = torch.randn(args.batch, 3, *args.size, device=device, dtype=dtype)
        ours = load_backbone(folder / "model.safetensors", dtype=dtype, device=device)
        seconds, peak = timed(ours, x, args.warmup, args.iters, device)
        rows.append(("sapiens2", seconds, peak))
        del ours
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if not args.no_baseline:
            baseline = baseline_model(Sapiens2(args.arch, device="meta"), folder, dtype, device)
            seconds, peak = timed(baseline, x, args.warmup, args.iters, device)
            rows.append(("transformers (baseline)", seconds, peak))
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    size = f"{args.size[0]}x{args.size[1]}"
    print(f"\n{args.arch} {args.dtype} batch {args.batch} {size} on {name}, torch {torch.__version__}")
    print("| implementation | ms/image | images/s | peak GiB | speed vs baseline |")
    print("|---|---|---|---|---|")
    base = rows[-1][1]
    for label, seconds, peak in rows:
        per_image = 1000 * seconds / args.batch
        print(f"| {label} | {per_image:.1f} | {args.batch / seconds:.2f} | {peak:.2f} | {base / seconds:.2f}x |")


if __name__ == "__main__":
    main()
