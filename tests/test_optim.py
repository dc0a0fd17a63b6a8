"""Layer-wise LR decay groups and the warm-up + linear-decay schedule against DENSE.md §6 / POSE.md §4.5."""

from __future__ import annotations

import pytest
import torch

from sapiens2.models.task_model import build_model
from sapiens2.train.optim import (
    WarmupLinearSchedule,
    build_optimizer,
    layer_id,
    lr_factor,
    param_groups,
    uses_weight_decay,
)

TINY = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}
SEG_HEAD = {
    "deconv_out_channels": (8,),
    "deconv_kernel_sizes": (4,),
    "conv_out_channels": (8,),
    "conv_kernel_sizes": (1,),
}


def lr_scales(groups: list[dict]) -> dict[str, float]:
    return {name: group["lr_scale"] for group in groups for name in group["param_names"]}


def test_layer_ids_follow_the_official_rule():
    assert layer_id("backbone.cls_token", 24) == 0
    assert layer_id("backbone.storage_tokens", 24) == 0
    assert layer_id("backbone.pos_embed", 24) == 0
    assert layer_id("backbone.patch_embed.projection.weight", 24) == 0
    assert layer_id("backbone.tokenizer.blocks.0.attn.wq.weight", 24) == 0
    assert layer_id("backbone.blocks.0.ffn.w12.weight", 24) == 1
    assert layer_id("backbone.layers.23.ln1.weight", 24) == 24
    assert layer_id("backbone.blocks.23.attn.proj.bias", 24) == 24
    assert layer_id("backbone.ln1.weight", 24) == 25
    assert layer_id("decode_head.conv_seg.weight", 24) == 25


@pytest.mark.parametrize(
    ("arch", "rate", "embed", "block0", "last"),
    [
        ("sapiens2_0.4b", 0.80, 0.00378, 0.00472, 0.80),
        ("sapiens2_0.8b", 0.85, 0.00469, 0.00551, 0.85),
        ("sapiens2_1b", 0.90, 0.0133, 0.0148, 0.90),
        ("sapiens2_5b", 0.94, 0.0294, 0.0313, 0.94),
    ],
)
def test_released_archs_get_the_spec_multipliers(arch, rate, embed, block0, last):
    model = build_model("seg", arch, device="meta")
    layers = model.backbone.num_layers
    scales = lr_scales(param_groups(model, lr=5e-4, weight_decay=0.1, layer_decay=rate))
    assert scales["backbone.patch_embed.projection.weight"] == pytest.approx(embed, rel=2e-3)
    assert scales["backbone.cls_token"] == scales["backbone.storage_tokens"] == rate ** (layers + 1)
    assert scales["backbone.blocks.0.attn.wq.weight"] == pytest.approx(block0, rel=2e-3)
    assert scales[f"backbone.blocks.{layers - 1}.ffn.w3.weight"] == pytest.approx(last, rel=1e-12)
    assert scales["backbone.ln1.weight"] == scales["decode_head.conv_seg.weight"] == 1.0


def test_groups_are_per_distinct_lr_and_decay_with_lrs_scaled():
    model = build_model("seg", TINY, input_size=(64, 48), **SEG_HEAD)
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.1, layer_decay=0.5)
    keys = [(group["lr"], group["weight_decay"]) for group in optimizer.param_groups]
    assert len(keys) == len(set(keys)) == 8  # 4 layer ids x (decay, no decay)
    expected = {0: 0.125e-3, 1: 0.25e-3, 2: 0.5e-3, 3: 1e-3}
    for group in optimizer.param_groups:
        for name in group["param_names"]:
            assert group["lr"] == expected[layer_id(name, 2)], name
    named = dict(model.named_parameters())
    grouped = [p for group in optimizer.param_groups for p in group["params"]]
    assert len(grouped) == len(named) and {id(p) for p in grouped} == {id(p) for p in named.values()}


def test_groups_merge_when_layer_decay_is_one():
    model = build_model("seg", TINY, input_size=(64, 48), **SEG_HEAD)
    groups = param_groups(model, lr=1e-3, weight_decay=0.1, layer_decay=1.0)
    assert sorted(group["weight_decay"] for group in groups) == [0.0, 0.1]


