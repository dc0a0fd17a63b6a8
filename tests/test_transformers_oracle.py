"""Second oracle: transformers' independent Sapiens2 port, loading the same official-layout file.

transformers uses a float32 RoPE, so ours runs with ``rope_dtype="fp32"`` here; the two must agree to ~1e-5.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_rel_close, require_module
from safetensors.torch import save_file

from sapiens2 import Sapiens2

transformers = require_module("transformers", minversion="5.23")


def randomize_norms_and_scales(model: torch.nn.Module) -> None:
    """Random weights everywhere: trained LayerScale and norm weights are far from their init values."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("gamma.weight"):
                param.uniform_(0.1, 1.0)
            elif name.endswith(("norm.weight", "ln1.weight", "ln2.weight")):
                param.uniform_(0.5, 1.5)


def hf_model_from_official_file(model: Sapiens2, folder):
    arch = model.arch
    config = transformers.Sapiens2Config(
        hidden_size=arch.embed_dims,
        intermediate_size=arch.feedforward_channels,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_attention_heads=arch.num_heads // 2,
        image_size=list(model.img_size),
        patch_size=16,
    )
    config.save_pretrained(folder)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    return transformers.Sapiens2Model.from_pretrained(folder).eval()


@pytest.mark.slow  # 8-15 s: the default suite stays under 10 minutes
def test_backbone_agrees_with_transformers_port_on_real_size_arch(tmp_path):
    torch.manual_seed(0)
    ours = Sapiens2("sapiens2_0.4b", rope_dtype="fp32").eval()  # real widths, GQA blocks 8-15
    randomize_norms_and_scales(ours)
    theirs = hf_model_from_official_file(ours, tmp_path)
    x = torch.randn(2, 3, 128, 96)
    with torch.inference_mode():
        got = ours(x)[0]
        expected = theirs(pixel_values=x).last_hidden_state
    assert_rel_close(got, expected, max_rel=1e-5, rms_rel=1e-5, name="last_hidden_state")
