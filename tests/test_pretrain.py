"""Pretraining runs (PRETRAIN.md §12 items 10-13): losses fall on the tiny config, the export is the official layout
for every arch (on ``meta``) and equals the teacher, continued pretraining from a checkpoint path, bitwise resume in
a fresh process, bad data refused before compute, a corrupt image mid-run skipped and counted, data sources
(folder, manifest, WebDataset tar), the 4K variant, and the exported backbone fine-tuned and predicting end to end."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import yaml
from conftest import DATA, KEYS, SHARED, require

from sapiens2 import cli, load_backbone
from sapiens2.models.backbone import Sapiens2
from sapiens2.models.zoo import ARCHS
from sapiens2.pretrain import pretrain
from sapiens2.pretrain.config import pretrain_config_from_dict, pretrain_config_to_dict
from sapiens2.pretrain.data import largest_person_fraction, list_images
from sapiens2.pretrain.export import backbone_state, read_pretrain_checkpoint
from sapiens2.pretrain.model import PretrainTeacher, encode
from sapiens2.pretrain.trainer import PretrainTrainer, build_student

REPO = Path(__file__).resolve().parents[1]
TINY = {"embed_dims": 64, "num_layers": 4, "num_heads": 4, "feedforward_channels": 256, "num_tokenizer_layers": 0}


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """The two 512x512 test photos of people and their mirror images (4 files)."""
    folder = tmp_path_factory.mktemp("photos")
    for name in ("astronaut.png", "camera.png"):
        image = cv2.imread(str(DATA / name), cv2.IMREAD_COLOR)
        cv2.imwrite(str(folder / name), image)
        cv2.imwrite(str(folder / f"mirrored_{name}"), image[:, ::-1])
    return folder


def tiny_values(sources, out: Path, **top) -> dict:
    """A fast CPU run: D 64, 4 blocks, 128x96 globals, 2 locals of 64x48, decoder 32/1/2, head 128/32/16."""
    values = {
        "output_dir": str(out),
        "steps": 6,
        "precision": "fp32",
        "device": "cpu",
        "progress_bar": False,
        "log_every": 2,
        "checkpoint_every": 0,
        "model": {"arch": TINY, "layer_scale_init": 1.0},
        "views": {"global_size": [128, 96], "local_size": [64, 48], "n_local": 2},
        "mae": {"decoder_dim": 32, "decoder_depth": 1, "decoder_heads": 2},
        "dino": {"head_hidden": 128, "head_bottleneck": 32, "num_prototypes": 16},
        "optimizer": {"lr_scaling": "none"},
        "schedule": {"warmup_epochs": 1, "momentum_start": 0.9},
        "data": {"sources": [str(s) for s in sources], "batch_size": 4, "num_workers": 0},
    }
    for key, value in top.items():
        values[key] = values.get(key, {}) | value if isinstance(value, dict) else value
    return values


def tiny_config(sources, out: Path, **top):
    return pretrain_config_from_dict(tiny_values(sources, out, **top))


def rows(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def column(run: Path, name: str) -> list[float]:
    return [float(row[name]) for row in rows(run)]


def _losses_fall(run: Path, window: int, mae_ratio: float, prototypes: int = 16) -> None:
    mae, dino = column(run, "mae"), column(run, "dino")
    assert all(math.isfinite(v) for v in mae + dino + column(run, "loss"))
    first, last = np.mean(mae[:window]), np.mean(mae[-window:])
    assert last < mae_ratio * first, f"MAE {first:.4f} -> {last:.4f}"
    first, last = np.mean(dino[:window]), np.mean(dino[-window:])
    assert last < first and last < math.log(prototypes), f"DINO {first:.4f} -> {last:.4f} (ln K {math.log(16):.4f})"


@pytest.fixture(scope="module")
def photos8(photos, tmp_path_factory) -> Path:
    """``photos`` twice (8 files): one batch of 8 per epoch."""
    folder = tmp_path_factory.mktemp("photos8")
    for copy in range(2):
        for path in sorted(photos.iterdir()):
            (folder / f"{copy}_{path.name}").write_bytes(path.read_bytes())
    return folder


def test_losses_fall_on_the_tiny_config(photos8, tmp_path):
    config = tiny_config([photos8], tmp_path / "run", steps=40, log_every=20, data={"batch_size": 8},
                         schedule={"kind": "constant"})  # fmt: skip
    torch.set_flush_denormal(True)
    try:
        pretrain(config)
    finally:
        torch.set_flush_denormal(False)
    # At 8x6 patches with 12 visible the tiny decoder plateaus near 0.88 by step 25 (0.98 at the start).
    _losses_fall(tmp_path / "run", window=10, mae_ratio=0.92)


@pytest.mark.slow
def test_losses_fall_on_the_spec_tiny_config_at_256x192(photos8, tmp_path):
    """PRETRAIN.md §12 item 10 exactly: 60 steps, first/last 15, MAE ratio 0.85."""
    config = tiny_config([photos8], tmp_path / "run", steps=60, log_every=20, data={"batch_size": 8},
                         views={"global_size": [256, 192]}, schedule={"kind": "constant"})  # fmt: skip
    pretrain(config)
    _losses_fall(tmp_path / "run", window=15, mae_ratio=0.85)


# ---------------------------------------------------------------------------------------------------------- export


@pytest.mark.parametrize("name", [name for name, arch in ARCHS.items() if arch.released])  # official keys exist
def test_exported_keys_equal_the_official_pretrain_layout_on_meta(name, tmp_path):
    reference = json.loads(require(KEYS / f"{name}_pretrain.json").read_text())["keys"]
    config = tiny_config(["unused"], tmp_path, model={"arch": name},
                         views={"global_size": [1024, 768], "local_size": [256, 192]},
                         mae={"decoder_dim": 512, "decoder_depth": 8, "decoder_heads": 16},
                         dino={"head_hidden": None, "head_bottleneck": None, "num_prototypes": None})  # fmt: skip
    student = build_student(config, device="meta")
    teacher = PretrainTeacher(student)
    for state in (teacher.state_dict(), student.state_dict()):
        exported = backbone_state(state)
        ours = [[k, list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in exported.items()]
        assert ours == reference
    assert any(k.startswith(("decoder.", "dino_head.")) for k in student.state_dict())


def test_export_loads_strictly_and_equals_the_teacher_backbone(photos, tmp_path):
    summary = pretrain(tiny_config([photos], tmp_path / "run", steps=3))
    assert summary["model"] == tmp_path / "run" / "backbone.safetensors"
    checkpoint = read_pretrain_checkpoint(summary["checkpoint"])
    backbone = load_backbone(summary["model"])  # strict: no decoder/head/mask keys, periods bf16
    teacher = Sapiens2(TINY)
    teacher.load_state_dict({k[9:]: v for k, v in checkpoint["teacher"].items() if k.startswith("backbone.")})
    images = torch.randn(2, 3, 128, 96)
    assert torch.equal(backbone(images)[0], teacher.eval()(images)[0])
    student = {k[9:]: v for k, v in checkpoint["student"].items() if k.startswith("backbone.")}
    assert any(not torch.equal(student[k], v) for k, v in backbone.state_dict().items())  # the teacher, not student
    assert backbone.rope_embed.periods.dtype == torch.bfloat16


def test_continued_pretraining_starts_student_and_teacher_from_a_checkpoint_path(photos, tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(5)
    released = Sapiens2(TINY, layer_scale_init_value=0.5)
    path = tmp_path / "released_pretrain.safetensors"
    save_file({k: v.contiguous() for k, v in released.state_dict().items()}, str(path))
    values = tiny_values([photos], tmp_path / "run")
    values["model"] = {"init": str(path)}  # arch read off the file's shapes
    trainer = PretrainTrainer(pretrain_config_from_dict(values))
    try:
        for module in (trainer.model.backbone, trainer.teacher.backbone):
            for key, value in released.state_dict().items():
                assert torch.equal(module.state_dict()[key], value), key
        assert trainer.model.decoder.pred.out_features == 3 * 16 * 16
    finally:
        trainer.close()


# ---------------------------------------------------------------------------------------------------------- resume


def _run_cli(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _state_equal(a: dict, b: dict) -> None:
    for key in ("student", "teacher"):
        assert a[key].keys() == b[key].keys()
        for name in a[key]:
            assert torch.equal(a[key][name], b[key][name]), f"{key}.{name}"
    for index, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b["optimizer"]["state"][index][name])), name


def test_resumed_run_in_a_fresh_process_reproduces_losses_and_states_bitwise(photos, tmp_path):
    options = {"steps": 8, "checkpoint_every": 4, "keep_checkpoints": 0, "dino": {"centering": "softmax"}}
    straight = tiny_config([photos], tmp_path / "straight", **options)
    pretrain(straight)
    # The second half in a fresh process, from the step-4 checkpoint, through the real command.
    values = tiny_values([photos], tmp_path / "resumed", **options)
    config_path = tmp_path / "resumed.yaml"
    config_path.write_text(yaml.safe_dump(values))
    start = tmp_path / "straight" / "checkpoints" / "step_00000004.pt"
    result = _run_cli(["-m", "sapiens2", "pretrain", str(config_path), "--resume", str(start)])
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = rows(tmp_path / "straight"), rows(tmp_path / "resumed")
    assert [r["step"] for r in two] == ["5", "6", "7", "8"]
    assert one[4:] == two  # every value, to the last bit (repr)
    final = [read_pretrain_checkpoint(p / "checkpoints" / "step_00000008.pt") for p in (tmp_path / "straight",
                                                                                        tmp_path / "resumed")]
    _state_equal(*final)
    assert torch.equal(final[0]["centering"]["center"], final[1]["centering"]["center"])


def _torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    command = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *command], cwd=cwd, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_gloo_processes_match_one_and_resume_bitwise(strategy, photos, tmp_path):
    options = {"steps": 4, "checkpoint_every": 2, "keep_checkpoints": 0, "distributed": {"strategy": strategy},
               "model": {"rope_rescale": 2.0}}  # fmt: skip
    if strategy == "fsdp":
        # FSDP2's reduce-scatter sums gradients in another order, and KoLeo's 1 / distance gradient amplifies such
        # rounding (below) step after step: the sharded run is compared without KoLeo, at the strict tolerance.
        options["dino"] = {"koleo_weight": 0.0}
    pretrain(tiny_config([photos], tmp_path / "one", **options))
    for name in ("two", "two_resumed"):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(tiny_values([photos], tmp_path / name, **options)))
    result = _torchrun(["-m", "sapiens2", "pretrain", str(tmp_path / "two.yaml")], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = rows(tmp_path / "one"), rows(tmp_path / "two")
    for row_one, row_two in zip(one, two, strict=True):
        for key in ("loss", "mae", "dino", "koleo", "grad_norm", "lr"):
            # KoLeo is -log(distance to the nearest sample), its gradient ~ 1 / distance: the float32 rounding of
            # features computed on a split batch (other GEMM shapes) is amplified where two crops of the same photo
            # lie close together, in the KoLeo value and the gradient norm.
            rel = 1e-3 if key in ("koleo", "grad_norm") and strategy == "ddp" else 1e-5
            if key == "grad_norm" and strategy == "fsdp":
                # The norm sums every parameter's gradient, each reduce-scattered in another order than the one
                # process's GEMMs accumulate: 2.1e-5 relative seen on an Intel Xeon with AVX-512 (no AMX). A real
                # sharding bug (gradients not averaged: 2x; a shard's gradients lost: ~-30 %) is far outside 1e-4.
                rel = 1e-4
            assert float(row_two[key]) == pytest.approx(float(row_one[key]), rel=rel, abs=1e-7), key
    start = tmp_path / "two" / "checkpoints" / "step_00000002.pt"
    result = _torchrun(["-m", "sapiens2", "pretrain", str(tmp_path / "two_resumed.yaml"), "--resume", str(start)],
                       tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert rows(tmp_path / "two")[2:] == rows(tmp_path / "two_resumed")
    load_backbone(tmp_path / "two" / "backbone.safetensors")


SK_WORKER = """
import sys, torch, torch.distributed as dist
from sapiens2.pretrain.losses import sinkhorn_knopp
dist.init_process_group("gloo")
rank = dist.get_rank()
logits = torch.load(sys.argv[1])
part = logits[rank * 6 : (rank + 1) * 6]
torch.save(sinkhorn_knopp(part, 0.04, 3), sys.argv[2] + f".{rank}")
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_sinkhorn_knopp_on_two_gloo_processes_equals_one_process(tmp_path):
    from sapiens2.pretrain.losses import sinkhorn_knopp

    logits = torch.randn(12, 16) * 0.5
    torch.save(logits, tmp_path / "logits.pt")
    (tmp_path / "worker.py").write_text(SK_WORKER)
    result = _torchrun([str(tmp_path / "worker.py"), str(tmp_path / "logits.pt"), str(tmp_path / "out")], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    two = torch.cat([torch.load(tmp_path / f"out.{rank}") for rank in range(2)])
    torch.testing.assert_close(two, sinkhorn_knopp(logits, 0.04, 3), rtol=1e-5, atol=1e-7)


# -------------------------------------------------------------------------------------------------------- bad data


def _cli_refusal(config_values: dict, tmp_path: Path, capsys) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config_values))
    assert cli.main(["pretrain", str(path)]) == 2
    assert not Path(config_values["output_dir"]).exists()  # refused before anything was made or computed
    return capsys.readouterr().err