def test_no_weight_decay_on_norms_biases_layer_scale_and_pos_embed_but_on_tokens():
    model = build_model("seg", TINY, input_size=(64, 48), **SEG_HEAD)
    decays = {
        name: group["weight_decay"]
        for group in param_groups(model, lr=1e-3, weight_decay=0.1, layer_decay=0.9)
        for name in group["param_names"]
    }
    assert decays["backbone.blocks.0.ln1.weight"] == 0.0
    assert decays["backbone.blocks.0.attn.q_norm.weight"] == 0.0
    assert decays["backbone.blocks.0.attn.wq.bias"] == 0.0
    assert decays["backbone.ln1.weight"] == 0.0
    assert decays["decode_head.conv_seg.bias"] == 0.0
    assert decays["backbone.blocks.0.attn.wq.weight"] == 0.1
    assert decays["decode_head.conv_seg.weight"] == 0.1
    # Tokens are exempt by default; decay_tokens=True is the official rule, which decays them (POSE.md §4.5).
    assert decays["backbone.cls_token"] == decays["backbone.storage_tokens"] == 0.0
    assert uses_weight_decay("backbone.cls_token", torch.zeros(1, 1, 4), decay_tokens=True)
    assert not uses_weight_decay("backbone.pos_embed", torch.zeros(1, 5, 4))


def test_frozen_parameters_are_left_out():
    model = build_model("seg", TINY, input_size=(64, 48), frozen_stages=1, **SEG_HEAD)
    names = set(lr_scales(param_groups(model, lr=1e-3, weight_decay=0.1, layer_decay=0.9)))
    assert "backbone.blocks.0.attn.wq.weight" not in names and "backbone.cls_token" not in names
    assert "backbone.blocks.1.attn.wq.weight" in names


@pytest.mark.parametrize(
    ("step", "expected"),
    [(0, 5e-7), (250, 2.5025e-4), (500, 5e-4), (10_000, 2.564102564e-4), (19_999, 2.564102564e-8), (20_000, 0.0)],
)
def test_schedule_matches_the_spec_examples(step, expected):
    assert 5e-4 * lr_factor(step, 20_000, 500, 1e-3) == pytest.approx(expected, rel=1e-9, abs=1e-20)


def test_schedule_sets_group_lrs_each_step_and_matches_torch_schedulers():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([{"params": [parameter], "lr": 4e-4}])
    schedule = WarmupLinearSchedule(optimizer, total_steps=40, warmup_steps=10, start_factor=1e-3)
    reference_optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=4e-4)
    warmup = torch.optim.lr_scheduler.LinearLR(reference_optimizer, 1e-3, 1.0, total_iters=10)
    decay = torch.optim.lr_scheduler.PolynomialLR(reference_optimizer, total_iters=30, power=1.0)
    reference = torch.optim.lr_scheduler.SequentialLR(reference_optimizer, [warmup, decay], milestones=[10])
    for step in range(40):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(4e-4 * lr_factor(step, 40, 10), rel=1e-12)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(reference_optimizer.param_groups[0]["lr"], rel=1e-6)
        optimizer.step()
        schedule.step()
        reference_optimizer.step()
        reference.step()
    assert optimizer.param_groups[0]["lr"] == 0.0


def test_schedule_state_round_trips_exactly():
    model = build_model("seg", TINY, input_size=(64, 48), **SEG_HEAD)
    optimizer = build_optimizer(model, lr=1e-3, layer_decay=0.7)
    schedule = WarmupLinearSchedule(optimizer, total_steps=100, warmup_steps=7)
    for _ in range(13):
        schedule.step()
    other_optimizer = build_optimizer(model, lr=1e-3, layer_decay=0.7)
    other = WarmupLinearSchedule(other_optimizer, total_steps=100, warmup_steps=7)
    other.load_state_dict(schedule.state_dict())
    assert other.get_last_lr() == schedule.get_last_lr()
    schedule.step()
    other.step()
    assert other.get_last_lr() == schedule.get_last_lr()


def test_schedule_rejects_warmup_not_shorter_than_training():
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    with pytest.raises(ValueError, match="warmup_steps < total_steps"):
        WarmupLinearSchedule(optimizer, total_steps=10, warmup_steps=10)


def test_optimizer_refuses_a_fully_frozen_model():
    model = build_model("seg", TINY, input_size=(64, 48), **SEG_HEAD).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer(model, lr=1e-3)
