"""Training loop: every task learns, exact resume, activation checkpointing, export round trip, CLI, and two gloo
processes (DDP and FSDP2) against one process on the same global batch. Tiny models on the demo datasets."""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from sapiens2 import cli, load_model
from sapiens2.train.config import config_from_dict, load_config
from sapiens2.train.demo_data import make_demo_dataset
from sapiens2.train.trainer import Trainer, export_model, find_checkpoints, fit

REPO = Path(__file__).resolve().parents[1]
TINY = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}
# Head widths for a 64x48 input: pose heatmaps at 1/4 (two deconvs), seg logits at 1/4, dense heads at full size.
HEADS = {
    "pose": {
        "deconv_out_channels": [16, 16],
        "deconv_kernel_sizes": [4, 4],
        "conv_out_channels": [8],
        "conv_kernel_sizes": [1],
    },
    "seg": {
        "deconv_out_channels": [16, 8],
        "deconv_kernel_sizes": [4, 4],
        "conv_out_channels": [8],
        "conv_kernel_sizes": [1],
    },
    "normal": {"upsample_channels": [16, 8, 8, 8], "conv_out_channels": [8], "conv_kernel_sizes": [3]},
    "albedo": {"upsample_channels": [16, 8, 8, 8], "conv_out_channels": [8], "conv_kernel_sizes": [3]},
    "pointmap": {
        "upsample_channels": [16, 8, 8, 8],
        "conv_out_channels": [8],
        "conv_kernel_sizes": [3],
        "scale_conv_out_channels": [4],  # a 4x3 token grid -> 2x2 cells x 4 channels = 16 features
        "scale_conv_kernel_sizes": [1],
        "scale_final_layer": [16, 8, 1],
    },
}


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory):
    """``demo_root(task)``: a 4-image demo dataset of that task, made once per module."""
    base = tmp_path_factory.mktemp("demo")
    made: dict[str, Path] = {}

    def get(task: str) -> Path:
        if task not in made:
            made[task] = make_demo_dataset(task, base / task, num_images=4)
        return made[task]

    return get


def tiny_config(task: str, root: Path, out: Path, **top):
    """A fast CPU config: tiny model, 64x48 input, global batch 2, fp32."""
    data = {"root": str(root), "input_size": [64, 48], "batch_size": 2, "num_workers": 0, "val_split": None}
    data |= top.pop("data", {})
    values = {
        "task": task,
        "output_dir": str(out),
        "steps": 6,
        "precision": "fp32",
        "log_every": 2,
        "eval_every": 0,
        "checkpoint_every": 0,
        "progress_bar": False,
        "device": "cpu",  # bit-exact checks need the CPU kernels; CUDA is covered by test_cuda_* below
        "model": {"arch": TINY, "head": HEADS[task]} | top.pop("model", {}),
        "data": data,
        "optimizer": {"lr": 1e-3} | top.pop("optimizer", {}),
        "schedule": {"warmup_steps": 1} | top.pop("schedule", {}),
    }
    return config_from_dict(values | top)


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def losses(run_dir: Path) -> list[float]:
    return [float(row["loss"]) for row in read_rows(run_dir / "metrics.csv")]


@pytest.mark.parametrize("task", ["seg", "normal", "pointmap", "albedo", "pose"])
def test_every_task_loss_falls_on_a_tiny_model(task, demo_root, tmp_path):
    config = tiny_config(
        task,
        demo_root(task),
        tmp_path / "run",
        steps=30,
        grad_clip=None,
        log_every=10,
        data={"augment": False},
        optimizer={"lr": 3e-2, "layer_decay": 1.0, "weight_decay": 0.0},
        schedule={"warmup_steps": 1, "warmup_start_factor": 1.0},
    )
    summary = fit(config)
    values = losses(tmp_path / "run")
    assert len(values) == 30 and summary["steps"] == 30
    first, last = sum(values[:4]) / 4, sum(values[-4:]) / 4
    assert last < 0.7 * first, f"{task}: loss {first:.4f} -> {last:.4f} did not fall clearly"
    assert (tmp_path / "run" / "config.yaml").is_file() and summary["model"].is_file()