def test_bad_data_and_configs_are_refused_before_compute_with_one_message(photos, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    err = _cli_refusal(tiny_values([empty], tmp_path / "run"), tmp_path, capsys)
    assert "hold no images" in err and str(empty) in err
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "a.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (corrupt / "b.png").write_bytes(b"")
    err = _cli_refusal(tiny_values([corrupt], tmp_path / "run"), tmp_path, capsys)
    assert "none of the 2 images checked is usable" in err and "a.jpg" in err
    small = tmp_path / "small"
    small.mkdir()
    cv2.imwrite(str(small / "tiny.png"), np.zeros((100, 80, 3), np.uint8))
    err = _cli_refusal(tiny_values([small], tmp_path / "run", data={"min_short_side": 0}), tmp_path, capsys)
    assert "smaller than the global crop 128x96" in err and "tiny.png" in err
    err = _cli_refusal(tiny_values([small], tmp_path / "run"), tmp_path, capsys)
    assert "data.min_short_side 384" in err
    err = _cli_refusal(tiny_values([photos], tmp_path / "run", masking={"ratio": 0.99}), tmp_path, capsys)
    assert "leaves no visible token on the 8x6 grid" in err
    err = _cli_refusal(tiny_values([photos], tmp_path / "run", views={"local_size": [60, 48]}), tmp_path, capsys)
    assert "views.local_size [60, 48] does not fit the patch grid" in err
    err = _cli_refusal(tiny_values([photos], tmp_path / "run", dino={"weigth": 1}), tmp_path, capsys)
    assert "Did you mean 'weight'" in err


def test_a_corrupt_image_mid_run_is_skipped_and_counted(photos, tmp_path, caplog):
    folder = tmp_path / "mixed"
    folder.mkdir()
    for path in sorted(photos.iterdir()):
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "zz_broken.png").write_bytes((photos / "camera.png").read_bytes()[:300])  # truncated
    config = tiny_config([folder], tmp_path / "run", steps=2, data={"batch_size": 5, "probe_images": 2})
    with caplog.at_level("WARNING", logger="sapiens2"):
        pretrain(config)
    assert sum(column(tmp_path / "run", "skipped")) >= 1  # every epoch holds all 5 files, the broken one too
    assert "zz_broken.png" in caplog.text


