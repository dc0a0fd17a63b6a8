"""Second oracle for the task models: transformers' independent Sapiens2 port reads the same official-layout file.

For each task a small random model (18 blocks, so blocks 8-9 use GQA; narrow heads) is written as
``model.safetensors`` next to a transformers ``config.json`` describing the same backbone and head. Our
``load_model`` and transformers' ``Sapiens2For*.from_pretrained`` both load that one file, run on the same input,
and must agree on the raw head outputs to 1e-5 relative. transformers computes RoPE in float32, so ours runs with
``rope_dtype="fp32"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_rel_close, require_module
from safetensors.torch import save_file

from sapiens2 import build_model, load_model
from sapiens2.models.heads import infer_head_config
from sapiens2.models.task_model import OUTPUT_LAYERS, TaskModel

transformers = require_module("transformers", minversion="5.23")

# Real block structure (full MHA in blocks 0-7 and 10-17, GQA with h/2 kv heads in blocks 8-9, MODEL.md §1.1) at a
# width that keeps each case to a few seconds on one CPU thread. head_dim 64 as in the released archs.
ARCH = {
    "name": "oracle_18_blocks",
    "embed_dims": 256,
    "num_layers": 18,
    "num_heads": 4,
    "feedforward_channels": 1024,
    "num_tokenizer_layers": 2,
}

# Head overrides: the released layer counts and kernel sizes (transformers' weight renaming names each layer index
# explicitly, and its deconv heads only support kernel 4 / padding 1 and 1x1 convs), with narrow widths.
PIXEL_SHUFFLE_HEAD = {"upsample_channels": (64, 32, 32, 16), "conv_out_channels": (16, 16, 8)}
CASES = {
    "seg": {
        "head": {"deconv_out_channels": (64, 32, 32, 16), "conv_out_channels": (16, 16), "num_classes": 29},
        "input_size": (128, 96),
        "hf_class": "Sapiens2ForSemanticSegmentation",
    },
    "pose": {
        "head": {"deconv_out_channels": (64, 32), "conv_out_channels": (32, 32, 16), "out_channels": 308},
        "input_size": (256, 192),
        "hf_class": "Sapiens2ForPoseEstimation",
    },
    "normal": {"head": PIXEL_SHUFFLE_HEAD, "input_size": (128, 96), "hf_class": "Sapiens2ForNormalEstimation"},
    "pointmap": {
        # 256x192 -> a 16x12 token grid -> 2x2 after the three stride-2 scale convs: 16 channels x 4 cells = 64.
        "head": PIXEL_SHUFFLE_HEAD | {"scale_conv_out_channels": (64, 32, 16), "scale_final_layer": (64, 32, 16, 1)},
        "input_size": (256, 192),
        "hf_class": "Sapiens2ForPointmapEstimation",
    },
    "matting": {"head": PIXEL_SHUFFLE_HEAD, "input_size": (128, 96), "hf_class": "Sapiens2ForImageMatting"},
}


@torch.no_grad()
def randomize(model: TaskModel, seed: int) -> None:
    """Push every weight away from its init value, so a mis-wired tensor cannot hide behind a 0, 1 or constant.

    LayerScale in U(0.1, 1) and norm weights in U(0.5, 1.5) (trained values are far from 1e-4 and 1); biases
    N(0, 0.05) (init is 0, which would hide swapped biases); the scale MLP's Linear weights N(0, 1/fan_in), so the
    scale depends on the features and not just on the last bias.
    """
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("gamma.weight"):
            param.copy_(torch.rand(param.shape, generator=generator) * 0.9 + 0.1)
        elif name.endswith(("norm.weight", "ln1.weight", "ln2.weight")):
            param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
        elif name.endswith(".bias"):
            param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
        elif name.startswith("decode_head.scale_final_layer.") and param.ndim == 2:
            param.copy_(torch.randn(param.shape, generator=generator) / param.shape[1] ** 0.5)


def transformers_config(task: str, state_dict: dict[str, torch.Tensor], input_size: tuple[int, int]):
    """A ``Sapiens2Config`` describing the backbone and head held by ``state_dict`` (official key layout)."""
    head = infer_head_config(
        task, {k.removeprefix("decode_head."): v for k, v in state_dict.items() if k.startswith("decode_head.")}
    )
    head_config: dict[str, Any] = {"conv_out_channels": list(head["conv_out_channels"])}
    head_config["conv_kernel_sizes"] = list(head["conv_kernel_sizes"])
    if task in ("seg", "pose"):
        head_config["upsample_out_channels"] = list(head["deconv_out_channels"])
        head_config["upsample_kernel_sizes"] = list(head["deconv_kernel_sizes"])
    else:
        head_config["use_pixel_shuffle"] = True
        head_config["upsample_out_channels"] = list(head["upsample_channels"])
        # Our pixel-shuffle unit's conv is always 3x3 (MODEL.md §2.4).
        head_config["upsample_kernel_sizes"] = [3] * len(head["upsample_channels"])
    if task == "pointmap":
        head_config["scale_conv_out_channels"] = list(head["scale_conv_out_channels"])
        head_config["scale_conv_kernel_sizes"] = list(head["scale_conv_kernel_sizes"])
        # scale_final_input_size is left for transformers to derive from image_size: checked against ours below.
        head_config["scale_final_hidden_sizes"] = list(head["scale_final_layer"][1:-1])
    return transformers.Sapiens2Config(
        hidden_size=ARCH["embed_dims"],
        intermediate_size=ARCH["feedforward_channels"],
        num_hidden_layers=ARCH["num_layers"],
        num_attention_heads=ARCH["num_heads"],
        num_key_value_attention_heads=ARCH["num_heads"] // 2,
        image_size=list(input_size),
        patch_size=16,
        num_labels=state_dict[f"decode_head.{OUTPUT_LAYERS[task]}.weight"].shape[0],
        head_config=head_config,
    )


def run_transformers(task: str, model, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """transformers' raw head output in our layout."""
    output = model(pixel_values=x)
    if task == "seg":
        return output.logits
    if task == "pose":
        return output.heatmaps
    if task == "normal":
        return output.normals
    if task == "pointmap":
        return output.pointmaps, output.scales
    # Matting: both apply the sigmoid to all four channels of the final 1x1 conv (MATTING.md); transformers splits
    # them into foregrounds (0-2, pre-multiplied RGB) and alphas (3). Reassembled, the quantity is our output.
    return torch.cat([output.foregrounds, output.alphas], dim=1)


