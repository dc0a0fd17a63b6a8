"""Task models (backbone + head): official outputs (category C), released key layouts, loading by shapes."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import KEYS, load_case, require
from parity import assert_parity, misses_parity, platform_outputs
from safetensors.torch import load_file, save_file

from sapiens2 import build_model, load_model
from sapiens2.checkpoints import CheckpointMismatchError
from sapiens2.models.heads import RMSNorm2d
from sapiens2.models.task_model import TASKS

C_TASKS = ["pose", "seg", "normal", "pointmap", "albedo"]
RELEASED = ["sapiens2_0.4b", "sapiens2_0.8b", "sapiens2_1b", "sapiens2_5b"]
TINY = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}


NORMS = (torch.nn.InstanceNorm2d, RMSNorm2d)


def _case_outputs(task: str, model, x: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.inference_mode():
        got = model(x)
    if task == "pointmap":
        return dict(zip(("pointmap", "scale"), got, strict=True))
    names = [k for k in platform_outputs(f"C_{task}")["reference"] if not k.startswith("debug__")]
    return dict(zip(names, (got,), strict=True))


@pytest.mark.parametrize("task", C_TASKS)
def test_task_model_matches_official_outputs(task):
    """Bit-identical to the official outputs of a matching CPU, else within the widened loose tier (parity.py)."""
    _, folder = load_case(f"C_{task}")
    model = load_model(task, folder / "weights.safetensors")
    for name, tensor in _case_outputs(task, model, load_file(folder / "inputs.safetensors")["x"]).items():
        assert_parity(f"C_{task}", name, tensor)


@pytest.mark.parametrize("task", C_TASKS)
def test_wrong_task_models_fail_the_widened_tier(task):
    """Negative controls: float32 RoPE in the backbone, or the head's first norm left out, miss the parity rule."""
    _, folder = load_case(f"C_{task}")
    x = load_file(folder / "inputs.safetensors")["x"]
    fp32_rope = load_model(task, folder / "weights.safetensors")
    fp32_rope.backbone.rope_embed.dtype = torch.float32
    no_norm = load_model(task, folder / "weights.safetensors")
    norm_name = next(n for n, m in no_norm.decode_head.named_modules() if isinstance(m, NORMS))
    no_norm.decode_head.set_submodule(norm_name, torch.nn.Identity())
    for bug, model in {"fp32 RoPE": fp32_rope, f"no {norm_name}": no_norm}.items():
        outputs = _case_outputs(task, model, x)
        name = next(iter(outputs))  # the main output (pointmap: the map, not the scale)
        assert misses_parity(f"C_{task}", name, outputs[name]), f"C_{task}: {bug} passed the parity rule"


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