@pytest.mark.parametrize("task", ["seg", "pose"])  # pose: its evaluation adds the flip test and OKS AP
def test_killed_and_resumed_run_reproduces_losses_bit_for_bit(task, demo_root, tmp_path, monkeypatch):
    # Augmentation on, an evaluation every 2 steps, the crash mid-epoch after the step-3 checkpoint.
    options = {"steps": 8, "checkpoint_every": 3, "eval_every": 2, "data": {"augment": True, "val_split": "train"}}
    root = demo_root(task)
    straight = fit(tiny_config(task, root, tmp_path / "straight", **options))

    original_step = Trainer.train_step
    calls = {"n": 0}

    def crashing_step(self, batch):
        calls["n"] += 1
        if calls["n"] == 6:
            raise RuntimeError("simulated crash")
        return original_step(self, batch)

    monkeypatch.setattr(Trainer, "train_step", crashing_step)
    config = tiny_config(task, root, tmp_path / "resumed", **options)
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit(config)
    assert [p.name for p in find_checkpoints(tmp_path / "resumed")] == ["step_00000003.pt"]
    monkeypatch.setattr(Trainer, "train_step", original_step)
    fit(config, resume=True)

    for name in ("metrics.csv", "eval.csv"):
        assert (tmp_path / "resumed" / name).read_text() == (tmp_path / "straight" / name).read_text(), name
    assert len(losses(tmp_path / "resumed")) == 8
    from safetensors.torch import load_file

    expected, got = load_file(straight["model"]), load_file(tmp_path / "resumed" / "model.safetensors")
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_activation_checkpointing_keeps_losses_and_gradient_norms(demo_root, tmp_path):
    root = demo_root("normal")
    fit(tiny_config("normal", root, tmp_path / "plain", steps=3))
    fit(tiny_config("normal", root, tmp_path / "ckpt", steps=3, model={"activation_checkpointing": True}))
    assert (tmp_path / "plain" / "metrics.csv").read_text() == (tmp_path / "ckpt" / "metrics.csv").read_text()


@pytest.mark.parametrize("task", ["seg", "pointmap"])
def test_exported_model_loads_with_load_model_and_gives_the_same_outputs(task, demo_root, tmp_path):
    from sapiens2 import load_model

    trainer = Trainer(tiny_config(task, demo_root(task), tmp_path / "run", steps=2))
    summary = trainer.fit()
    out = export_model(tmp_path / "run", tmp_path / "exported.safetensors")
    loaded = load_model(task, out)
    from safetensors.torch import load_file

    exported, final = load_file(out), load_file(summary["model"])
    assert exported.keys() == final.keys() and all(torch.equal(exported[k], final[k]) for k in final)
    assert all(k.startswith(("backbone.", "decode_head.")) and v.dtype == torch.float32 for k, v in final.items())
    images = torch.randn(2, 3, 64, 48)
    trained = trainer.model.eval()
    with torch.no_grad():
        expected, got = trained(images), loaded(images)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    for a, b in zip(expected, got, strict=True):
        assert torch.equal(a, b)
    # ... and the exported file drives the Predictor on a real photo, results at the photo's size.
    from conftest import DATA

    from sapiens2 import Predictor

    result = Predictor(task, model=out, device="cpu", input_size=(64, 48))(DATA / "camera.png")
    array = result.labels if task == "seg" else result.points
    assert array.shape[:2] == (512, 512)


def _two_people_in_image_0(root: Path) -> None:
    """Add a second, overlapping person to image 0 of a pose demo set (and a crowd region, which is not predicted)."""
    import json

    import numpy as np

    data = json.loads((root / "annotations.json").read_text())
    first = data["annotations"][0]
    shifted = np.asarray(first["keypoints"]).reshape(-1, 3).copy()
    shifted[shifted[:, 2] > 0, 0] += 30
    x, y, w, h = first["bbox"]
    second = dict(first, id=101, keypoints=shifted.ravel().tolist(), bbox=[x + 30, y, w, h])
    crowd = dict(first, id=100, iscrowd=1, bbox=[0, 0, 40, 40])
    data["annotations"] += [crowd, second]
    (root / "annotations.json").write_text(json.dumps(data))


