"""transformers' Sapiens2 folders, both directions, against transformers itself.

(1) A tiny random transformers model of every Sapiens2 class is written with ``save_pretrained`` (its default
official key names, and its own module names with ``save_original_format=False``); ``load_backbone``/``load_model``
read the folder and must give transformers' outputs. (2) Our tiny random models written with ``save_transformers``
must load into transformers' classes, every tensor used, and give our outputs. (3) ours -> folder -> ours is
bit-identical. transformers computes RoPE in float32, so ours runs with ``rope_dtype="fp32"`` when outputs are
compared; the folder carries no RoPE periods, and the default load computes the official bfloat16 ones.

The arch has 18 blocks, so blocks 8-9 use GQA as in the released models (full attention in the first and last 8),
at width 96 (head_dim 48, whose bf16 and fp32 RoPE periods differ). Heads keep transformers' structural limits:
deconv kernel 4 and 1x1 convs in pose/seg heads, 3x3 pixel-shuffle convs, a scale MLP with two hidden layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_rel_close
from safetensors.torch import load_file, save_file

from sapiens2 import Sapiens2, build_model, get_arch, load_backbone, load_model, save_transformers, transformers_format
from sapiens2.checkpoints import CheckpointMismatchError
from sapiens2.models.heads import infer_head_config
from sapiens2.models.layers.rope import RopePositionEmbedding
from sapiens2.transformers_format import (
    TRANSFORMERS_CLASSES,
    config_from_spec,
    official_keys,
    read_transformers_config,
    spec_from_config,
    transformers_keys,
)

transformers = pytest.importorskip("transformers", minversion="5.23")

ARCH = {"embed_dims": 96, "num_layers": 18, "num_heads": 2, "feedforward_channels": 192, "num_tokenizer_layers": 0}
INPUT = (128, 96)  # an 8x6 token grid
# The pointmap scale branch halves the grid three times and instance-normalises it: 16x12 tokens leave 2x2 cells.
INPUTS = {"pointmap": (256, 192)}
PIXEL_SHUFFLE = {"upsample_channels": (32, 16, 16, 8), "conv_out_channels": (8, 8, 8), "conv_kernel_sizes": (3, 3, 3)}
HEADS = {
    "seg": {"deconv_out_channels": (32, 16, 16, 8), "conv_out_channels": (8, 8), "num_classes": 5},
    "pose": {"deconv_out_channels": (32, 16), "conv_out_channels": (16, 16, 8), "out_channels": 7},
    "normal": PIXEL_SHUFFLE,
    "pointmap": PIXEL_SHUFFLE | {"scale_conv_out_channels": (32, 16, 8), "scale_final_layer": (32, 16, 8, 1)},
    "matting": PIXEL_SHUFFLE,
}
FORMATS = {"official names": {}, "transformers names": {"save_original_format": False}}
TASKS = ["pretrain", *HEADS]


# ----------------------------------------------------------------------------------------------------------- helpers


def size(task: str) -> tuple[int, int]:
    return INPUTS.get(task, INPUT)


def images(task: str) -> torch.Tensor:
    return torch.randn(2, 3, *size(task), generator=torch.Generator().manual_seed(123))


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> None:
    """Move every 1-D tensor away from its init (norms 1, LayerScale, biases 0) so a mis-wired one cannot hide."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith(("gamma.weight", "lambda1")):
            param.copy_(torch.rand(param.shape, generator=generator) * 0.9 + 0.1)
        elif (param.ndim == 1 and "norm" in name) or name.endswith(("ln1.weight", "ln2.weight")):
            param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
        elif name.endswith("bias"):
            param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
        elif param.ndim == 2 and ("scale_final_layer" in name or "scale_head" in name):
            param.copy_(torch.randn(param.shape, generator=generator) / param.shape[1] ** 0.5)
        else:
            param.copy_(torch.randn(param.shape, generator=generator) * 0.05)


