"""Pretraining step throughput: one full MAE + DINO step (student on 25 % of the tokens of 2 global views, teacher
on both unmasked, 2 local crops, decoder, losses, backward, AdamW, EMA) against a baseline step of the same backbone
forward + backward on the 2 unmasked global views (what a plain supervised step on the same pixels costs), on the
same batch, alternating repeats. Prints images/s of both and the ratio (pretraining time / baseline time).

    python benchmarks/bench_pretrain.py --arch tiny --arch sapiens2_0.1b --size 256 192 --batch 4 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sapiens2.pretrain.config import pretrain_config_from_dict
from sapiens2.pretrain.data import PretrainDataset
from sapiens2.pretrain.trainer import PretrainTrainer

TINY = {"embed_dims": 64, "num_layers": 4, "num_heads": 4, "feedforward_channels": 256, "num_tokenizer_layers": 0}


class _Synthetic(PretrainDataset):
    """Random images of the global size: the step cost without decoding."""

    def __init__(self, config, count: int) -> None:
        super().__init__([], config, use_tokenizer=False)
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        from sapiens2.pretrain.masking import draw_mask, mask_rng
        from sapiens2.pretrain.views import make_views, views_rng

        rng = views_rng(0, 0, index)
        image = (rng.random((*self.config.views.global_size, 3)) * 255).astype("uint8")
        globals_, locals_ = make_views(image, self.config.views, rng)
        masks = [torch.from_numpy(draw_mask(self.grid, self.config.masking, mask_rng(0, 0, index, v))[0])
                 for v in range(self.config.views.n_global_student)]  # fmt: skip
        return {"globals": globals_, "locals": locals_, "masks": torch.stack(masks),
                "block": torch.zeros(2, dtype=torch.bool), "skipped": torch.tensor(0)}  # fmt: skip


def bench(arch, size: tuple[int, int], batch: int, repeats: int, folder: Path) -> dict:
    small = arch == TINY
    config = pretrain_config_from_dict({
        "output_dir": str(folder / "run"), "steps": 1000, "precision": "fp32", "device": "cpu",
        "progress_bar": False, "model": {"arch": arch, "layer_scale_init": 1.0},
        "views": {"global_size": list(size), "local_size": [size[0] // 2, size[1] // 2], "n_local": 2},
        "mae": {"decoder_dim": 32 if small else 256, "decoder_depth": 1 if small else 4,
                "decoder_heads": 2 if small else 8},
        "dino": {"head_hidden": 128 if small else 2048, "head_bottleneck": 32 if small else 256,
                 "num_prototypes": 16 if small else 4096},
        "data": {"sources": ["synthetic"], "batch_size": batch, "num_workers": 0},
    })  # fmt: skip
    trainer = PretrainTrainer(config, dataset=_Synthetic(config, batch))
    batch_items = torch.utils.data.default_collate([trainer.train_dataset[i] for i in range(batch)])
    backbone = trainer.model.backbone
    views = batch_items["globals"].flatten(0, 1)

    def baseline() -> None:
        backbone(views)[0].float().pow(2).mean().backward()
        trainer.optimizer.zero_grad(set_to_none=True)

    def step() -> None:
        trainer.train_step(batch_items)

    for function in (step, baseline):  # warm-up
        function()
    times: dict[str, list[float]] = {"pretrain": [], "baseline": []}
    for _ in range(repeats):
        for name, function in (("pretrain", step), ("baseline", baseline)):
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    trainer.close()
    median = {name: statistics.median(values) for name, values in times.items()}
    return {"images_s": batch / median["pretrain"], "baseline_images_s": batch / median["baseline"],
            "ratio": median["pretrain"] / median["baseline"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", action="append", default=None, help="tiny or an arch name (repeatable)")
    parser.add_argument("--size", type=int, nargs=2, default=(256, 192))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print("| arch | global views | batch | pretraining step img/s | baseline fwd+bwd img/s | time ratio |")
    print("|---|---|---|---|---|---|")
    for name in args.arch or ["tiny"]:
        with tempfile.TemporaryDirectory() as folder:
            result = bench(TINY if name == "tiny" else name, tuple(args.size), args.batch, args.repeats, Path(folder))
        print(f"| {name} | 2 x {args.size[0]}x{args.size[1]} | {args.batch} | {result['images_s']:.2f} | "
              f"{result['baseline_images_s']:.2f} | {result['ratio']:.2f} |")


if __name__ == "__main__":
    main()