def test_pose_validation_oks_ap_is_sapiens2_eval_of_the_same_model(tmp_path, monkeypatch):
    """The trainer's validation people are the Predictor's (same crops, flip test, decoder, image space) and its OKS
    numbers are evaluate_pose's on the exported model, for every group and statistic."""
    import numpy as np

    from sapiens2 import Predictor
    from sapiens2.eval.pose import evaluate_pose, read_pose_labels

    root = make_demo_dataset("pose", tmp_path / "demo", num_images=4)
    _two_people_in_image_0(root)
    (root / "val.txt").write_text("demo_000\ndemo_002\ndemo_003\n")
    decoded = []
    original = Trainer._people

    def recording(self, *args):
        found = original(self, *args)
        decoded.append(found)
        return found

    monkeypatch.setattr(Trainer, "_people", recording)
    config = tiny_config("pose", root, tmp_path / "run", steps=2, eval_every=2, data={"val_split": "val",
                         "val_batch_size": 3})  # fmt: skip
    summary = fit(config)
    [row] = read_rows(tmp_path / "run" / "eval.csv")
    assert row["step"] == "2" and len(decoded) == 2  # 4 people in batches of 3

    predictor = Predictor("pose", summary["model"], device="cpu", input_size=(64, 48), detector=None)
    predicted = {}

    def recording_predictor(image, boxes=None):
        result = predictor(image, boxes=boxes)
        predicted[image.tobytes()] = result
        return result

    report = evaluate_pose(recording_predictor, root, "val", progress=False)
    assert len(report.metrics) == 70
    for name, value in report.metrics.items():
        assert float(row[f"val/{name}"]) == pytest.approx(value, abs=1e-12), name
        assert summary["eval"][f"val/{name}"] == float(row[f"val/{name}"])

    from sapiens2.data.io import read_image

    annotations, keypoints, scores = (np.concatenate([part[i] for part in decoded]) for i in range(3))
    assert sorted(annotations.tolist()) == [0, 2, 3, 5]  # demo_001 is not in the split; 4 crowd; 5 the second person
    labels = read_pose_labels(root, "val")
    for image in labels.images:
        result = predicted[read_image(image["path"]).tobytes()]
        rows = [annotations.tolist().index(n) for n in labels.people_annotations[image["id"]]]
        assert len(rows) == len(result.keypoints) > 0
        np.testing.assert_allclose(keypoints[rows], result.keypoints, rtol=0, atol=1e-3)
        np.testing.assert_allclose(scores[rows], result.scores, rtol=0, atol=1e-5)


class _OracleHeatmaps(torch.nn.Module):
    """A stand-in pose network whose heatmaps decode to the ground truth, moved along x by ``shifts[i]`` heatmap
    pixels for validation sample i: it recognises each input crop as the nearest validation crop (then returns that
    sample's target heatmaps) or as a mirrored one (then the mirrored, left/right-swapped heatmaps, which the flip
    test turns back). A crop far from all of them fails the test. Unlabelled keypoints (no target) get a faint copy
    of a labelled one, as a network predicts every keypoint somewhere: with all of them at one place the reference's
    OKS-NMS over the 308 keypoints would merge the two overlapping people of image 0."""

    def __init__(self, dataset, shifts) -> None:
        super().__init__()
        from sapiens2.metadata import keypoint_metadata

        items = [dataset[i] for i in range(len(dataset))]
        self.register_buffer("crops", torch.stack([item["image"] for item in items]))
        maps = []
        for item, shift in zip(items, shifts, strict=True):
            target = item["heatmaps"].roll(int(shift), dims=-1)
            labelled = target.flatten(1).amax(1) > 0
            source = labelled.nonzero().flatten()[torch.arange(len(target)) % int(labelled.sum())]
            maps.append(torch.where(labelled[:, None, None], target, 0.1 * target[source]))
        self.register_buffer("maps", torch.stack(maps))
        self.register_buffer("swap", torch.tensor(keypoint_metadata().flip_indices))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        plain = ((x[:, None].float() - self.crops[None]) ** 2).flatten(2).mean(-1)  # (B, N)
        mirrored = ((x[:, None].float() - self.crops.flip(-1)[None]) ** 2).flatten(2).mean(-1)
        out = []
        for near, far in zip(plain, mirrored, strict=True):
            assert min(near.min(), far.min()) < 1e-3, "a crop that is no validation crop"
            if near.min() <= far.min():
                out.append(self.maps[near.argmin()])
            else:
                out.append(self.maps[far.argmin()].flip(-1)[self.swap])
        return torch.stack(out).to(x.dtype)


