"""Does pretraining help? Pretrain the tiny arch on human photos, then fine-tune a pose (or seg) head on the demo
dataset from (a) random init (the backbone's default init, LayerScale 1e-4), (a') random init with the pretraining's
own init (LayerScale 1.0), and (b) the pretrained backbone, with the same fine-tuning budget and seeds; report the
validation metrics of each (docs/pretraining.md records a run).

Pretraining data: the two test photos (tests/data) and the packaged astronaut photo, with their mirror images; the
multi-crop views are the augmentation. Fine-tuning data: ``make_demo_dataset(task)`` (pose: 8 images of a stick
figure drawn on the photos with per-image joint jitter; seg: its 4 distinct images); the validation split lists the
same images un-augmented, so the metric measures how well each start fits the task in the budget, not
generalisation to new people. Pose reports OKS AP (all 308 = the 17 labelled body joints), PCK and the heatmap loss.

    python benchmarks/pretrain_finetune_gain.py --out runs/gain                 # pose; --task seg for the seg head
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

import cv2
import torch
from safetensors.torch import save_file

from sapiens2.models.backbone import Sapiens2
from sapiens2.pretrain import pretrain
from sapiens2.pretrain.config import pretrain_config_from_dict
from sapiens2.train.config import config_from_dict
from sapiens2.train.demo_data import make_demo_dataset
from sapiens2.train.trainer import fit

REPO = Path(__file__).resolve().parents[1]
TINY = {"embed_dims": 64, "num_layers": 4, "num_heads": 4, "feedforward_channels": 256, "num_tokenizer_layers": 0}
PHOTOS = (REPO / "tests/data/astronaut.png", REPO / "tests/data/camera.png", REPO / "sapiens2/assets/astronaut.jpg")
SEG_HEAD = {"deconv_out_channels": [32, 16], "deconv_kernel_sizes": [4, 4], "conv_out_channels": [16],
            "conv_kernel_sizes": [1]}  # fmt: skip
INPUT = (128, 96)


def photo_folder(out: Path) -> Path:
    folder = out / "photos"
    folder.mkdir(parents=True, exist_ok=True)
    for path in PHOTOS:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        cv2.imwrite(str(folder / f"{path.parent.name}_{path.stem}.png"), image)
        cv2.imwrite(str(folder / f"{path.parent.name}_{path.stem}_mirrored.png"), image[:, ::-1])
    return folder


def pretrain_backbone(out: Path, steps: int) -> Path:
    config = pretrain_config_from_dict({
        "output_dir": str(out / "pretrain"), "steps": steps, "precision": "fp32", "device": "cpu",
        "log_every": 50, "checkpoint_every": 500, "seed": 0,
        "model": {"arch": TINY, "layer_scale_init": 1.0},
        "views": {"global_size": list(INPUT), "local_size": [64, 48], "n_local": 2},
        "mae": {"decoder_dim": 64, "decoder_depth": 2, "decoder_heads": 4},
        "dino": {"head_hidden": 256, "head_bottleneck": 64, "num_prototypes": 64},
        "optimizer": {"lr": 1e-3, "lr_scaling": "none"},
        "schedule": {"warmup_epochs": 50, "teacher_temp_warmup_epochs": 300, "freeze_last_layer_epochs": 10},
        "data": {"sources": [str(photo_folder(out))], "batch_size": 6, "num_workers": 0},
    })  # fmt: skip
    return pretrain(config)["model"]


def random_backbone(out: Path, layer_scale: float) -> Path:
    torch.manual_seed(0)
    path = out / f"random_ls{layer_scale:g}.safetensors"
    model = Sapiens2(TINY, layer_scale_init_value=layer_scale)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


POSE_HEAD = {"deconv_out_channels": [32, 32], "deconv_kernel_sizes": [4, 4], "conv_out_channels": [32],
             "conv_kernel_sizes": [1]}  # fmt: skip
# What each task's validation reports, and which of it the table shows.
METRICS = {"pose": ("val/all308/AP", "val/acc_pose", "val/loss"), "seg": ("val/mIoU", "val/aAcc", "val/loss")}


def demo_root(out: Path, task: str) -> Path:
    """The demo dataset, validated on its own images un-augmented (``val.txt`` = ``train.txt`` = all of them)."""
    root = make_demo_dataset(task, out / f"demo_{task}", num_images=8 if task == "pose" else 4)
    names = sorted(p.stem for p in (root / "images").iterdir())
    for split in ("train", "val"):
        (root / f"{split}.txt").write_text("\n".join(names) + "\n")
    return root


def finetune(
    out: Path, task: str, name: str, backbone: Path, steps: int, seed: int, root: Path, lr: float = 2e-3
) -> dict[str, float]:
    """Fine-tune a head and the backbone from ``backbone``; returns the final validation metrics."""
    config = config_from_dict({
        "task": task, "output_dir": str(out / f"{task}_{name}_{seed}"), "steps": steps, "seed": seed,
        "precision": "fp32", "device": "cpu", "progress_bar": False, "log_every": 50, "eval_every": steps,
        "checkpoint_every": 0,
        "model": {"init_from": str(backbone), "head": POSE_HEAD if task == "pose" else SEG_HEAD},
        "data": {"root": str(root), "input_size": list(INPUT), "batch_size": 4, "num_workers": 0,
                 "val_split": "val", "val_batch_size": 4},
        "optimizer": {"lr": lr, "layer_decay": 1.0},
        "schedule": {"warmup_steps": 10},
    })  # fmt: skip
    summary = fit(config)
    return {key: summary["eval"][key] for key in METRICS[task]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/pretrain_gain"))
    parser.add_argument("--task", choices=sorted(METRICS), default="pose")
    parser.add_argument("--pretrain-steps", type=int, default=800)
    parser.add_argument("--pretrained", type=Path, default=None, help="reuse this backbone instead of pretraining")
    parser.add_argument("--finetune-steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    cv2.setNumThreads(args.threads)
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    pretrained = args.pretrained or pretrain_backbone(args.out, args.pretrain_steps)
    pretrain_minutes = (time.perf_counter() - started) / 60
    root = demo_root(args.out, args.task)
    starts = {
        "a_random_ls1e-4": random_backbone(args.out, 1e-4),
        "a2_random_ls1": random_backbone(args.out, 1.0),
        "b_pretrained": pretrained,
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in starts}
    for seed in range(args.seeds):
        for name, backbone in starts.items():
            metrics = finetune(args.out, args.task, name, backbone, args.finetune_steps, seed, root, args.lr)
            results[name].append(metrics)
    if args.pretrained is None:
        print(f"pretraining: {args.pretrain_steps} steps in {pretrain_minutes:.1f} min on {args.threads} thread(s)")
    print(f"fine-tuning: {args.task}, {args.finetune_steps} steps, batch 4, {INPUT[0]}x{INPUT[1]}, lr {args.lr:g}, "
          f"seeds 0-{args.seeds - 1}")
    names = METRICS[args.task]
    print("| start | " + " | ".join(f"{n} (mean)" for n in names) + f" | {names[0]} per seed |")
    print("|---|" + "---|" * (len(names) + 1))
    for name, runs in results.items():
        means = " | ".join(f"{statistics.mean(r[n] for r in runs):.4f}" for n in names)
        per_seed = ", ".join(f"{r[names[0]]:.4f}" for r in runs)
        print(f"| {name} | {means} | {per_seed} |")
    (args.out / f"results_{args.task}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
