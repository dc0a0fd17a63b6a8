"""Pretraining pieces (PRETRAIN.md §12 items 1-9, 13): mask counts/mode/shape, no leak through masked pixels,
RoPE gather, MAE loss semantics, Sinkhorn-Knopp, DINO pair weights, the EMA teacher, the 4K window masking."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sapiens2.models.backbone import Sapiens2
from sapiens2.pretrain.config import pretrain_config_from_dict
from sapiens2.pretrain.losses import (
    SoftmaxCentering,
    dino_loss,
    dino_pairs,
    koleo_loss,
    mae_loss,
    norm_pix_target,
    sinkhorn_knopp,
)
from sapiens2.pretrain.masking import MaskSpec, draw_mask, interior_fraction, keep_indices, mask_counts, mask_rng
from sapiens2.pretrain.model import PretrainTeacher, ema_parameters, ema_update, encode, patchify, rope_tables, tokenize
from sapiens2.pretrain.schedule import PretrainSchedule, build_pretrain_optimizer
from sapiens2.pretrain.trainer import build_student

TINY = {"embed_dims": 64, "num_layers": 4, "num_heads": 4, "feedforward_channels": 256, "num_tokenizer_layers": 0}
TINY_4K = {"embed_dims": 64, "num_layers": 2, "num_heads": 4, "feedforward_channels": 128, "num_tokenizer_layers": 1}


def tiny_config(**top):
    values = {
        "steps": 10,
        "model": {"arch": TINY, "layer_scale_init": 1.0},
        "views": {"global_size": [128, 96], "local_size": [64, 48], "n_local": 2},
        "mae": {"decoder_dim": 32, "decoder_depth": 1, "decoder_heads": 2},
        "dino": {"head_hidden": 128, "head_bottleneck": 32, "num_prototypes": 16},
        "data": {"sources": ["unused"], "batch_size": 4},
    }
    for key, value in top.items():
        values[key] = values.get(key, {}) | value if isinstance(value, dict) else value
    return pretrain_config_from_dict(values)


# ------------------------------------------------------------------------------------------------------ masking


@pytest.mark.parametrize(("grid", "n_mask"), [((64, 48), 2304), ((16, 12), 144), ((8, 6), 36)])
def test_every_mask_masks_exactly_n_mask_cells(grid, n_mask):
    spec = MaskSpec()
    assert mask_counts(grid[0] * grid[1], 0.75)[1] == n_mask
    for index in range(20 if grid[0] == 64 else 200):
        mask, _ = draw_mask(grid, spec, mask_rng(0, 0, index, 0))
        keep = keep_indices(mask)
        assert mask.sum() == n_mask and len(np.unique(keep)) == len(keep) == grid[0] * grid[1] - n_mask


def test_block_mode_fraction_is_the_block_probability():
    blocks = [draw_mask((16, 12), MaskSpec(), mask_rng(1, 0, i, 0))[1] for i in range(4000)]
    assert abs(np.mean(blocks) - 0.4) < 0.03


def test_block_masks_are_compact_and_patch_masks_scattered_and_seeded():
    spec = MaskSpec()
    interiors = {True: [], False: []}
    for index in range(300):
        mask, block = draw_mask((16, 12), spec, mask_rng(0, 0, index, 0))
        interiors[block].append(interior_fraction(mask))
    assert min(interiors[True]) >= 0.5 > max(interiors[False])
    # A pure function of (seed, epoch, index, view): no worker or process state involved.
    first, _ = draw_mask((16, 12), spec, mask_rng(3, 2, 7, 1))
    again, _ = draw_mask((16, 12), spec, mask_rng(3, 2, 7, 1))
    other, _ = draw_mask((16, 12), spec, mask_rng(3, 2, 7, 0))
    assert np.array_equal(first, again) and not np.array_equal(first, other)


# -------------------------------------------------------------------------------------- encoder and RoPE gather


@pytest.fixture(scope="module")
def backbone():
    torch.manual_seed(0)
    return Sapiens2(TINY, layer_scale_init_value=1.0).eval()


def _random_keep(batch: int, cells: int, n_keep: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(cells, generator=generator)[:n_keep].sort().values for _ in range(batch)])


def test_rope_tables_without_augmentation_are_the_backbones_and_augmentation_changes_them(backbone):
    sin, cos = backbone.rope_embed((8, 6))
    ours = rope_tables(backbone.rope_embed, (8, 6))
    assert torch.equal(ours[0], sin) and torch.equal(ours[1], cos)
    rescaled = rope_tables(backbone.rope_embed, (8, 6), rescale=2.0, generator=torch.Generator().manual_seed(1))
    assert rescaled[0].dtype == torch.bfloat16 and not torch.equal(rescaled[0], sin)


def test_keep_all_tokens_is_bit_identical_to_the_unmasked_forward(backbone):
    images = torch.randn(2, 3, 128, 96)
    full = backbone(images)[0]
    ours, _ = encode(backbone, images)
    assert torch.equal(ours, full)
    keep = torch.arange(48).expand(2, -1)
    gathered, _ = encode(backbone, images, keep)
    assert torch.equal(gathered, full)
    # Gathered table rows are the full table's rows, bit for bit.
    sin, _ = backbone.rope_embed((8, 6))
    assert torch.equal(sin[keep][0], sin)


def _permutation_error(model, images, order, claimed_order) -> tuple[float, float]:
    """(max, rms) of |encode(images, order) - the full forward's tokens taken in ``claimed_order``|."""
    with torch.no_grad():
        full = model(images)[0]
        ours, _ = encode(model, images, order)
    width = full.shape[-1]
    expected = torch.cat([full[:, :9], full[:, 9:].gather(1, claimed_order[:, :, None].expand(-1, -1, width))], 1)
    diff = (ours - expected).double()
    return diff.abs().max().item(), diff.pow(2).mean().sqrt().item()