def _head(task: str) -> dict:
    """Our head kwargs of the tiny ``task`` model, as read off its tensors."""
    model = build_model(task, ARCH, input_size=size(task), device="meta", **HEADS[task])
    state = {k.removeprefix("decode_head."): v for k, v in model.state_dict().items() if k.startswith("decode_head.")}
    return infer_head_config(task, state)


def transformers_model(task: str, seed: int):
    """A random transformers model of the class for ``task``, built from a hand-made ``Sapiens2Config``."""
    width, layers, heads = ARCH["embed_dims"], ARCH["num_layers"], ARCH["num_heads"]
    kwargs = {
        "hidden_size": width,
        "intermediate_size": ARCH["feedforward_channels"],
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_attention_heads": heads // 2,
        "image_size": list(size(task)),
        "patch_size": 16,
    }
    head = HEADS.get(task, {})
    if task in ("seg", "pose"):
        kwargs["num_labels"] = head.get("num_classes", head.get("out_channels"))
        kwargs["head_config"] = {
            "upsample_out_channels": list(head["deconv_out_channels"]),
            "conv_out_channels": list(head["conv_out_channels"]),
        }
    elif task != "pretrain":
        kwargs["num_labels"] = 4 if task == "matting" else 3
        kwargs["head_config"] = {
            "use_pixel_shuffle": True,
            "upsample_out_channels": list(head["upsample_channels"]),
            "upsample_kernel_sizes": [3] * len(head["upsample_channels"]),
            "conv_out_channels": list(head["conv_out_channels"]),
            "conv_kernel_sizes": list(head["conv_kernel_sizes"]),
        }
        if task == "pointmap":
            kwargs["head_config"] |= {
                "scale_conv_out_channels": list(head["scale_conv_out_channels"]),
                "scale_final_hidden_sizes": list(head["scale_final_layer"][1:3]),
            }
    model = getattr(transformers, TRANSFORMERS_CLASSES[task])(transformers.Sapiens2Config(**kwargs))
    randomize(model, seed)
    return model.eval()


def our_model(task: str, seed: int, rope_dtype: str = "fp32"):
    if task == "pretrain":
        model = Sapiens2(ARCH, img_size=size(task), rope_dtype=rope_dtype)
    else:
        model = build_model(task, ARCH, input_size=size(task), rope_dtype=rope_dtype, **HEADS[task])
    randomize(model, seed)
    return model.eval()


def load_ours(task: str, folder: Path, **kwargs):
    if task == "pretrain":
        return load_backbone(folder, **kwargs)
    return load_model(task, folder, **kwargs)


def run_theirs(task: str, model, x: torch.Tensor):
    """transformers' raw outputs in our layout (pointmap: a (points, scale) pair)."""
    output = model(pixel_values=x)
    if task == "pretrain":
        return output.last_hidden_state
    if task == "matting":  # both apply the sigmoid to the 4 channels; transformers splits RGB from alpha
        return torch.cat([output.foregrounds, output.alphas], dim=1)
    if task == "pointmap":
        return output.pointmaps, output.scales
    return getattr(output, {"seg": "logits", "pose": "heatmaps", "normal": "normals"}[task])


def run_ours(task: str, model, x: torch.Tensor):
    out = model(x)
    return out[0] if task == "pretrain" else out  # backbone: raw tokens (B, 9 + N, D) as last_hidden_state


def max_rel(got, expected) -> float:
    """Largest relative difference over the outputs (max |diff| / max |expected|, per tensor)."""
    pairs = zip(got, expected, strict=True) if isinstance(got, tuple) else [(got, expected)]
    return max(((g.double() - e.double()).abs().max() / e.double().abs().max()).item() for g, e in pairs)