def test_folders_manifests_and_webdataset_shards_are_indexed_and_read(photos, tmp_path):
    names = sorted(p.name for p in photos.iterdir())
    manifest = tmp_path / "list.txt"
    copies = tmp_path / "copies"  # other files: a file the folder already holds would be read once
    copies.mkdir()
    for name in names[:2]:
        (copies / name).write_bytes((photos / name).read_bytes())
    manifest.write_text("\n".join(str(copies / name) for name in names[:2]) + "\n")
    shard = tmp_path / "shard-000.tar"
    with tarfile.open(shard, "w") as archive:
        for index, name in enumerate(names):
            archive.add(photos / name, arcname=f"sample{index:03d}.png")
            info = tarfile.TarInfo(f"sample{index:03d}.json")
            info.size = 2
            archive.addfile(info, __import__("io").BytesIO(b"{}"))
    entries = list_images([str(photos), str(manifest), str(shard)])
    assert len(entries) == 4 + 2 + 4
    direct = cv2.cvtColor(cv2.imread(str(photos / names[1])), cv2.COLOR_BGR2RGB)
    assert np.array_equal(entries[4 + 2 + 1].read(), direct) and np.array_equal(entries[1].read(), direct)
    summary = pretrain(tiny_config([str(shard)], tmp_path / "run", steps=1))
    assert summary["steps"] == 1


