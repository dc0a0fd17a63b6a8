"""Peak host memory of loading a task model stored in bf16: straight into its device and dtype vs fp32 first.

A random checkpoint of a released arch/task (official keys and shapes, bf16 tensors) is written once; each run then
loads it in a fresh Python process and reports how far the process's peak resident set (``VmHWM`` from
/proc/self/status, Linux) rose above its value after a warm-up load of a tiny file by the same path ("extra"), the
time to load and read every tensor of the model once (so memory-mapped weights count, in memory and time, as they
would in use), and on CUDA the peak GPU memory.

- ``load_model``: ``load_model(task, path, device=..., dtype=...)`` — built on ``meta``, tensors placed while read;
- ``predictor``: ``Predictor(task, model=path, device=..., dtype=...)`` — the same through the Predictor;
- ``fp32_then_cast`` (baseline): ``load_model(task, path)`` in float32 on the host, then ``.to(device, dtype)``:
  what ``Predictor`` did before it passed its device and dtype into loading.

    python benchmarks/bench_load_memory.py --arch sapiens2_0.4b --task seg --device cpu --dtype bf16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

TINY_ARCH = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}
RUNS = {
    "load_model": "load_model(TASK, PATH, device=DEVICE, dtype=DTYPE)",
    "predictor": "Predictor(TASK, model=PATH, device=DEVICE, dtype=DTYPE).model",
    "fp32_then_cast": "load_model(TASK, PATH).to(DEVICE, DTYPE)",
}
_CHILD = """
import json, sys, time, torch
from sapiens2 import Predictor, load_model

def hwm_mib():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 1024

TASK, tiny, big, device, dtype, expression = sys.argv[1:]
DEVICE, DTYPE = torch.device(device), getattr(torch, dtype)
eval(expression.replace("PATH", repr(tiny)))  # lazy imports and first-use caches
before = hwm_mib()
start = time.perf_counter()
model = eval(expression.replace("PATH", repr(big)))
torch.stack([tensor.sum().float() for tensor in model.state_dict().values()])  # every page resident
if DEVICE.type == "cuda":
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
gpu = torch.cuda.max_memory_allocated() / 2**20 if DEVICE.type == "cuda" else None
print(json.dumps({"extra_mib": hwm_mib() - before, "seconds": seconds, "gpu_mib": gpu}))
"""


def write_random_checkpoint(path: Path, task: str, arch: str | dict) -> float:
    """Random bf16 tensors with the official keys and shapes of ``task``/``arch``; returns the file's tensor MiB."""
    from safetensors.torch import save_file

    from sapiens2 import build_model

    generator = torch.Generator().manual_seed(0)
    shapes = build_model(task, arch, device="meta").state_dict()
    tensors = {k: torch.randn(v.shape, generator=generator, dtype=torch.bfloat16) for k, v in shapes.items()}
    save_file(tensors, str(path))
    return sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sapiens2_0.4b")
    parser.add_argument("--task", default="seg")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tiny, big = Path(folder) / "tiny.safetensors", Path(folder) / "big.safetensors"
        write_random_checkpoint(tiny, args.task, TINY_ARCH)
        file_mib = write_random_checkpoint(big, args.task, args.arch)
        rows = []
        for run in args.runs:
            command = [sys.executable, "-c", _CHILD, args.task, str(tiny), str(big), args.device, args.dtype, RUNS[run]]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            rows.append((run, json.loads(result.stdout.strip().splitlines()[-1])))
    print(f"{args.arch} {args.task}: bf16 file of {file_mib:.0f} MiB, loaded to {args.device} in {args.dtype}\n")
    print("| run | extra host MiB | × file size | load + read s | peak GPU MiB |")
    print("|---|---|---|---|---|")
    for run, row in rows:
        gpu = f"{row['gpu_mib']:.0f}" if row["gpu_mib"] is not None else "–"
        ratio = row["extra_mib"] / file_mib
        print(f"| {run} | {row['extra_mib']:.0f} | {ratio:.2f}× | {row['seconds']:.2f} | {gpu} |")


if __name__ == "__main__":
    main()