@pytest.mark.parametrize("shifted", [False, True])
def test_pose_validation_oks_ap_of_oracle_heatmaps(shifted, tmp_path):
    """Heatmaps of the ground truth score AP 1; shifted ones an intermediate AP that equals evaluate_pose's on the
    same network through the Predictor (ground-truth boxes)."""
    from sapiens2 import Predictor
    from sapiens2.eval.pose import evaluate_pose

    root = make_demo_dataset("pose", tmp_path / "demo", num_images=4)
    _two_people_in_image_0(root)
    data = {"val_split": "val", "input_size": [256, 192], "val_batch_size": 2}
    trainer = Trainer(tiny_config("pose", root, tmp_path / "run", eval_every=1, data=data))
    try:
        shifts = [0, 1, 2, 3, 1] if shifted else [0] * 5
        trainer.module = oracle = _OracleHeatmaps(trainer.val_dataset, shifts)
        results = trainer.evaluate()
    finally:
        trainer.close()
    assert [r["val/all308/AP"] for r in read_rows(tmp_path / "run" / "eval.csv")] == [repr(results["val/all308/AP"])]
    if not shifted:
        for name in ("body17", "all308"):
            assert results[f"val/{name}/AP"] == pytest.approx(1.0, abs=1e-12)
            assert results[f"val/{name}/AR"] == 1.0
        assert results["val/face/AP"] == -1.0  # the demo labels only the body
        return
    assert 0.05 < results["val/all308/AP"] < 0.95 and 0.05 < results["val/body17/AP"] < 0.95
    predictor = Predictor("pose", oracle, device="cpu", input_size=(256, 192), detector=None)
    report = evaluate_pose(predictor, root, "val", progress=False)
    for name, value in report.metrics.items():
        assert results[f"val/{name}"] == pytest.approx(value, abs=1e-12), name


def test_bf16_autocast_with_frozen_stages_trains_only_the_unfrozen_part(demo_root, tmp_path):
    config = tiny_config(
        "seg", demo_root("seg"), tmp_path / "run", steps=3, precision="bf16", model={"frozen_stages": 1}
    )
    trainer = Trainer(config)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.fit()
    after = trainer.model.state_dict()
    frozen = ("backbone.patch_embed.", "backbone.cls_token", "backbone.storage_tokens", "backbone.blocks.0.")
    assert all(torch.equal(before[k], after[k]) for k in before if k.startswith(frozen))
    assert not torch.equal(before["backbone.blocks.1.attn.wq.weight"], after["backbone.blocks.1.attn.wq.weight"])
    assert all(torch.isfinite(torch.tensor(losses(tmp_path / "run"))))


def test_epochs_set_the_step_count_and_the_epoch_column(demo_root, tmp_path):
    config = tiny_config("albedo", demo_root("albedo"), tmp_path / "run", steps=None, epochs=2)
    assert fit(config)["steps"] == 4  # 4 images, global batch 2
    assert [row["epoch"] for row in read_rows(tmp_path / "run" / "metrics.csv")] == ["0", "0", "1", "1"]


