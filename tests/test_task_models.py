"""Task models (backbone + head): official outputs (category C), released key layouts, loading by shapes."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import KEYS, assert_rel_close, load_case, require
from safetensors.torch import load_file, save_file

from sapiens2 import build_model, load_model
from sapiens2.checkpoints import CheckpointMismatchError
from sapiens2.models.task_model import TASKS

C_TASKS = ["pose", "seg", "normal", "pointmap", "albedo"]
RELEASED = ["sapiens2_0.4b", "sapiens2_0.8b", "sapiens2_1b", "sapiens2_5b"]
TINY = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}


@pytest.mark.parametrize("task", C_TASKS)
def test_task_model_matches_official_outputs_bitwise(task):
    case, folder = load_case(f"C_{task}")
    model = load_model(task, folder / "weights.safetensors")
    x = load_file(folder / "inputs.safetensors")["x"]
    expected = load_file(folder / "outputs.safetensors")
    with torch.inference_mode():
        got = model(x)
    got = dict(zip(("pointmap", "scale"), got, strict=True)) if task == "pointmap" else {"out": got}
    names = [k for k in expected if not k.startswith("debug__")]
    strict = case["tolerance"]["suggested"]["strict"]
    for name, tensor in zip(names, got.values(), strict=True):
        assert_rel_close(tensor, expected[name], strict["max_rel"], strict["rms_rel"], name)
        assert torch.equal(tensor, expected[name]), f"{task}/{name}: not bit-identical"


@pytest.mark.parametrize("arch", RELEASED)
@pytest.mark.parametrize("task", C_TASKS)
def test_state_dict_equals_official_task_keys(task, arch):
    reference = json.loads(require(KEYS / f"{arch}_{task}.json").read_text())
    model = build_model(task, arch, device="meta")
    ours = [[k, list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in model.state_dict().items()]
    assert ours == reference["keys"]
    assert sum(p.numel() for p in model.parameters()) == reference["num_parameters"]


def test_matting_head_of_unknown_widths_loads_from_shapes(tmp_path):
    torch.manual_seed(0)
    model = build_model(
        "matting", TINY, input_size=(64, 48), upsample_channels=(24, 16, 12, 8), conv_out_channels=(8, 6, 4)
    ).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "m.safetensors"))
    loaded = load_model("matting", tmp_path / "m.safetensors")
    x = torch.randn(1, 3, 64, 48)
    with torch.inference_mode():
        out = loaded(x)
        assert torch.equal(out, model(x))
    assert out.shape == (1, 4, 64, 48) and 0 <= out.min() and out.max() <= 1


def test_loading_the_wrong_kind_of_file_names_the_problem(tmp_path):
    seg = build_model(
        "seg", TINY, conv_out_channels=(8,), conv_kernel_sizes=(1,), deconv_out_channels=(8,), deconv_kernel_sizes=(4,)
    )
    save_file({k: v.contiguous() for k, v in seg.state_dict().items()}, str(tmp_path / "seg.safetensors"))
    with pytest.raises(CheckpointMismatchError, match="holds a 'seg' model, not 'normal'"):
        load_model("normal", tmp_path / "seg.safetensors")
    save_file({k: v.contiguous() for k, v in seg.backbone.state_dict().items()}, str(tmp_path / "bb.safetensors"))
    with pytest.raises(CheckpointMismatchError, match="not a task checkpoint"):
        load_model("seg", tmp_path / "bb.safetensors")
    with pytest.raises(ValueError, match="did you mean|Did you mean"):
        build_model("normals", TINY)


SMALL_HEADS = {
    "pose": {
        "out_channels": 17,
        "deconv_out_channels": (16,),
        "deconv_kernel_sizes": (4,),
        "conv_out_channels": (8,),
        "conv_kernel_sizes": (1,),
    },
    "seg": {
        "deconv_out_channels": (16, 8),
        "deconv_kernel_sizes": (4, 4),
        "conv_out_channels": (8,),
        "conv_kernel_sizes": (1,),
    },
    "normal": {"upsample_channels": (16, 8, 8, 8), "conv_out_channels": (8,), "conv_kernel_sizes": (3,)},
    "albedo": {"upsample_channels": (16, 8, 8, 8), "conv_out_channels": (8,), "conv_kernel_sizes": (3,)},
    "matting": {"upsample_channels": (16, 8, 8, 8), "conv_out_channels": (8,), "conv_kernel_sizes": (3,)},
    "pointmap": {
        "upsample_channels": (16, 8, 8, 8),
        "conv_out_channels": (8,),
        "conv_kernel_sizes": (3,),
        "scale_conv_out_channels": (16, 8, 4),
        "scale_final_layer": (16, 8, 1),
    },
}


def test_every_task_builds_and_backpropagates_on_a_tiny_arch():
    for task in TASKS:
        torch.manual_seed(0)
        model = build_model(task, TINY, input_size=(256, 192), **SMALL_HEADS[task])
        out = model(torch.randn(2, 3, 256, 192))
        out = out[0].sum() + out[1].sum() if task == "pointmap" else out.sum()
        out.backward()
        missing = [n for n, p in model.named_parameters() if p.grad is None]
        assert not missing, f"{task}: no gradient for {missing[:3]}"