def test_largest_person_fraction_counts_confident_boxes_only():
    detections = np.array([[0, 0, 10, 10, 0.9], [0, 0, 50, 40, 0.4], [10, 10, 40, 40, 0.8]], np.float32)
    assert largest_person_fraction(detections, (100, 100, 3), 0.5) == pytest.approx(900 / 10000)
    assert largest_person_fraction(detections[:0], (100, 100, 3), 0.5) == 0.0


@pytest.mark.slow  # RTMDet-m on 512x512 photos on the CPU
def test_person_filter_keeps_images_whose_largest_person_is_prominent(photos, tmp_path):
    # The real RTMDet-m network (random weights): no box can cover the whole image, so min area 1 keeps nothing.
    weights = require(SHARED / "fixtures" / "detector" / "rtmdet_m_random_mmengine.pth")
    data = {"person_filter": True, "detector": str(weights), "probe_images": 2, "min_person_area": 1.0}
    values = tiny_values([photos], tmp_path / "run", data=data)
    with pytest.raises(ValueError, match="no prominent person"):
        PretrainTrainer(pretrain_config_from_dict(values))
    from sapiens2.pretrain.data import build_dataset

    dataset = build_dataset(tiny_config([photos], tmp_path / "run", data=data | {"min_person_area": 0.0}), False)
    assert int(dataset[0]["skipped"]) == 0