def test_fresh_run_starts_new_logs_refuses_old_checkpoints_and_resume_needs_one(demo_root, tmp_path):
    config = tiny_config("seg", demo_root("seg"), tmp_path / "run", steps=2)
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        Trainer(config, resume=True)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.csv").write_text("step,other\n99,1.0\n")  # left by a run that never checkpointed
    fit(config)
    assert [row["step"] for row in read_rows(tmp_path / "run" / "metrics.csv")] == ["1", "2"]
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(config)


def test_init_from_a_task_checkpoint_loads_every_weight(demo_root, tmp_path):
    first = fit(tiny_config("seg", demo_root("seg"), tmp_path / "first", steps=2))
    config = tiny_config(
        "seg", demo_root("seg"), tmp_path / "second", steps=2, model={"init_from": str(first["model"])}
    )
    trainer = Trainer(config)
    from safetensors.torch import load_file

    saved = load_file(first["model"])
    state = trainer.model.state_dict()
    assert all(torch.equal(saved[k], state[k].float()) for k in saved)
    trainer.close()


def test_init_from_a_pretrain_backbone_infers_the_arch_and_loads_strictly(demo_root, tmp_path):
    from safetensors.torch import save_file

    from sapiens2.models.backbone import Sapiens2

    torch.manual_seed(3)
    backbone = Sapiens2(TINY, img_size=(64, 48))
    save_file(backbone.state_dict(), tmp_path / "pretrain.safetensors")
    config = tiny_config("normal", demo_root("normal"), tmp_path / "run", steps=2)
    config = dataclasses.replace(
        config, model=dataclasses.replace(config.model, arch=None, init_from=str(tmp_path / "pretrain.safetensors"))
    )
    trainer = Trainer(config)
    loaded = trainer.model.backbone.state_dict()
    assert all(torch.equal(value, loaded[key]) for key, value in backbone.state_dict().items())
    trainer.close()
    wider = dataclasses.replace(config, model=dataclasses.replace(config.model, arch=TINY | {"embed_dims": 64}))
    with pytest.raises(ValueError, match="(?s)model.init_from .*mis-shaped.*suggest: custom arch embed_dims=32"):
        Trainer(wider)


def test_cli_trains_exports_and_reports_config_errors(demo_root, tmp_path, capsys):
    config = tiny_config("pose", demo_root("pose"), tmp_path / "run", steps=2)
    from sapiens2.train.config import save_config

    path = save_config(config, tmp_path / "pose.yaml")
    assert cli.main(["train", str(path), "--set", "steps=3"]) == 0
    assert len(losses(tmp_path / "run")) == 3
    assert load_config(tmp_path / "run" / "config.yaml").steps == 3
    assert cli.main(["export", str(tmp_path / "run"), "-o", str(tmp_path / "pose.safetensors")]) == 0
    assert (tmp_path / "pose.safetensors").is_file()
    assert cli.main(["train", str(path), "--set", "optimizer.lrr=1"]) == 2
    assert "Did you mean 'lr'" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path / "nothing"), "-o", str(tmp_path / "x.safetensors")]) == 2