def test_permuted_keep_gives_the_same_outputs_permuted():
    """Permuting the kept tokens permutes the outputs, within what the platform can promise.

    Permuting changes the order of every attention sum, so float32 rounding differs (~1e-7 relative). With a float32
    RoPE that is all: the bound is 1e-5 of the outputs' scale. With the official bf16 RoPE, q/k are rounded to
    bf16 and a 1e-7 change can flip a rounding (a 2^-8 step) that the next blocks carry on: on an Intel Xeon with
    AMX 5% of the elements moved by up to 5e-4, and 1 float32 ulp of input change moves them as much here. That
    effect is bounded by the bf16 RoPE's whole rounding error, measured on this platform as the distance between
    the bf16 and the float32 RoPE model (same weights): permuting can flip some of those roundings, never more.
    The negative control (two tokens swapped in the claimed order, a real bug) must fail both bounds.
    """
    images = torch.randn(2, 3, 128, 96, generator=torch.Generator().manual_seed(1))
    order = torch.stack([torch.randperm(48, generator=torch.Generator().manual_seed(s)) for s in range(2)])
    wrong = order.clone()
    wrong[:, [3, 4]] = wrong[:, [4, 3]]
    models = {}
    for rope in ("fp32", "bf16"):
        torch.manual_seed(0)
        models[rope] = Sapiens2(TINY, layer_scale_init_value=1.0, rope_dtype=rope).eval()
    with torch.no_grad():
        scale = models["fp32"](images)[0].abs().max().item()
        rope_error = (models["bf16"](images)[0] - models["fp32"](images)[0]).double()
    bounds = {
        "fp32": (1e-5 * scale, 1e-6 * scale),  # (max, rms): float32 reordering only
        "bf16": (rope_error.abs().max().item(), rope_error.pow(2).mean().sqrt().item()),  # the bf16 RoPE's rounding
    }
    assert 0 < bounds["bf16"][0] < 0.01 * scale  # the bound is this platform's bf16 rounding, not a loose number
    for rope, (max_bound, rms_bound) in bounds.items():
        max_error, rms_error = _permutation_error(models[rope], images, order, order)
        assert max_error <= max_bound and rms_error <= rms_bound, (rope, max_error, max_bound, rms_error, rms_bound)
        max_error, rms_error = _permutation_error(models[rope], images, order, wrong)  # the negative control
        assert max_error > max_bound and rms_error > rms_bound, (rope, "a wrong permutation passed the bound")


