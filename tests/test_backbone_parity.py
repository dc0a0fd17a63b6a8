"""Backbone and 4K tokenizer against the official implementation's outputs (parity categories A and B)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_rel_close, load_case
from safetensors.torch import load_file

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
def test_backbone_matches_official_outputs_bitwise(name):
    case, folder = load_case(name)
    weights = load_file(folder / "weights.safetensors")
    inputs = load_file(folder / "inputs.safetensors")
    expected = load_file(folder / "outputs.safetensors")
    strict = case["tolerance"]["suggested"]["strict"]
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
                assert_rel_close(got, expected[key], strict["max_rel"], strict["rms_rel"], key)
                # Aim of the project: bit-identical on CPU with one thread.
                assert torch.equal(got, expected[key]), f"{key}: not bit-identical"
                checked.add(key)
    assert checked == {k for k in expected if not k.startswith("debug__")}


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
                torch.testing.assert_close(
                    windows[:1], expected[f"debug__{input_name}__tokenizer_tokens_sample0"], rtol=0, atol=0
                )
            sin, cos = model.rope_embed(grid)
        assert torch.equal(tokens[:1], expected[f"debug__{input_name}__patch_embed_tokens_sample0"])
        assert torch.equal(sin, expected[f"debug__{input_name}__rope_sin"])
        assert torch.equal(cos, expected[f"debug__{input_name}__rope_cos"])


def test_fp32_rope_case_is_not_reproduced_by_bf16_rope():
    """The parity test can fail: the same weights with the wrong RoPE dtype miss the strict bound."""
    case, folder = load_case("A_backbone_bf16rope")
    weights = load_file(folder / "weights.safetensors")
    expected = load_file(folder / "outputs.safetensors")
    model = build_from_case(case)
    model.rope_embed.dtype = torch.float32
    model.load_state_dict(weights)
    x = load_file(folder / "inputs.safetensors")["x_64x48"]
    with torch.inference_mode():
        got = model(x)[0]
    with pytest.raises(AssertionError):
        assert_rel_close(got, expected["x_64x48__raw__block17"], 1e-5, 1e-6)


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