# ---------------------------------------------------------------------------------------------------- 4K and use


def test_4k_smoke_masks_windows_and_exports_the_tokenizer(photos, tmp_path):
    arch = {"embed_dims": 64, "num_layers": 2, "num_heads": 4, "feedforward_channels": 128, "num_tokenizer_layers": 1,
            "use_tokenizer": 1}  # fmt: skip
    config = tiny_config([photos], tmp_path / "run", steps=2, model={"arch": arch},
                         views={"global_size": [512, 384], "local_size": [128, 128], "n_local": 1},
                         data={"batch_size": 2, "min_short_side": 0})  # fmt: skip
    summary = pretrain(config)
    backbone = load_backbone(summary["model"])
    assert backbone.tokenizer is not None and "tokenizer.local_pos_embed" in backbone.state_dict()
    assert math.isfinite(column(tmp_path / "run", "mae")[-1])
    tokens, grid = encode(backbone, torch.randn(1, 3, 512, 384), torch.arange(12)[None])
    assert grid == (8, 6) and tokens.shape == (1, 9 + 12, 64)


def test_pretrained_backbone_fine_tunes_with_sapiens2_train_and_predicts(photos, tmp_path):
    from sapiens2 import Predictor
    from sapiens2.train.config import config_from_dict, save_config
    from sapiens2.train.demo_data import make_demo_dataset

    summary = pretrain(tiny_config([photos], tmp_path / "pre", steps=2))
    root = make_demo_dataset("seg", tmp_path / "seg", num_images=2)
    seg = {"deconv_out_channels": [16, 8], "deconv_kernel_sizes": [4, 4], "conv_out_channels": [8],
           "conv_kernel_sizes": [1]}  # fmt: skip
    config = config_from_dict({
        "task": "seg", "output_dir": str(tmp_path / "seg_run"), "steps": 2, "precision": "fp32", "device": "cpu",
        "progress_bar": False, "eval_every": 0, "checkpoint_every": 0,
        "model": {"init_from": str(summary["model"]), "head": seg},
        "data": {"root": str(root), "input_size": [64, 48], "batch_size": 2, "num_workers": 0},
        "schedule": {"warmup_steps": 1},
    })  # fmt: skip
    path = save_config(config, tmp_path / "seg.yaml")
    assert cli.main(["train", str(path)]) == 0
    result = Predictor("seg", model=tmp_path / "seg_run" / "model.safetensors", device="cpu", input_size=(64, 48))(
        [str(photos / "camera.png")]
    )[0]
    assert result.labels.shape == (512, 512)