def test_a_float32_rounding_flip_stays_within_the_bf16_rope_bound():
    """What AMX does to the permuted forward (a different float32 rounding of the attention sums), done here by a
    1-ulp change of the input, stays within the bound above: the bf16 and float32 RoPE models' distance."""
    images = torch.randn(2, 3, 128, 96, generator=torch.Generator().manual_seed(1))
    models = {}
    for rope in ("fp32", "bf16"):
        torch.manual_seed(0)
        models[rope] = Sapiens2(TINY, layer_scale_init_value=1.0, rope_dtype=rope).eval()
    with torch.no_grad():
        bf16 = models["bf16"](images)[0]
        nudged = models["bf16"](images * (1 + 2**-22))[0]
        bound = (bf16 - models["fp32"](images)[0]).abs().max().item()
    moved = (nudged - bf16).abs()
    assert moved.max().item() > 1e-5  # the amplification is real: far beyond float32's 1e-7 ...
    assert moved.max().item() <= bound  # ... and within the bf16 RoPE's own rounding


def test_no_leak_through_masked_pixels(backbone):
    images = torch.randn(2, 3, 128, 96)
    keep = _random_keep(2, 48, 12)
    masked = torch.ones(2, 48, dtype=torch.bool).scatter(1, keep, False)
    pixel_mask = masked.reshape(2, 8, 6).repeat_interleave(16, 1).repeat_interleave(16, 2)[:, None]
    before, _ = encode(backbone, images, keep)
    changed = torch.where(pixel_mask, torch.randn_like(images) * 5, images)
    after, _ = encode(backbone, changed, keep)
    assert torch.equal(before, after)  # CLS, storage and visible tokens alike
    visible_change = images.clone()
    row, col = divmod(int(keep[0, 0]), 6)
    visible_change[0, :, row * 16 + 3, col * 16 + 5] += 1.0
    assert not torch.equal(encode(backbone, visible_change, keep)[0][0], before[0])


def test_4k_tokenizer_runs_on_kept_windows_only_without_leaks():
    torch.manual_seed(0)
    model = Sapiens2(TINY_4K, use_tokenizer=True, layer_scale_init_value=1.0).eval()
    images = torch.randn(1, 3, 512, 384)  # 32x24 patches -> 8x6 windows
    full = model(images)[0]
    assert torch.equal(encode(model, images)[0], full)
    tokens, grid = model.patch_embed(images)
    assert torch.equal(tokenize(model.tokenizer, tokens, grid)[0], model.tokenizer(tokens, grid)[0])
    mask, _ = draw_mask((8, 6), MaskSpec(), mask_rng(0, 0, 0, 0))
    keep = torch.from_numpy(keep_indices(mask))[None]
    pixel_mask = torch.from_numpy(mask).repeat_interleave(64, 0).repeat_interleave(64, 1)[None, None]
    before, window_grid = encode(model, images, keep)
    after, _ = encode(model, torch.where(pixel_mask, images * -3 + 1, images), keep)
    assert window_grid == (8, 6) and before.shape[1] == 9 + 12 and torch.equal(before, after)


# -------------------------------------------------------------------------------------------------------- losses


def test_mae_loss_counts_masked_patches_only_and_norm_pix_target_is_standardised():
    images = torch.randn(2, 3, 128, 96)
    target = norm_pix_target(patchify(images, 16))
    assert torch.allclose(target.mean(-1), torch.zeros(2, 48), atol=1e-5)
    assert torch.allclose(target.std(-1), torch.ones(2, 48), atol=1e-3)
    mask = torch.rand(2, 48) < 0.75
    pred = torch.randn_like(target)
    loss = mae_loss(pred, target, mask)
    assert torch.equal(mae_loss(torch.where(mask[..., None], pred, pred + 9), target, mask), loss)
    assert mae_loss(target, target, mask) == 0
    manual = ((pred - target) ** 2).mean(-1)[mask].mean()
    torch.testing.assert_close(loss, manual)
    # patchify is the decoder's pixel-shuffle order: value index = channel * 256 + row * 16 + column
    assert patchify(images, 16)[0, 7, 2 * 256 + 3 * 16 + 5] == images[0, 2, 16 + 3, 16 + 5]


def test_sinkhorn_knopp_rows_columns_and_shift_invariance():
    torch.manual_seed(0)
    logits = torch.randn(12, 16) * 0.1  # head logits: L2-normalised features times a linear layer
    q = sinkhorn_knopp(logits, 0.07, 3)
    torch.testing.assert_close(q.sum(1), torch.ones(12), rtol=0, atol=1e-6)
    # Columns near B/K after 3 iterations (plain softmax targets are far from it).
    assert (q.sum(0) - 12 / 16).abs().max() < 0.1 < (torch.softmax(logits / 0.07, -1).sum(0) - 12 / 16).abs().max()
    torch.testing.assert_close(sinkhorn_knopp(logits + 7.5, 0.07, 3), q, rtol=1e-5, atol=1e-6)
    assert torch.isfinite(sinkhorn_knopp(logits * 40, 0.04, 3)).all()  # no overflow at the lowest temperature