def assert_same_outputs(task: str, got, expected) -> None:
    pairs = zip(got, expected, strict=True) if isinstance(got, tuple) else [(got, expected)]
    for index, (g, e) in enumerate(pairs):
        assert_rel_close(g, e, max_rel=1e-5, rms_rel=1e-5, name=f"{task}[{index}]")


# ---------------------------------------------------------------------------------------- (1) transformers -> ours


@pytest.mark.parametrize("save_format", list(FORMATS))
@pytest.mark.parametrize("task", TASKS)
def test_transformers_folder_loads_with_equal_outputs(task: str, save_format: str, tmp_path: Path) -> None:
    theirs = transformers_model(task, seed=len(task))
    theirs.save_pretrained(tmp_path, **FORMATS[save_format])
    stored = load_file(tmp_path / "model.safetensors")
    assert not any(k.endswith("rope_embed.periods") for k in stored), "transformers stores no RoPE periods"
    if save_format == "transformers names":
        assert any(".mlp.gate_proj." in k for k in stored), "expected transformers' own module names in the file"
    else:
        assert any(".ffn.w12." in k for k in stored), "expected the official key names in the file"

    ours = load_ours(task, tmp_path, rope_dtype="fp32")
    with torch.inference_mode():
        x = images(task)
        assert_same_outputs(task, run_ours(task, ours, x), run_theirs(task, theirs, x))
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


def test_transformers_backbone_class_loads_as_backbone(tmp_path: Path) -> None:
    """Sapiens2Backbone (same tensors, normalised feature maps) loads with load_backbone too."""
    theirs = transformers_model("pretrain", seed=3)
    backbone = transformers.Sapiens2Backbone(theirs.config)
    backbone.load_state_dict(theirs.state_dict())
    backbone.eval().save_pretrained(tmp_path)
    assert read_transformers_config(tmp_path)["architectures"] == ["Sapiens2Backbone"]
    ours = load_backbone(tmp_path, rope_dtype="fp32", out_type="featmap")
    with torch.inference_mode():
        x = images("pretrain")
        assert_same_outputs("backbone", ours(x)[0], backbone(pixel_values=x).feature_maps[-1])


def test_default_load_computes_the_official_bf16_rope_periods(tmp_path: Path) -> None:
    """The folder has no periods: the default load computes the official bf16 ones (what official files store),
    rope_dtype="fp32" the float32 ones transformers uses; for head_dim 48 they differ."""
    transformers_model("seg", seed=1).save_pretrained(tmp_path)
    bf16, fp32 = (RopePositionEmbedding(48, dtype=dtype) for dtype in ("bf16", "fp32"))
    bf16.reset_parameters()
    fp32.reset_parameters()
    assert not torch.equal(bf16.periods.float(), fp32.periods)
    default = load_model("seg", tmp_path).backbone.rope_embed
    assert default.dtype == torch.bfloat16 and torch.equal(default.periods, bf16.periods)
    assert torch.equal(load_model("seg", tmp_path, rope_dtype="fp32").backbone.rope_embed.periods, fp32.periods)


def test_config_describes_the_loaded_model(tmp_path: Path) -> None:
    for task in HEADS:
        transformers_model(task, seed=0).save_pretrained(tmp_path / task)
        spec = spec_from_config(read_transformers_config(tmp_path / task))
        ours = load_model(task, tmp_path / task)
        head_state = {k.removeprefix("decode_head."): v for k, v in ours.state_dict().items() if "decode_head." in k}
        assert spec.task == task and spec.input_size == size(task)
        assert spec.arch == ARCH
        assert spec.head == infer_head_config(task, head_state)