@pytest.mark.parametrize("task", list(CASES))
def test_task_model_agrees_with_transformers_port_loading_same_file(task: str, tmp_path: Path) -> None:
    case = CASES[task]
    input_size = case["input_size"]
    built = build_model(task, ARCH, input_size=input_size, rope_dtype="fp32", **case["head"])
    randomize(built, seed=len(task))
    state_dict = {k: v.contiguous() for k, v in built.state_dict().items()}
    save_file(state_dict, str(tmp_path / "model.safetensors"))
    config = transformers_config(task, state_dict, input_size)
    config.save_pretrained(tmp_path)

    kv_heads = [built.backbone.arch.kv_heads(i) for i in range(ARCH["num_layers"])]
    assert config.num_key_value_heads_per_layer == kv_heads
    assert min(kv_heads) < ARCH["num_heads"], "the arch must contain GQA blocks"
    if task == "pointmap":
        assert config.head_config.scale_final_input_size == case["head"]["scale_final_layer"][0]

    ours = load_model(task, tmp_path / "model.safetensors", rope_dtype="fp32")
    hf_class = getattr(transformers, case["hf_class"])
    theirs, info = hf_class.from_pretrained(tmp_path, output_loading_info=True)
    theirs.eval()
    # Every tensor of the file went somewhere and nothing in theirs kept a random init. transformers may skip the
    # RoPE periods buffer (it recomputes its frequencies from the config); nothing else may be left over.
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["mismatched_keys"], info["mismatched_keys"]
    assert not info["error_msgs"], info["error_msgs"]
    assert all(key.endswith("rope_embed.periods") for key in info["unexpected_keys"]), info["unexpected_keys"]
    assert sum(p.numel() for p in theirs.parameters()) == sum(p.numel() for p in ours.parameters())
    assert {p.dtype for p in theirs.parameters()} == {torch.float32}

    x = torch.randn(2, 3, *input_size, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got = ours(x)
        expected = run_transformers(task, theirs, x)
    if task == "pointmap":
        assert_rel_close(got[0], expected[0], max_rel=1e-5, rms_rel=1e-5, name="pointmap")
        assert_rel_close(got[1], expected[1], max_rel=1e-5, rms_rel=1e-5, name="scale")
    else:
        assert_rel_close(got, expected, max_rel=1e-5, rms_rel=1e-5, name=task)