def test_dino_loss_is_the_plain_mean_over_18_pairs_without_the_diagonal():
    batch, prototypes = 3, 16
    student_global, student_local = torch.randn(batch, 2, prototypes), torch.randn(batch, 8, prototypes)
    targets = torch.softmax(torch.randn(batch, 2, prototypes), -1)
    loss, pairs = dino_loss(student_global, student_local, targets, n_teacher=2, student_temp=0.1)

    def ce(s, t):
        return -(t * torch.log_softmax(s / 0.1, -1)).sum(-1).mean()

    terms = [ce(student_global[:, 0], targets[:, 1]), ce(student_global[:, 1], targets[:, 0])]
    terms += [ce(student_local[:, i], targets[:, t]) for i in range(8) for t in range(2)]
    assert pairs == 18 and dino_pairs(2, 2) == [(0, 1), (1, 0)]
    torch.testing.assert_close(loss, torch.stack(terms).mean())
    assert dino_pairs(1, 1) == [(0, 1)]  # the page's View1 -> student, View2 -> teacher


def test_koleo_and_softmax_centering():
    features = torch.randn(6, 8, requires_grad=True)
    loss = koleo_loss(features)
    x = torch.nn.functional.normalize(features.detach(), dim=-1)
    similarity = x @ x.t() - 3 * torch.eye(6)
    nearest = similarity.argmax(1)
    torch.testing.assert_close(loss.detach(), -torch.log((x - x[nearest]).norm(dim=-1) + 1e-8).mean())
    loss.backward()
    assert torch.isfinite(features.grad).all()
    centering = SoftmaxCentering(16)
    logits = torch.randn(4, 16)
    first = centering(logits, 0.05)
    torch.testing.assert_close(first, torch.softmax(logits / 0.05, -1))  # centre 0 until updated
    centering(logits, 0.05)
    torch.testing.assert_close(centering.center, 0.1 * logits.mean(0, keepdim=True))


# ---------------------------------------------------------------------------------------------------------- EMA


def test_ema_teacher_follows_the_momentum_schedule_exactly():
    config = tiny_config(schedule={"freeze_last_layer_epochs": 1.0}, optimizer={"lr_scaling": "none"})
    torch.manual_seed(0)
    student = build_student(config)
    teacher = PretrainTeacher(student)
    student_state = student.state_dict()
    for name, tensor in teacher.state_dict().items():
        assert torch.equal(tensor, student_state[name]), name
    assert not any(p.requires_grad for p in teacher.parameters())
    teacher.train()
    assert not teacher.training and not teacher.backbone.training
    assert torch.equal(teacher.backbone.rope_embed.periods, student.backbone.rope_embed.periods)
    optimizer = build_pretrain_optimizer(student, config, "cpu")
    schedule = PretrainSchedule(optimizer, config, total_steps=10, steps_per_epoch=2)
    assert schedule.momentum(0) == pytest.approx(0.992) and schedule.momentum(10) == pytest.approx(1.0)
    pairs = ema_parameters(student, teacher)
    for step in range(3):
        frozen = [g for g in optimizer.param_groups if g["last_layer"]][0]
        assert (frozen["lr"] == 0) == (step < 2)  # one epoch = 2 steps of freeze
        previous = [t.clone() for t in pairs[0]]
        student(torch.randn(2, 3, 128, 96), _random_keep(2, 48, 12))["pred"].pow(2).mean().backward()
        optimizer.step()
        momentum = schedule.momentum(step)
        ema_update(*pairs, momentum)
        schedule.step()
        optimizer.zero_grad()
        for old, t, s in zip(previous, *pairs, strict=True):
            # <= 1e-7, or one float32 ulp for values above 1 (the update rounds twice, like the reference)
            torch.testing.assert_close(t, momentum * old + (1 - momentum) * s, rtol=1.2e-7, atol=1e-7)
    assert all(t.grad is None for t in teacher.parameters())
    moved = [not torch.equal(t, s) for t, s in zip(*pairs, strict=True)]
    assert any(moved)
    assert math.isclose(schedule.momentum(5), 1 - 0.008 * (1 + math.cos(math.pi * 0.5)) / 2)