def test_cli_train_names_a_warmup_as_long_as_the_run_with_both_keys_and_file(demo_root, tmp_path, capsys):
    """A warm-up the user set too long is one line naming the file, the warm-up and the steps (or the epochs, known
    once the data is read); nothing is written."""
    from sapiens2.train.config import save_config

    config = tiny_config("seg", demo_root("seg"), tmp_path / "run", steps=10, schedule={"warmup_steps": None})
    path = save_config(config, tmp_path / "seg.yaml")
    cases = [
        (["--set", "schedule.warmup_steps=10"], "schedule.warmup_steps=10 must be smaller than the run's 10 steps "
         "(steps=10): lower it, train longer, or leave the warm-up out (default: a tenth of the steps, at most 500)"),
        (["--set", "steps=null", "--set", "epochs=2", "--set", "schedule.warmup_steps=4"],
         "schedule.warmup_steps=4 must be smaller than the run's 4 steps (epochs=2)"),
    ]  # fmt: skip
    for argv, message in cases:
        assert cli.main(["train", str(path), *argv]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("sapiens2 train: error: ") and message in lines[0], lines
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_cli_train_of_a_few_steps_warms_up_for_a_tenth_of_them_by_default(demo_root, tmp_path):
    """Without schedule.warmup_steps a 10-step run warms up for 1 step (the official 500 would refuse it): the LR
    is the start factor's at step 1 and the full LR from step 2 on, decaying to the end."""
    from sapiens2.train.config import save_config

    config = tiny_config("seg", demo_root("seg"), tmp_path / "run", steps=10, schedule={"warmup_steps": None})
    assert cli.main(["train", str(save_config(config, tmp_path / "seg.yaml"))]) == 0
    rates = [float(row["lr"]) for row in read_rows(tmp_path / "run" / "metrics.csv")]
    assert rates[:2] == pytest.approx([1e-3 * 1e-3, 1e-3])
    assert all(later < earlier for earlier, later in zip(rates[1:], rates[2:], strict=False))


def _torchrun(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_gloo_processes_match_one_process_on_the_same_global_batch(strategy, demo_root, tmp_path):
    # Pose: the heatmap MSE is a mean over equally sized samples, so the mean of the two processes' losses and
    # gradients equals the global batch's (Dice or masked means would not split like that).
    options = {
        "steps": 4,
        "eval_every": 2,
        "data": {"batch_size": 4, "val_batch_size": 1, "val_split": "train"},
        "distributed": {"strategy": strategy},
    }
    root = demo_root("pose")
    fit(tiny_config("pose", root, tmp_path / "one", **options))
    config = tiny_config("pose", root, tmp_path / "two", **options)
    from sapiens2.train.config import save_config

    path = save_config(config, tmp_path / "two.yaml")
    result = _torchrun(["-m", "sapiens2", "train", str(path)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = read_rows(tmp_path / "one" / "metrics.csv"), read_rows(tmp_path / "two" / "metrics.csv")
    assert len(one) == len(two) == 4
    for row_one, row_two in zip(one, two, strict=True):
        for key in ("loss", "grad_norm", "lr"):
            assert float(row_two[key]) == pytest.approx(float(row_one[key]), rel=1e-6, abs=1e-9), key
    eval_one, eval_two = read_rows(tmp_path / "one" / "eval.csv"), read_rows(tmp_path / "two" / "eval.csv")
    assert [r["step"] for r in eval_one] == [r["step"] for r in eval_two] == ["2", "4"]
    for row_one, row_two in zip(eval_one, eval_two, strict=True):
        for key in row_one:
            assert float(row_two[key]) == pytest.approx(float(row_one[key]), rel=1e-6, abs=1e-9), key
    # The checkpoint holds full (gathered) weights under the official names, whatever the wrapping.
    from sapiens2 import load_model

    load_model("pose", tmp_path / "two" / "model.safetensors")


@pytest.mark.slow
def test_sigkilled_cli_run_resumes_to_the_uninterrupted_losses(demo_root, tmp_path):
    options = {"steps": 24, "checkpoint_every": 4, "keep_checkpoints": 0, "data": {"augment": True}}
    root = demo_root("normal")
    fit(tiny_config("normal", root, tmp_path / "straight", **options))
    config = tiny_config("normal", root, tmp_path / "killed", **options)
    from sapiens2.train.config import save_config

    path = save_config(config, tmp_path / "killed.yaml")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "sapiens2", "train", str(path)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not find_checkpoints(tmp_path / "killed") and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert find_checkpoints(tmp_path / "killed"), "no checkpoint appeared before the deadline"
    assert not (tmp_path / "killed" / "model.safetensors").exists(), "the run finished before it was killed"
    resumed = subprocess.run([*command, "--resume"], env=env, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (tmp_path / "killed" / "metrics.csv").read_text() == (tmp_path / "straight" / "metrics.csv").read_text()


def test_metric_states_from_two_processes_pool_like_one():
    from sapiens2.eval.metrics import NormalMetrics, SegMetrics
    from sapiens2.train.distributed import merge_metric_states, metric_state

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 29, 8, 6, generator=generator)
    labels = torch.randint(0, 29, (4, 8, 6), generator=generator)
    normals, target = torch.randn(4, 3, 8, 6, generator=generator), torch.randn(4, 3, 8, 6, generator=generator)
    mask = torch.rand(4, 1, 8, 6, generator=generator) > 0.3
    for make, arguments in ((SegMetrics, (logits, labels)), (NormalMetrics, (normals, target, mask))):
        whole, first, second = make(), make(), make()
        whole.update(*arguments)
        first.update(*(a[:1] for a in arguments))
        second.update(*(a[1:] for a in arguments))
        merged = make()
        merge_metric_states(merged, [metric_state(first), metric_state(second)])
        assert merged.compute() == pytest.approx(whole.compute(), rel=1e-12)


def test_saved_config_reloads_equal(demo_root, tmp_path):
    config = tiny_config("albedo", demo_root("albedo"), tmp_path / "run", steps=2)
    fit(config)
    assert load_config(tmp_path / "run" / "config.yaml") == config
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["model"]["arch"] == TINY


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_training_loss_falls_and_exports(precision, demo_root, tmp_path):
    config = tiny_config("seg", demo_root("seg"), tmp_path / "run", steps=16, device="cuda", precision=precision)
    fit(config)
    values = losses(tmp_path / "run")
    assert sum(values[-4:]) < 0.8 * sum(values[:4])
    model = load_model("seg", export_model(tmp_path / "run", tmp_path / "seg.safetensors"))
    assert model(torch.zeros(1, 3, 64, 48)).shape[:2] == (1, 29)


def _train_subprocess(config_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """``python -m sapiens2 train ...`` with stdout and stderr redirected to pipes, as in a batch job's log."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "sapiens2", "train", str(config_path), *extra]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)


def test_cli_train_logs_its_steps_to_the_console_and_train_log_and_shows_no_bar_when_redirected(demo_root, tmp_path):
    from sapiens2.train.config import save_config

    config = tiny_config("seg", demo_root("seg"), tmp_path / "run", steps=4, log_every=2, progress_bar=True)
    result = _train_subprocess(save_config(config, tmp_path / "seg.yaml"))
    assert result.returncode == 0, result.stderr[-3000:]
    console = result.stdout + result.stderr
    assert "step 2/4" in console and "step 4/4" in console, console
    log = (tmp_path / "run" / "train.log").read_text()
    assert "step 2/4" in log and "step 4/4" in log and "training seg for 4 steps" in log, log
    # The pipes are not a terminal: no progress bar (carriage returns, rates) in the captured output.
    assert "\r" not in console and "step/s" not in console and "|" not in console, console


def test_cli_train_logs_to_train_log_through_the_main_entry_point(demo_root, tmp_path):
    from sapiens2.cli import main
    from sapiens2.train.config import save_config

    config = tiny_config("albedo", demo_root("albedo"), tmp_path / "run", steps=2, log_every=1)
    assert main(["train", str(save_config(config, tmp_path / "albedo.yaml"))]) == 0
    log = (tmp_path / "run" / "train.log").read_text()
    assert "step 1/2" in log and "step 2/2" in log and "exported" in log, log


@pytest.mark.parametrize("problem", ["missing data root", "mis-shaped init_from"])
def test_cli_train_that_fails_its_checks_leaves_no_run_folder(problem, demo_root, tmp_path, capsys):
    from sapiens2.cli import main
    from sapiens2.train.config import save_config

    if problem == "missing data root":
        config = tiny_config("seg", tmp_path / "no_such_data", tmp_path / "run", steps=2)
    else:
        first = fit(tiny_config("seg", demo_root("seg"), tmp_path / "first", steps=2))
        model = {"arch": TINY | {"embed_dims": 64}, "init_from": str(first["model"])}
        config = tiny_config("seg", demo_root("seg"), tmp_path / "run", steps=2, model=model)
    path = save_config(config, tmp_path / "bad.yaml")
    capsys.readouterr()
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sapiens2 train: error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists(), sorted(p.name for p in (tmp_path / "run").iterdir())


def test_diverging_run_stops_within_its_patience_exits_1_and_exports_nothing(demo_root, tmp_path, capsys):
    from sapiens2.train.config import save_config

    config = tiny_config("seg", demo_root("seg"), tmp_path / "run", steps=20, log_every=5)
    path = save_config(config, tmp_path / "seg.yaml")
    capsys.readouterr()
    assert cli.main(["train", str(path), "--set", "optimizer.lr=1e6"]) == 1
    err = capsys.readouterr().err
    line = [entry for entry in err.splitlines() if entry.startswith("sapiens2 train: error: ")]
    assert len(line) == 1 and "training diverged" in line[0] and "lower optimizer.lr (now 1e+06)" in line[0], err
    assert "exported nothing" in line[0] and "final loss" not in err
    assert not (tmp_path / "run" / "model.safetensors").exists()
    rows = read_rows(tmp_path / "run" / "metrics.csv")
    assert len(rows) < 20 and f"stopped at step {len(rows)} of 20" in line[0], line[0]
    bad = [row for row in rows if not all(math.isfinite(float(row[k])) for k in ("loss", "grad_norm"))]
    assert 1 <= len(bad) <= 3 and rows[-1] in bad, rows  # the last 3 steps at most, the rest trained normally
    assert "not finite" in (tmp_path / "run" / "train.log").read_text()


def test_nonfinite_patience_is_configurable_and_pretraining_python_callers_get_the_error(demo_root, tmp_path):
    from sapiens2.train.trainer import TrainingDiverged

    root = demo_root("seg")
    stops = {}
    for patience in (1, 3):
        config = tiny_config("seg", root, tmp_path / f"p{patience}", steps=20, nonfinite_patience=patience,
                             optimizer={"lr": 1e6})  # fmt: skip
        with pytest.raises(TrainingDiverged, match=r"in a row: nonfinite_patience"):
            fit(config)
        stops[patience] = len(read_rows(tmp_path / f"p{patience}" / "metrics.csv"))
    assert stops[3] == stops[1] + 2  # the same first bad step; 2 more skipped steps before giving up
    with pytest.raises(ValueError, match="nonfinite_patience must be >= 0"):
        tiny_config("seg", root, tmp_path / "x", nonfinite_patience=-1)


def test_resumed_finished_run_trains_nothing_and_says_so(demo_root, tmp_path, capsys):
    from sapiens2.train.config import save_config

    config = tiny_config("albedo", demo_root("albedo"), tmp_path / "run", steps=2, log_every=1)
    path = save_config(config, tmp_path / "albedo.yaml")
    assert cli.main(["train", str(path)]) == 0
    assert "trained 2 steps, final loss" in capsys.readouterr().out
    checkpoints = tmp_path / "run" / "checkpoints"
    (stale := checkpoints / ".step_00000002.pt.0123456789ab.tmp.pt").write_bytes(b"partial")  # a killed save's
    before = (checkpoints / "step_00000002.pt").stat().st_mtime_ns
    assert cli.main(["train", str(path), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "nothing to train: the run was already at its last step (2)" in out and "nan" not in out, out
    assert (checkpoints / "step_00000002.pt").stat().st_mtime_ns == before  # not rewritten
    assert (tmp_path / "run" / "model.safetensors").is_file()
    assert stale.exists()  # only a new checkpoint write clears them; a longer run does
    assert cli.main(["train", str(path), "--resume", "--set", "steps=3"]) == 0
    assert "trained 3 steps, final loss" in capsys.readouterr().out
    assert not stale.exists() and sorted(p.name for p in checkpoints.iterdir()) == [
        "step_00000002.pt",
        "step_00000003.pt",
    ]