def test_a_wrong_key_mapping_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative controls: q_norm and k_norm swapped in the name table, or gate and up projections of one block
    swapped in the file, change the outputs beyond the tolerance (so the comparison can fail); a key under a name we
    do not know fails with the loader's one error."""
    theirs = transformers_model("seg", seed=2)
    theirs.save_pretrained(tmp_path, save_original_format=False)
    x = images("seg")
    with torch.inference_mode():
        expected = run_theirs("seg", theirs, x)
        assert max_rel(load_model("seg", tmp_path, rope_dtype="fp32")(x), expected) < 1e-5
    rules = dict(transformers_format._BACKBONE_RULES)
    q_norm, k_norm = "blocks.{n}.attn.q_norm.weight", "blocks.{n}.attn.k_norm.weight"
    rules[q_norm], rules[k_norm] = rules[k_norm], rules[q_norm]
    with monkeypatch.context() as patch, torch.inference_mode():
        patch.setattr(transformers_format, "_BACKBONE_RULES", tuple(rules.items()))
        assert max_rel(load_model("seg", tmp_path, rope_dtype="fp32")(x), expected) > 1e-3

    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    gate, up = "model.model.layer.9.mlp.gate_proj.weight", "model.model.layer.9.mlp.up_proj.weight"
    tensors[gate], tensors[up] = tensors[up], tensors[gate]
    save_file(tensors, str(path), metadata={"format": "pt"})
    with torch.inference_mode():
        assert max_rel(load_model("seg", tmp_path, rope_dtype="fp32")(x), expected) > 1e-3

    tensors[gate], tensors[up] = tensors[up], tensors[gate]
    tensors["model.model.layer.9.attention.query.weight"] = tensors.pop("model.model.layer.9.attention.q_proj.weight")
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckpointMismatchError) as error:
        load_model("seg", tmp_path)
    message = str(error.value)
    assert "1 missing keys: backbone.blocks.9.attn.wq.weight" in message
    assert "1 unexpected keys: model.model.layer.9.attention.query.weight" in message


@pytest.mark.parametrize(
    ("field", "value"),
    [("use_gated_mlp", False), ("num_register_tokens", 4), ("rope_theta", 10000.0), ("hidden_act", "gelu")],
)
def test_unsupported_config_fails_with_the_field_named(field: str, value, tmp_path: Path) -> None:
    transformers_model("pretrain", seed=0).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"config.json: config {field}={value!r} is not supported"):
        load_backbone(tmp_path)


def test_config_class_and_weights_must_agree(tmp_path: Path) -> None:
    transformers_model("normal", seed=0).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["Sapiens2ForImageMatting"]
    config["id2label"] = {str(i): f"LABEL_{i}" for i in range(4)}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="describes a matting model .* holds a normal head"):
        load_model("matting", tmp_path)


def test_trainer_checkpoint_folder_loads(tmp_path: Path) -> None:
    """A Trainer checkpoint folder also holds optimizer, scheduler and training-argument files; the weights are used."""
    transformers_model("pose", seed=5).save_pretrained(tmp_path)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"):
        torch.save({"step": torch.zeros(1)}, tmp_path / name)
    (tmp_path / "trainer_state.json").write_text("{}")
    assert load_model("pose", tmp_path).decode_head.conv_pose.out_channels == 7


def test_config_saved_without_a_model_names_the_task_by_the_weights(tmp_path: Path) -> None:
    """A config written on its own has no architectures: official head names tell the task, transformers' do not."""
    theirs = transformers_model("seg", seed=4)
    for save_format, options in FORMATS.items():
        theirs.save_pretrained(tmp_path / save_format, **options)
        config = json.loads((tmp_path / save_format / "config.json").read_text())
        config["architectures"] = None
        (tmp_path / save_format / "config.json").write_text(json.dumps(config))
    assert load_model("seg", tmp_path / "official names").task == "seg"
    with pytest.raises(ValueError, match="architectures is empty and the head's transformers key names"):
        load_model("seg", tmp_path / "transformers names")


# ---------------------------------------------------------------------------------------- (2) ours -> transformers