def test_saved_config_round_trips(photos, tmp_path):
    config = tiny_config([photos], tmp_path / "run")
    assert pretrain_config_from_dict(yaml.safe_load(yaml.safe_dump(pretrain_config_to_dict(config)))) == config
    example = yaml.safe_load((REPO / "configs" / "pretrain_tiny.yaml").read_text())
    assert pretrain_config_from_dict(example).views.n_global_student >= 1


def test_views_and_masks_do_not_depend_on_the_worker_count(photos, tmp_path):
    from sapiens2.pretrain.data import build_dataset

    dataset = build_dataset(tiny_config([photos], tmp_path / "run"), use_tokenizer=False)
    dataset.set_epoch(3)
    batches = []
    for workers in (0, 2):
        loader = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=workers)
        batches.append(list(loader))
    for one, two in zip(*batches, strict=True):
        for key in ("globals", "locals", "masks", "block"):
            assert torch.equal(one[key], two[key]), key
    assert not torch.equal(batches[0][0]["masks"][0], batches[0][0]["masks"][1])  # samples differ


def test_bf16_autocast_activation_checkpointing_and_drop_path_train(photos, tmp_path):
    config = tiny_config([photos], tmp_path / "run", steps=2, precision="bf16",
                         model={"activation_checkpointing": True, "drop_path": 0.1, "rope_jitter": 1.2,
                                "rope_shift": 0.1})  # fmt: skip
    summary = pretrain(config)
    values = column(tmp_path / "run", "loss")
    assert len(values) == 2 and all(math.isfinite(v) for v in values)
    load_backbone(summary["model"])


def test_diverging_pretraining_stops_like_train_and_exports_nothing(photos, tmp_path):
    # The loop is train's: a NaN/inf loss or gradient norm skips the step, nonfinite_patience in a row stop the run.
    from sapiens2.train.trainer import TrainingDiverged

    config = tiny_config([photos], tmp_path / "run", steps=30, log_every=1, optimizer={"lr": 1e6})
    with pytest.raises(TrainingDiverged, match="training diverged") as caught:
        PretrainTrainer(config).fit()
    steps = len(rows(tmp_path / "run"))
    assert steps < 30 and f"stopped at step {steps} of 30" in str(caught.value)
    assert not math.isfinite(column(tmp_path / "run", "grad_norm")[-1] * column(tmp_path / "run", "loss")[-1])
    assert not list((tmp_path / "run").glob("*.safetensors"))
