"""Every released architecture: official keys, shapes, dtypes and order; exact parameter counts and FLOPs."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import KEYS, require

from sapiens2 import ARCHS, Sapiens2, get_arch

# Archs with published weights (official keys and counts to compare with); the distill students are checked below.
RELEASED = [name for name, arch in ARCHS.items() if arch.released]

# MODEL.md §1.9, measured on the official implementation.
OFFICIAL_PARAMS = {
    "sapiens2_0.1b": 113_993_472,
    "sapiens2_0.4b": 395_450_368,
    "sapiens2_0.8b": 814_283_520,
    "sapiens2_1b": 1_455_474_176,
    "sapiens2_1b_4k": 1_606_588_928,
    "sapiens2_5b": 5_066_902_976,
}
OFFICIAL_TFLOPS = {  # total per image at the native input, 4 significant digits
    "sapiens2_0.1b": 1.051,
    "sapiens2_0.4b": 3.367,
    "sapiens2_0.8b": 6.569,
    "sapiens2_1b": 11.30,
    "sapiens2_5b": 36.38,
    "sapiens2_1b_4k": 27.20,
}


@pytest.mark.parametrize("name", RELEASED)
def test_state_dict_equals_official_pretrain_keys(name):
    reference = json.loads(require(KEYS / f"{name}_pretrain.json").read_text())
    model = Sapiens2(name, device="meta")
    ours = [[k, list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in model.state_dict().items()]
    assert ours == reference["keys"]
    assert sum(p.numel() for p in model.parameters()) == reference["num_parameters"]


@pytest.mark.parametrize("name", RELEASED)
def test_parameter_formula_and_flops_match_spec(name):
    arch = ARCHS[name]
    assert arch.num_parameters() == OFFICIAL_PARAMS[name]
    assert round(arch.flops() / 1e12, 4 - len(str(int(arch.flops() // 1e12)))) == pytest.approx(OFFICIAL_TFLOPS[name])


def test_flops_formula_agrees_with_torch_flop_counter():
    """The closed form counts what torch counts on a meta forward (attention matmuls included)."""
    from torch.utils.flop_counter import FlopCounterMode

    arch = {"embed_dims": 64, "num_layers": 10, "num_heads": 4, "feedforward_channels": 256, "num_tokenizer_layers": 2}
    for use_tokenizer, size in ((False, (128, 96)), (True, (256, 192))):
        model = Sapiens2(arch, use_tokenizer=use_tokenizer, device="meta").eval()
        with FlopCounterMode(display=False) as counter:
            model(torch.empty(1, 3, *size, device="meta"))
        expected = dataclasses.replace(get_arch(arch), use_tokenizer=use_tokenizer)
        assert counter.get_total_flops() == expected.flops(size)


def test_gqa_layout_follows_official_rule():
    model = Sapiens2("sapiens2_1b", device="meta")
    kv = [block.attn.num_kv_heads for block in model.blocks]
    assert kv == [24] * 8 + [12] * 24 + [24] * 8


def test_custom_arch_dict_and_errors():
    model = Sapiens2(
        {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}
    )
    assert model.arch.embed_dims == 32 and len(model.blocks) == 2
    with pytest.raises(ValueError, match="did you mean"):
        get_arch("sapiens2_1bb")
    with pytest.raises(ValueError, match="missing"):
        get_arch({"embed_dims": 32})
    with pytest.raises(ValueError, match="out_type"):
        Sapiens2("sapiens2_0.1b", out_type="tokens", device="meta")
    with pytest.raises(ValueError, match="out_indices"):
        Sapiens2("sapiens2_0.1b", out_indices=12, device="meta")
    with pytest.raises(TypeError):
        Sapiens2("sapiens2_0.1b", device="meta", not_an_option=1)
    assert get_arch("1b") is ARCHS["sapiens2_1b"]


def test_model_card_quick_start_runs():
    """The HF model card's quick start, with only its import line changed (tiny input to stay fast)."""
    model = Sapiens2(arch="sapiens2_0.1b", img_size=(1024, 768), patch_size=16).eval()
    x = torch.randn(1, 3, 64, 48)
    with torch.inference_mode():
        features = model(x)[0]
    assert features.shape == (1, 9 + 4 * 3, 768)


def test_frozen_stages_freeze_and_stay_in_eval():
    model = Sapiens2(
        {"embed_dims": 32, "num_layers": 3, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0},
        frozen_stages=2,
    )
    model.train()
    assert not model.patch_embed.projection.weight.requires_grad and not model.cls_token.requires_grad
    assert not any(p.requires_grad for p in model.blocks[1].parameters())
    assert all(p.requires_grad for p in model.blocks[2].parameters()) and model.ln1.weight.requires_grad
    assert not model.blocks[0].training and model.blocks[2].training


def test_student_archs_are_smaller_same_block_archs_with_exact_counts_and_no_released_weights():
    """The distill students (about 20M and 5M): the formula counts what the built model holds, they have no repo."""
    students = {name: arch for name, arch in ARCHS.items() if not arch.released}
    assert set(students) == {"sapiens2_student_20m", "sapiens2_student_5m"}
    counts = {}
    for name, arch in students.items():
        model = Sapiens2(name, device="meta")
        counts[name] = sum(p.numel() for p in model.parameters())
        assert counts[name] == arch.num_parameters() and arch.released_tasks == ()
        assert arch.num_parameters() < ARCHS["sapiens2_0.1b"].num_parameters()
        assert get_arch(arch.size) is arch
    assert counts == {"sapiens2_student_20m": 19_223_680, "sapiens2_student_5m": 4_893_760}
