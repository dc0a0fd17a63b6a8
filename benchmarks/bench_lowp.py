"""Accuracy of the torchao low-precision paths against bf16 on the end-to-end parity cases (issue #11 point 3).

For the D_seg_e2e, D_normal_e2e and D_pose_e2e fixtures (tiny random models, official images), runs the Predictor in
fast mode in bf16 (the baseline) and with each ``--kinds`` quantization, and prints the task measure against bf16:
seg labels equal, normals' mean angle, pose keypoints' median and max movement (keypoints the fixture marks stable).
The fp32 reference row shows how far bf16 itself is from the official numerics on the same tiny models. Speed is
``sapiens2 benchmark --quantize KIND``.

    python benchmarks/bench_lowp.py --device cuda --kinds fp8 int8 int8-weight
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from sapiens2 import Predictor
from sapiens2.data.io import read_image

SHARED = Path(os.environ.get("SAPIENS2_SHARED", Path(__file__).resolve().parents[2] / "shared"))


def _case(task: str):
    folder = SHARED / "fixtures" / "parity" / f"D_{task}_e2e"
    case = json.loads((folder / "case.json").read_text())
    images = {name: read_image(folder / meta["file"]) for name, meta in case["images"].items()}
    return case, folder, images


def _predictor(task: str, device: str, dtype: str, mode: str, quantize: str | None) -> Predictor:
    case, folder, _ = _case(task)
    weights = (folder / case["weights"]["file"]).resolve()
    options = {}
    if task == "pose":
        names = list(case["images"])
        per_image = case["detections"]["per_image"]

        def detector(arrays):  # the fixture's fixed detections, in image order
            return [
                np.array(
                    [[*b, s] for b, s, c in zip(d["bboxes"], d["scores"], d["labels"], strict=True) if c == 0],
                    dtype=np.float32,
                ).reshape(-1, 5)
                for d in (per_image[name] for name in names[: len(arrays)])
            ]

        options = {"detector": detector, "batch_size": 4}
    size = tuple(case["model"]["network_input_hw"])
    return Predictor(task, model=weights, device=device, dtype=dtype, input_size=size, mode=mode, quantize=quantize,
                     **options)  # fmt: skip


def _measure(task: str, got: list, want: list, stable: list) -> str:
    if task == "seg":
        return f"{100 * np.mean([(g.labels == w.labels).mean() for g, w in zip(got, want, strict=True)]):.2f} % equal"
    if task == "normal":
        angles = []
        for g, w in zip(got, want, strict=True):
            a = g.normals / np.linalg.norm(g.normals, axis=-1, keepdims=True)
            b = w.normals / np.linalg.norm(w.normals, axis=-1, keepdims=True)
            angles.append(np.degrees(np.arccos(np.clip((a * b).sum(-1), -1, 1))).mean())
        return f"{np.mean(angles):.3f} deg mean angle"
    moved = np.concatenate(
        [np.abs(g.keypoints - w.keypoints).max(-1)[s] for g, w, s in zip(got, want, stable, strict=True)]
    )
    return f"median {np.median(moved):.3f} px, max {moved.max():.3f} px"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--kinds", nargs="+", default=["fp8", "int8", "int8-weight"])
    parser.add_argument("--tasks", nargs="+", default=["seg", "normal", "pose"])
    args = parser.parse_args()
    print(f"\nlow precision against bf16 fast mode, {args.device}, torch {torch.__version__}")
    print("| task | run | against bf16 fast mode |")
    print("|---|---|---|")
    for task in args.tasks:
        _, folder, images = _case(task)
        arrays = list(images.values())
        stable = []
        if task == "pose":
            expected = load_file(folder / "outputs.safetensors")
            stable = [expected[f"{name}__keypoint_stable"].numpy().astype(bool) for name in images]
        want = _predictor(task, args.device, "bf16", "fast", None)(arrays)
        rows = {"fp32 reference mode": _predictor(task, args.device, "fp32", "reference", None)(arrays)}
        for kind in args.kinds:
            try:
                rows[f"{kind} fast mode"] = _predictor(task, args.device, "bf16", "fast", kind)(arrays)
            except (ValueError, ImportError, RuntimeError) as error:
                print(f"| {task} | {kind} | failed: {str(error).splitlines()[0][:200]} |")
        for label, got in rows.items():
            print(f"| {task} | {label} | {_measure(task, got, want, stable)} |")


if __name__ == "__main__":
    main()
