"""Decode heads: parity with the official heads (C cases), released key layouts on meta, config inference."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import KEYS, load_case, require
from parity import assert_parity, platform_outputs
from safetensors.torch import load_file

from sapiens2.models.heads import HEAD_CONFIGS, HEADS, RMSNorm2d, infer_head_config

RELEASED_ARCHS = ("sapiens2_0.4b", "sapiens2_0.8b", "sapiens2_1b", "sapiens2_5b")
RELEASED_TASKS = ("pose", "seg", "normal", "pointmap", "albedo")
# Output tensor names of each C case, in the order the head returns them.
CASE_OUTPUTS = {
    "pose": ("heatmaps",),
    "seg": ("logits",),
    "normal": ("normal",),
    "pointmap": ("pointmap", "scale"),
    "albedo": ("albedo",),
}
PREFIX = "decode_head."


def _as_kwargs(config: dict) -> dict:
    """An official decode_head config as head kwargs: no 'type', width lists as tuples (what infer returns)."""
    return {key: tuple(value) if isinstance(value, list) else value for key, value in config.items() if key != "type"}


def _head_state(state: dict) -> dict:
    return {key[len(PREFIX) :]: value for key, value in state.items() if key.startswith(PREFIX)}


def _channels_last_view(featmap: torch.Tensor) -> torch.Tensor:
    """(B, D, Hp, Wp) as the official head receives it: a permuted view of a contiguous (B, Hp, Wp, D) tensor."""
    return featmap.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


def _released_fixture(task: str, arch: str) -> dict:
    return json.loads(require(KEYS / f"{arch}_{task}.json").read_text())


@pytest.mark.parametrize("task", RELEASED_TASKS)
def test_head_matches_official_outputs_on_channels_last_featmap(task):
    # Same ops in the same order on one CPU thread reproduce the reference bit for bit (parity README); at these tiny
    # widths only bit-exactness sees the layout traps (a contiguous featmap or RMSNorm2d without its copies moves
    # outputs by ~1e-5, MODEL.md §5 item 4). Each stored platform's featmap goes in; on a CPU of another kind the
    # result must stay within the widened loose tier (tests/parity.py).
    case, folder = load_case(f"C_{task}")
    head = HEADS[task](**_as_kwargs(case["model"]["config"]["decode_head"])).eval()
    head.load_state_dict(_head_state(load_file(folder / "weights.safetensors")), strict=True)
    for outputs in platform_outputs(f"C_{task}").values():
        with torch.inference_mode():
            got = head(_channels_last_view(outputs["debug__backbone_featmap"]))
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(CASE_OUTPUTS[task])
        for name, tensor in zip(CASE_OUTPUTS[task], got, strict=True):
            assert_parity(f"C_{task}", name, tensor)


@pytest.mark.parametrize("task", RELEASED_TASKS)
def test_infer_head_config_recovers_parity_case_config(task):
    case, folder = load_case(f"C_{task}")
    state = _head_state(load_file(folder / "weights.safetensors"))
    assert infer_head_config(task, state) == _as_kwargs(case["model"]["config"]["decode_head"])


@pytest.mark.parametrize("arch", RELEASED_ARCHS)
@pytest.mark.parametrize("task", RELEASED_TASKS)
def test_released_head_on_meta_has_official_keys_shapes_order_and_count(task, arch):
    fixture = _released_fixture(task, arch)
    assert HEAD_CONFIGS[task][arch] == _as_kwargs(fixture["decode_head_cfg"])

    head = HEADS[task](**HEAD_CONFIGS[task][arch], device="meta")
    state = head.state_dict()
    got = [(key, list(value.shape), str(value.dtype).removeprefix("torch.")) for key, value in state.items()]
    expected = [(key[len(PREFIX) :], shape, dtype) for key, shape, dtype in fixture["keys"] if key.startswith(PREFIX)]
    assert got == expected
    assert sum(p.numel() for p in head.parameters()) == fixture["head_parameters"]
    assert all(p.is_meta for p in head.parameters())


@pytest.mark.parametrize("arch", RELEASED_ARCHS)
@pytest.mark.parametrize("task", RELEASED_TASKS)
def test_infer_head_config_recovers_released_config_from_shapes(task, arch):
    fixture = _released_fixture(task, arch)
    shapes = {
        key[len(PREFIX) :]: torch.empty(shape, device="meta")
        for key, shape, _ in fixture["keys"]
        if key.startswith(PREFIX)
    }
    assert infer_head_config(task, shapes) == _as_kwargs(fixture["decode_head_cfg"])


def test_matting_configs_are_not_invented():
    # MATTING.md: the released 1b matting widths are unknown, so they must come from the checkpoint.
    assert HEAD_CONFIGS["matting"] == {}
    assert set(HEADS) == {"pose", "seg", "normal", "pointmap", "albedo", "matting"}


# Custom widths per task, on a 3x2 token grid (pointmap: 12x10, which three stride-2 units take to 2x2; InstanceNorm
# refuses a 1x1 map).
CUSTOM = {
    "pose": {
        "in_channels": 12,
        "out_channels": 5,
        "deconv_out_channels": (10, 8, 6),
        "deconv_kernel_sizes": (4, 3, 2),
        "conv_out_channels": (7, 5),
        "conv_kernel_sizes": (1, 3),
    },
    "seg": {
        "in_channels": 12,
        "deconv_out_channels": (8,),
        "deconv_kernel_sizes": (4,),
        "conv_out_channels": (6,),
        "conv_kernel_sizes": (5,),
        "num_classes": 3,
    },
    "normal": {
        "in_channels": 12,
        "upsample_channels": (8, 6),
        "conv_out_channels": (5, 4),
        "conv_kernel_sizes": (3, 1),
    },
    "albedo": {
        "in_channels": 12,
        "upsample_channels": (8, 6, 4),
        "conv_out_channels": (4,),
        "conv_kernel_sizes": (3,),
    },
    "matting": {
        "in_channels": 20,
        "upsample_channels": (14, 10, 8, 6),
        "conv_out_channels": (6, 5, 3),
        "conv_kernel_sizes": (3, 5, 1),
    },
    "pointmap": {
        "in_channels": 12,
        "upsample_channels": (8, 6),
        "conv_out_channels": (5,),
        "conv_kernel_sizes": (3,),
        "scale_conv_out_channels": (10, 6, 3),
        "scale_conv_kernel_sizes": (1, 1, 1),
        "scale_final_layer": (12, 7, 1),
    },
}
UPSAMPLING = {"pose": 8, "seg": 2, "normal": 4, "albedo": 8, "matting": 16, "pointmap": 4}
OUT_CHANNELS = {"pose": 5, "seg": 3, "normal": 3, "albedo": 3, "matting": 4, "pointmap": 3}


@pytest.mark.parametrize("task", sorted(CUSTOM))
def test_custom_width_head_round_trips_through_infer_head_config(task):
    torch.manual_seed(0)
    config = CUSTOM[task]
    head = HEADS[task](**config)
    head.init_weights()
    head.eval()
    state = head.state_dict()
    inferred = infer_head_config(task, state)
    assert inferred == config

    rebuilt = HEADS[task](**inferred, device="meta")
    rebuilt.load_state_dict(state, strict=True, assign=True)
    grid = (12, 10) if task == "pointmap" else (3, 2)
    featmap = torch.randn(2, config["in_channels"], *grid)
    with torch.inference_mode():
        first, second = head(featmap), rebuilt.eval()(featmap)
    first = first if isinstance(first, tuple) else (first,)
    second = second if isinstance(second, tuple) else (second,)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    dense = first[0]
    assert dense.shape == (2, OUT_CHANNELS[task], grid[0] * UPSAMPLING[task], grid[1] * UPSAMPLING[task])
    assert torch.isfinite(dense).all()
    if task == "pointmap":
        assert first[1].shape == (2, 1)


def test_matting_head_outputs_sigmoid_probabilities():
    torch.manual_seed(1)
    head = HEADS["matting"](**CUSTOM["matting"])
    head.init_weights()
    with torch.inference_mode():
        out = head.eval()(torch.randn(1, 20, 2, 3) * 50)
        logits = head.conv_matting(head.trunk(torch.zeros(1, 20, 2, 3)))
        zero_input_out = head(torch.zeros(1, 20, 2, 3))
    assert out.shape == (1, 4, 32, 48)
    assert out.min() >= 0 and out.max() <= 1
    assert torch.equal(zero_input_out, torch.sigmoid(logits))


def test_init_weights_fills_random_finite_parameters_and_zero_biases():
    torch.manual_seed(2)
    head = HEADS["pointmap"](**CUSTOM["pointmap"])
    head.init_weights()
    for name, param in head.named_parameters():
        assert torch.isfinite(param).all(), name
        if name.endswith("bias"):
            assert torch.count_nonzero(param) == 0, name
        else:
            assert param.std() > 0, name


def test_rmsnorm2d_normalises_channels_per_pixel_and_returns_nchw_contiguous():
    torch.manual_seed(3)
    norm = RMSNorm2d(5)
    with torch.no_grad():
        norm.norm.weight.copy_(torch.rand(5) + 0.5)
    x = _channels_last_view(torch.randn(2, 5, 3, 4))
    y = norm(x)
    expected = x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + 1e-6) * norm.norm.weight.view(1, 5, 1, 1)
    assert y.is_contiguous()
    torch.testing.assert_close(y, expected, rtol=1e-6, atol=1e-6)


def test_pointmap_head_rejects_a_token_grid_it_was_not_built_for():
    head = HEADS["pointmap"](**CUSTOM["pointmap"]).eval()
    head.init_weights()
    with pytest.raises(ValueError, match="scale MLP"):
        head(torch.randn(1, 12, 12, 8))


@pytest.mark.parametrize(
    ("task", "change", "message"),
    [
        ("pose", {"deconv_kernel_sizes": (4, 4)}, "deconv_kernel_sizes has 2 entries"),
        ("pose", {"deconv_kernel_sizes": (4, 5, 4)}, "deconv kernel size 5"),
        ("seg", {"conv_kernel_sizes": (2,)}, "odd positive kernel"),
        ("normal", {"upsample_channels": (8, 0)}, "positive channel counts"),
        ("pointmap", {"scale_final_layer": (3,)}, "input and output widths"),
    ],
)
def test_head_constructors_reject_bad_widths_with_a_clear_message(task, change, message):
    with pytest.raises(ValueError, match=message):
        HEADS[task](**(CUSTOM[task] | change), device="meta")


def test_infer_head_config_explains_prefixed_keys_wrong_task_and_gaps():
    state = HEADS["normal"](**CUSTOM["normal"], device="meta").state_dict()
    with pytest.raises(ValueError, match="stripped"):
        infer_head_config("normal", {PREFIX + key: value for key, value in state.items()})
    with pytest.raises(ValueError, match="conv_albedo.weight"):
        infer_head_config("albedo", state)
    with pytest.raises(ValueError, match="unknown task"):
        infer_head_config("depth", state)
    gapped = {key.replace("conv_layers.3.", "conv_layers.4."): value for key, value in state.items()}
    with pytest.raises(ValueError, match="official head layout"):
        infer_head_config("normal", gapped)
