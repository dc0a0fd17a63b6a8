"""Backbone and 4K tokenizer against the official implementation's outputs (parity categories A and B)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import PARITY, load_case
from parity import assert_parity, misses_parity, platform_outputs, tensor_rule
from safetensors.torch import load_file
from torch import nn

from sapiens2 import Sapiens2
from sapiens2.models.zoo import ARCH_FIELDS

CASES = ["A_backbone_bf16rope", "A_backbone_fp32rope", "B_backbone_tokenizer"]


def build_from_case(case: dict, out_type: str = "raw", out_indices=-1) -> Sapiens2:
    spec = case["model"]["backbone"]
    kwargs = case["model"]["constructor_kwargs"]
    return Sapiens2(
        arch={k: spec[k] for k in ARCH_FIELDS} | {"num_tokenizer_layers": spec["num_tokenizer_layers_in_arch_table"]},
        img_size=tuple(kwargs["img_size"]),
        patch_size=kwargs["patch_size"],
        use_tokenizer=kwargs["use_tokenizer"],
        window_size=kwargs["window_size"],
        n_storage_tokens=kwargs["n_storage_tokens"],
        rope_dtype=kwargs["pos_embed_rope_dtype"],
        out_type=out_type,
        out_indices=out_indices,
    ).eval()


@pytest.mark.parametrize("name", CASES)
def test_backbone_matches_official_outputs(name):
    """Bit-identical to the official outputs of a matching CPU, else within the widened loose tier (parity.py)."""
    case, folder = load_case(name)
    weights = load_file(folder / "weights.safetensors")
    inputs = load_file(folder / "inputs.safetensors")
    checked = set()
    for run in case["model"]["runs"]:
        model = build_from_case(case, run["out_type"], run["out_indices"])
        model.load_state_dict(weights, strict=True)
        for input_name, x in inputs.items():
            with torch.inference_mode():
                outputs = model(x)
            assert len(outputs) == len(run["resolved_out_indices"])
            for block, got in zip(run["resolved_out_indices"], outputs, strict=True):
                key = f"{input_name}__{run['out_type']}__block{block}"
                assert_parity(name, key, got)
                checked.add(key)
    assert checked == {k for k in platform_outputs(name)["reference"] if not k.startswith("debug__")}


@pytest.mark.parametrize("name", CASES)
def test_rope_tables_and_periods_match_official(name):
    case, folder = load_case(name)
    expected = load_file(folder / "outputs.safetensors")
    model = build_from_case(case)
    model.rope_embed.reset_parameters()  # recomputed, not loaded: the construction rule itself must match
    assert torch.equal(model.rope_embed.periods, expected["debug__rope_periods"])
    model.load_state_dict(load_file(folder / "weights.safetensors"))
    for input_name, x in load_file(folder / "inputs.safetensors").items():
        with torch.inference_mode():
            tokens, grid = model.patch_embed(x)
            if model.tokenizer is not None:
                windows, grid = model.tokenizer(tokens, grid)
                assert_parity(name, f"debug__{input_name}__tokenizer_tokens_sample0", windows[:1])
            sin, cos = model.rope_embed(grid)
        assert_parity(name, f"debug__{input_name}__patch_embed_tokens_sample0", tokens[:1])
        assert_parity(name, f"debug__{input_name}__rope_sin", sin)
        assert_parity(name, f"debug__{input_name}__rope_cos", cos)


def _wrong_models(case: dict, weights: dict) -> dict[str, Sapiens2]:
    """Two real bugs a parity test must catch: RoPE in float32 instead of bfloat16, and a norm left out."""
    fp32_rope, no_norm = build_from_case(case), build_from_case(case)
    fp32_rope.load_state_dict(weights)
    fp32_rope.rope_embed.dtype = torch.float32
    no_norm.load_state_dict(weights)
    no_norm.blocks[-1].ln2 = nn.Identity()
    return {"fp32 RoPE": fp32_rope, "dropped norm": no_norm}


@pytest.mark.parametrize("name", ["A_backbone_bf16rope", "B_backbone_tokenizer"])
def test_wrong_models_fail_the_widened_tier(name):
    """Negative controls: the tier the portable test falls back to still rejects a wrong RoPE dtype or norm."""
    case, folder = load_case(name)
    weights = load_file(folder / "weights.safetensors")
    inputs = load_file(folder / "inputs.safetensors")
    last = case["model"]["backbone"]["num_layers"] - 1
    for bug, model in _wrong_models(case, weights).items():
        for input_name, x in inputs.items():
            with torch.inference_mode():
                got = model(x)[0]
            assert misses_parity(name, f"{input_name}__raw__block{last}", got), f"{bug} passed the parity rule"


def test_fp32_rope_case_has_its_own_negative_control():
    """In the fp32-RoPE case a bf16 RoPE is the bug, and the widened tier there is tight (loose max_rel 1e-5)."""
    case, folder = load_case("A_backbone_fp32rope")
    model = build_from_case(case)
    model.rope_embed.dtype = torch.bfloat16
    model.load_state_dict(load_file(folder / "weights.safetensors"))
    last = case["model"]["backbone"]["num_layers"] - 1
    for input_name, x in load_file(folder / "inputs.safetensors").items():
        with torch.inference_mode():
            got = model(x)[0]
        assert misses_parity("A_backbone_fp32rope", f"{input_name}__raw__block{last}", got)


def test_widening_reads_the_observed_cross_cpu_movement():
    """parity.py derives the widening from the two stored platform files; it agrees with cross_cpu.json."""
    cross = json.loads((PARITY / "cross_cpu.json").read_text())
    for name in CASES:
        stored = platform_outputs(name)
        for key, observed in cross[name].items():
            got = tensor_rule(stored["avx512"][key].double().numpy(), stored["reference"][key].double().numpy())
            assert got == pytest.approx((observed["max_rel"], observed["rms_rel"]), rel=1e-6), key


def test_casting_the_model_does_not_change_rope_numerics():
    """Official trap (MODEL.md §1.4): ``.float()`` on the reference promotes RoPE to fp32. Ours stays bf16."""
    case, folder = load_case("A_backbone_bf16rope")
    model = build_from_case(case)
    model.load_state_dict(load_file(folder / "weights.safetensors"))
    x = load_file(folder / "inputs.safetensors")["x_64x48"]
    with torch.inference_mode():
        before = model(x)[0]
        model.rope_embed.periods.data = model.rope_embed.periods.float()
        after = model.float()(x)[0]
    assert torch.equal(before, after)