@pytest.mark.parametrize("task", TASKS)
def test_saved_folder_loads_into_transformers_with_equal_outputs(task: str, tmp_path: Path) -> None:
    ours = our_model(task, seed=10 + len(task))
    save_transformers(ours, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    theirs, info = getattr(transformers, TRANSFORMERS_CLASSES[task]).from_pretrained(tmp_path, output_loading_info=True)
    theirs.eval()
    assert not any(info.values()), info  # nothing missing, unexpected or mis-shaped: every tensor used as written
    assert set(load_file(tmp_path / "model.safetensors")) == set(theirs.state_dict())
    assert theirs.config.num_key_value_heads_per_layer == [get_arch(ARCH).kv_heads(i) for i in range(18)] != [2] * 18
    assert {p.dtype for p in theirs.parameters()} == {torch.float32}
    with torch.inference_mode():
        x = images(task)
        assert_same_outputs(task, run_theirs(task, theirs, x), run_ours(task, ours, x))


def test_unsupported_models_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no Sapiens2 class for 'albedo'"):
        save_transformers(build_model("albedo", ARCH, **PIXEL_SHUFFLE), tmp_path)
    with pytest.raises(ValueError, match="no 4K windowed tokenizer"):
        save_transformers(Sapiens2(ARCH | {"num_tokenizer_layers": 1}, use_tokenizer=True, device="meta"), tmp_path)
    deconv3 = {"deconv_out_channels": (16,), "deconv_kernel_sizes": (3,), "conv_out_channels": (8,)}
    pose = build_model("pose", ARCH, **deconv3, conv_kernel_sizes=(1,))
    with pytest.raises(ValueError, match=r"deconv kernels 4 and conv kernels 1 only; .*deconv_kernel_sizes=\[3\]"):
        save_transformers(pose, tmp_path)
    scale = {"scale_conv_out_channels": (8,), "scale_conv_kernel_sizes": (1,), "scale_final_layer": (384, 1)}
    pointmap = build_model("pointmap", ARCH, **PIXEL_SHUFFLE, **scale)
    with pytest.raises(ValueError, match=r"two hidden layers .* this head has \(384, 1\)"):
        save_transformers(pointmap, tmp_path)
    assert not tmp_path.joinpath("model.safetensors").exists()


# ----------------------------------------------------------------------------------------- (3) ours -> ours, exact


@pytest.mark.parametrize("rope_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("task", TASKS)
def test_round_trip_is_bit_identical(task: str, rope_dtype: str, tmp_path: Path) -> None:
    ours = our_model(task, seed=20 + len(task), rope_dtype=rope_dtype)
    save_transformers(ours, tmp_path)
    back = load_ours(task, tmp_path, rope_dtype=rope_dtype)
    expected, got = ours.state_dict(), back.state_dict()
    assert list(got) == list(expected)
    for key, tensor in expected.items():
        assert got[key].dtype == tensor.dtype and torch.equal(got[key], tensor), key


@pytest.mark.parametrize("task", TASKS)
def test_key_conversion_is_a_bijection(task: str) -> None:
    state = our_model(task, seed=0).state_dict()
    converted = transformers_keys(state, task)
    assert not set(converted) & set(state), "every key is renamed"
    back = official_keys(converted, task)
    assert set(back) == set(state) - {k for k in state if k.endswith("rope_embed.periods")}
    assert all(torch.equal(back[k], state[k]) for k in back)
    # The official names pass through unchanged (what transformers' save_pretrained writes by default).
    assert official_keys(back, task).keys() == back.keys()


@pytest.mark.parametrize("task", TASKS)
def test_config_round_trip(task: str) -> None:
    head = _head(task) if task != "pretrain" else {}
    spec = spec_from_config(config_from_spec(task, ARCH, head, size(task)))
    assert (spec.task, spec.arch, spec.head, spec.input_size) == (task, ARCH, head, size(task))
    zoo = spec_from_config(config_from_spec("pretrain", "sapiens2_0.4b"))
    assert zoo.arch == "sapiens2_0.4b" and zoo.input_size == (1024, 768)
