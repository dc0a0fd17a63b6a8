"""Hugging Face ``transformers`` Sapiens2 folders: read them into the official layout, write ours as one.

A ``save_pretrained`` folder holds ``config.json`` (``model_type: "sapiens2"``, the class in ``architectures``, the
backbone numbers and a ``head_config``) and ``model.safetensors``. transformers 5.23 writes the tensors under the
official key names by default and under its own module names with ``save_original_format=False``; both are read
here. Its RoPE is recomputed from the config, so the folder carries no
``rope_embed.periods``: on reading they are computed as a freshly built model of that RoPE dtype does (the official
bfloat16 recipe by default, bit-identical to the periods stored in the official files; ``"fp32"`` gives the float32
periods transformers itself uses). The RoPE dtype is a forward-pass choice, not a weight.

``save_transformers`` writes transformers' own key names, which its ``Sapiens2*`` classes load without any key
conversion. Pure functions, no transformers import: the key names and config fields are those transformers 5.23
reads and writes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .models.heads import OUTPUT_LAYERS, infer_head_config
from .models.zoo import ARCH_FIELDS, ARCHS, Arch, get_arch
from .tasks import PRETRAIN

__all__ = [
    "MODEL_TYPE",
    "TRANSFORMERS_CLASSES",
    "TransformersSpec",
    "config_from_spec",
    "convert_if_transformers",
    "official_keys",
    "read_transformers_config",
    "save_transformers",
    "spec_from_config",
    "transformers_keys",
]

MODEL_TYPE = "sapiens2"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

# transformers class (config "architectures") per task; "pretrain" is the bare backbone.
TRANSFORMERS_CLASSES = {
    PRETRAIN: "Sapiens2Model",
    "seg": "Sapiens2ForSemanticSegmentation",
    "pose": "Sapiens2ForPoseEstimation",
    "normal": "Sapiens2ForNormalEstimation",
    "pointmap": "Sapiens2ForPointmapEstimation",
    "matting": "Sapiens2ForImageMatting",
}
_TASK_OF_CLASS = {name: task for task, name in TRANSFORMERS_CLASSES.items()} | {"Sapiens2Backbone": PRETRAIN}
_DECONV_TASKS = ("pose", "seg")  # transposed-conv heads; the others are pixel-shuffle heads
_FIXED_OUTPUTS = {"normal": 3, "pointmap": 3, "matting": 4}

# Config fields whose value is fixed in every Sapiens2 model (absent fields take transformers' defaults, which are
# these same values). A config with another value describes a network this package does not build.
_FIXED_FIELDS: dict[str, Any] = {
    "patch_size": 16,
    "num_channels": 3,
    "hidden_act": "silu",
    "rope_theta": 100.0,
    "rms_norm_eps": 1e-6,
    "query_bias": True,
    "key_bias": True,
    "value_bias": True,
    "proj_bias": True,
    "mlp_bias": True,
    "use_gated_mlp": True,
    "num_register_tokens": 8,
    "use_qk_norm": True,
    "use_mask_token": False,
}
# transformers' defaults for the numbers that shape the backbone, used when a field is absent.
_DEFAULTS = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_attention_heads": 8,
    "num_first_full_attention_layers": 8,
    "num_last_full_attention_layers": 8,
    "image_size": 224,
}


# ------------------------------------------------------------------------------------------------------ key names
#
# Each rule pairs an official key template with a transformers one. Placeholders: {n} an index equal on both sides,
# {i} the transformers unit index whose official Sequential index is {3i} (a unit is conv, norm, SiLU), {p} "weight"
# or "bias". Backbone rules are relative to the backbone; head rules to the task model.

_BACKBONE_RULES = (
    ("cls_token", "embeddings.cls_token"),
    ("storage_tokens", "embeddings.register_tokens"),
    ("patch_embed.projection.{p}", "embeddings.patch_embeddings.{p}"),
    ("blocks.{n}.ln1.weight", "model.layer.{n}.norm1.weight"),
    ("blocks.{n}.attn.wq.{p}", "model.layer.{n}.attention.q_proj.{p}"),
    ("blocks.{n}.attn.wk.{p}", "model.layer.{n}.attention.k_proj.{p}"),
    ("blocks.{n}.attn.wv.{p}", "model.layer.{n}.attention.v_proj.{p}"),
    ("blocks.{n}.attn.q_norm.weight", "model.layer.{n}.attention.q_norm.weight"),
    ("blocks.{n}.attn.k_norm.weight", "model.layer.{n}.attention.k_norm.weight"),
    ("blocks.{n}.attn.proj.{p}", "model.layer.{n}.attention.o_proj.{p}"),
    ("blocks.{n}.attn.gamma.weight", "model.layer.{n}.layer_scale1.lambda1"),
    ("blocks.{n}.ln2.weight", "model.layer.{n}.norm2.weight"),
    ("blocks.{n}.ffn.w3.{p}", "model.layer.{n}.mlp.down_proj.{p}"),
    ("ln1.weight", "norm.weight"),
)
# The fused SwiGLU input projection: official w12 = [gate; up] along the output axis, transformers keeps two Linears.
_SPLIT_RULE = ("blocks.{n}.ffn.w12.{p}", ("model.layer.{n}.mlp.gate_proj.{p}", "model.layer.{n}.mlp.up_proj.{p}"))
_ROPE_KEY = "rope_embed.periods"  # official only: transformers recomputes its RoPE frequencies from the config

_CONV_RULE = ("decode_head.conv_layers.{3i}.{p}", "decode_head.conv_layers.{i}.convolution.{p}")
_DECONV_HEAD_RULES = (("decode_head.deconv_layers.{3i}.weight", "decode_head.upsample_layers.{i}.convolution.weight"),)
_UPSAMPLE_HEAD_RULES = (
    ("decode_head.input_conv.0.{p}", "decode_head.input_conv.convolution.{p}"),
    ("decode_head.upsample_blocks.{n}.0.{p}", "decode_head.upsample_layers.{n}.convolution.{p}"),
)
_SCALE_HEAD_RULES = (
    ("decode_head.scale_conv_layers.{3i}.{p}", "scale_head.conv_layers.{i}.convolution.{p}"),
    # scale_final_layer = [Flatten, Linear, SiLU, Linear, SiLU, Linear]: transformers' block1, block2, proj.
    ("decode_head.scale_final_layer.1.{p}", "scale_head.predictor.block1.layers.0.{p}"),
    ("decode_head.scale_final_layer.3.{p}", "scale_head.predictor.block2.layers.0.{p}"),
    ("decode_head.scale_final_layer.5.{p}", "scale_head.predictor.proj.{p}"),
)

_PLACEHOLDER = re.compile(r"\{(n|i|3i|p)\}")
_GROUP = {"n": r"(?P<n>\d+)", "i": r"(?P<i>\d+)", "3i": r"(?P<i3>\d+)", "p": r"(?P<p>weight|bias)"}


@cache
def _pattern(template: str) -> re.Pattern[str]:
    pieces, end = [], 0
    for match in _PLACEHOLDER.finditer(template):
        pieces += [re.escape(template[end : match.start()]), _GROUP[match.group(1)]]
        end = match.end()
    return re.compile("".join([*pieces, re.escape(template[end:])]))


def _fill(template: str, values: Mapping[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def _match(template: str, key: str) -> dict[str, str] | None:
    """The placeholder values that make ``template`` spell ``key`` (None if it does not)."""
    found = _pattern(template).fullmatch(key)
    if found is None:
        return None
    values = found.groupdict()
    if "i3" in values:  # an official Sequential index: unit i sits at 3·i
        if int(values["i3"]) % 3:
            return None
        values["i"] = str(int(values.pop("i3")) // 3)
    elif "i" in values:
        values["3i"] = str(3 * int(values["i"]))
    return values


def _rules(task: str) -> list[tuple[str, str]]:
    """(official, transformers) template pairs of every one-to-one tensor of a ``task`` (or pretrain) model."""
    if task == PRETRAIN:
        return list(_BACKBONE_RULES)
    rules = [(f"backbone.{official}", f"model.{theirs}") for official, theirs in _BACKBONE_RULES]
    rules += _DECONV_HEAD_RULES if task in _DECONV_TASKS else _UPSAMPLE_HEAD_RULES
    rules += [_CONV_RULE, (f"decode_head.{OUTPUT_LAYERS[task]}.{{p}}", "decode_head.predictor.{p}")]
    if task == "pointmap":
        rules += _SCALE_HEAD_RULES
    return rules


def _split_rule(task: str) -> tuple[str, tuple[str, str]]:
    official, (gate, up) = _SPLIT_RULE
    if task == PRETRAIN:
        return official, (gate, up)
    return f"backbone.{official}", (f"model.{gate}", f"model.{up}")


def _check_task(task: str) -> None:
    if task not in TRANSFORMERS_CLASSES:
        raise ValueError(
            f"transformers has no Sapiens2 class for {task!r}; it has {', '.join(TRANSFORMERS_CLASSES)}"
            + (" (albedo heads use RMSNorm, which transformers' heads lack)" if task == "albedo" else "")
        )


def transformers_keys(state_dict: Mapping[str, torch.Tensor], task: str = PRETRAIN) -> dict[str, torch.Tensor]:
    """Official key layout -> transformers' module names (w12 split into gate/up, the RoPE periods dropped).

    Args:
        state_dict: a backbone (``task="pretrain"``) or task model (``backbone.*``, ``decode_head.*``) state dict.
        task: ``"pretrain"`` or a task transformers has a class for.

    Raises:
        ValueError: a key with no transformers counterpart (named in the message), or a task transformers lacks.
    """
    _check_task(task)
    rules, (split, halves) = _rules(task), _split_rule(task)
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for key, tensor in state_dict.items():
        if key.endswith(_ROPE_KEY):
            continue
        if (values := _match(split, key)) is not None:
            for half, part in zip(halves, tensor.chunk(2, dim=0), strict=True):
                out[_fill(half, values)] = part.clone()  # own storage: safetensors refuses shared tensors
            continue
        for official, theirs in rules:
            if (values := _match(official, key)) is not None:
                out[_fill(theirs, values)] = tensor
                break
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"no transformers name for {len(unknown)} key(s) of a {task} model: {', '.join(unknown[:8])}")
    return out


def official_keys(state_dict: Mapping[str, torch.Tensor], task: str = PRETRAIN) -> dict[str, torch.Tensor]:
    """transformers' module names -> the official key layout (gate/up fused into w12).

    Keys that are already official, or unknown, pass through unchanged, so a mismatch surfaces in the loader's one
    strict error under the file's own names. The RoPE periods are not added here (see ``convert_if_transformers``).

    Raises:
        ValueError: two keys that end up with one name, or a task transformers lacks.
    """
    _check_task(task)
    rules, (split, (gate, up)) = _rules(task), _split_rule(task)
    out: dict[str, torch.Tensor] = {}

    def put(key: str, tensor: torch.Tensor, source: str) -> None:
        if key in out:
            raise ValueError(f"checkpoint holds '{key}' twice (as '{source}' and under another name)")
        out[key] = tensor

    for key, tensor in state_dict.items():
        if (values := _match(gate, key)) is not None and _fill(up, values) in state_dict:
            put(_fill(split, values), torch.cat((tensor, state_dict[_fill(up, values)]), dim=0), key)
            continue
        if (values := _match(up, key)) is not None and _fill(gate, values) in state_dict:
            continue  # fused with its gate half above
        for official, theirs in rules:
            if (values := _match(theirs, key)) is not None:
                put(_fill(official, values), tensor, key)
                break
        else:
            put(key, tensor, key)
    return out


# ---------------------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class TransformersSpec:
    """What a transformers ``config.json`` describes, in this package's terms.

    Attributes:
        task: ``"pretrain"`` (Sapiens2Model / Sapiens2Backbone) or a task name.
        arch: a zoo name (``"sapiens2_1b"``) when the numbers are a released arch's, else a custom arch dict.
        head: the head kwargs with the official names (``HEADS[task](**head)``); empty for ``"pretrain"``.
        input_size: the config's ``image_size`` as (H, W).
    """

    task: str
    arch: str | dict[str, int]
    head: dict[str, Any]
    input_size: tuple[int, int]


def read_transformers_config(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The ``config.json`` of a transformers Sapiens2 folder, or None when ``folder`` is not one.

    Raises:
        ValueError: a ``config.json`` that is not valid JSON.
    """
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"Cannot read {path}: {type(error).__name__}: {error}") from error
    if not isinstance(config, dict) or config.get("model_type") != MODEL_TYPE:
        return None
    return config


def _pair(value: Any, name: str) -> tuple[int, int]:
    values = value if isinstance(value, (list, tuple)) else (value, value)
    if len(values) != 2:
        raise ValueError(f"config {name} must be an int or [height, width], got {value!r}")
    return int(values[0]), int(values[1])


def _kv_heads(config: Mapping[str, Any], layers: int, heads: int) -> list[int]:
    """Per-layer key/value heads as transformers reads them from the config."""
    if config.get("num_key_value_heads_per_layer") is not None:
        return [int(h) for h in config["num_key_value_heads_per_layer"]]
    first = config.get("num_first_full_attention_layers", _DEFAULTS["num_first_full_attention_layers"])
    last = config.get("num_last_full_attention_layers", _DEFAULTS["num_last_full_attention_layers"])
    gqa = config.get("num_key_value_attention_heads", _DEFAULTS["num_key_value_attention_heads"])
    return [heads if i < first or i >= layers - last else int(gqa) for i in range(layers)]


def _task_of(config: Mapping[str, Any], task: str | None) -> str:
    classes = config.get("architectures") or []
    if not classes and task is not None:
        return task
    known = [_TASK_OF_CLASS[name] for name in classes if name in _TASK_OF_CLASS]
    if len(known) != 1:
        raise ValueError(
            f"config architectures {classes} names no single Sapiens2 class this package loads "
            f"(known: {', '.join(_TASK_OF_CLASS)})"
        )
    return known[0]


def _unsupported(field: str, value: Any, expected: Any) -> ValueError:
    return ValueError(f"config {field}={value!r} is not supported: Sapiens2 models here have {field}={expected!r}")


def _layer_list(head: Mapping[str, Any], name: str, default_kernel: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(widths, kernels) of ``head_config.<name>_out_channels``; kernels as transformers fills them when absent."""
    widths = tuple(int(c) for c in head.get(f"{name}_out_channels") or ())
    kernels = head.get(f"{name}_kernel_sizes") or [head.get(f"{name}_kernel_size", default_kernel)] * len(widths)
    return widths, tuple(int(k) for k in kernels)


def _head_from_config(task: str, config: Mapping[str, Any], width: int, input_size: tuple[int, int]) -> dict:
    head = config.get("head_config") or {}
    upsample, upsample_kernels = _layer_list(head, "upsample", 4)
    convs, conv_kernels = _layer_list(head, "conv", 1)
    if not upsample:
        raise ValueError(f"config head_config.upsample_out_channels is empty; a {task} head needs at least one")
    pixel_shuffle = bool(head.get("use_pixel_shuffle"))
    if pixel_shuffle == (task in _DECONV_TASKS):
        raise _unsupported("head_config.use_pixel_shuffle", head.get("use_pixel_shuffle"), not pixel_shuffle)
    # transformers' transposed convs (stride 2, padding 1) and its 0-padded 1x1 convs of pose/seg heads match ours
    # only with these kernels; our pixel-shuffle unit's conv is always 3x3.
    expected_upsample, expected_conv = (4, 1) if task in _DECONV_TASKS else (3, None)
    if any(k != expected_upsample for k in upsample_kernels):
        expected = [expected_upsample] * len(upsample)
        raise _unsupported("head_config.upsample_kernel_sizes", list(upsample_kernels), expected)
    if expected_conv is not None and any(k != expected_conv for k in conv_kernels):
        raise _unsupported("head_config.conv_kernel_sizes", list(conv_kernels), [expected_conv] * len(convs))
    labels = int(config["num_labels"]) if "num_labels" in config else len(config.get("id2label") or {}) or 2
    if task in _FIXED_OUTPUTS and labels != _FIXED_OUTPUTS[task]:
        raise _unsupported("num_labels", labels, _FIXED_OUTPUTS[task])
    spec: dict[str, Any] = {"in_channels": width}
    if task in _DECONV_TASKS:
        spec["out_channels" if task == "pose" else "num_classes"] = labels
        spec |= {"deconv_out_channels": upsample, "deconv_kernel_sizes": upsample_kernels}
    else:
        spec["upsample_channels"] = upsample
    spec |= {"conv_out_channels": convs, "conv_kernel_sizes": conv_kernels}
    if task == "pointmap":
        scale, scale_kernels = _layer_list(head, "scale_conv", 1)
        hidden = tuple(int(c) for c in head.get("scale_final_hidden_sizes") or ())
        if not scale or len(hidden) != 2:
            raise ValueError(
                "config head_config of a pointmap model needs scale_conv_out_channels and two "
                f"scale_final_hidden_sizes, got {list(scale)} and {list(hidden)}"
            )
        flat = head.get("scale_final_input_size")
        if flat is None:  # transformers derives it from image_size: stride-2 convs with same padding
            grid_h, grid_w = input_size[0] // 16, input_size[1] // 16
            for kernel in scale_kernels:
                pad = (kernel - 1) // 2
                grid_h, grid_w = (grid_h + 2 * pad - kernel) // 2 + 1, (grid_w + 2 * pad - kernel) // 2 + 1
            flat = grid_h * grid_w * scale[-1]
        spec |= {"scale_conv_out_channels": scale, "scale_conv_kernel_sizes": scale_kernels}
        spec["scale_final_layer"] = (int(flat), *hidden, 1)
    return spec


def spec_from_config(config: Mapping[str, Any], task: str | None = None) -> TransformersSpec:
    """Read a transformers Sapiens2 ``config.json`` (as a dict) into task, arch, head kwargs and input size.

    The task comes from the class in ``architectures``, or ``task`` when the config names none (a config saved on its
    own, without a model). Absent fields take transformers' defaults.

    Raises:
        ValueError: naming the field, for anything this package does not build: another model type or class, a
            fixed field with another value (e.g. ``use_gated_mlp: false``), a key/value-head layout other than
            Sapiens2's (full attention in the first and last 8 layers, h/2 heads between), or a head transformers
            builds differently from ours.
    """
    if config.get("model_type") != MODEL_TYPE:
        raise ValueError(f"config model_type is {config.get('model_type')!r}, not {MODEL_TYPE!r}")
    task = _task_of(config, task)
    for field, expected in _FIXED_FIELDS.items():
        value = config.get(field, expected)
        same = _pair(value, field) == (16, 16) if field == "patch_size" else value == expected
        if not same:
            raise _unsupported(field, value, expected)
    numbers = {field: int(config.get(field, _DEFAULTS[field])) for field in _DEFAULTS if field != "image_size"}
    width, layers, heads = numbers["hidden_size"], numbers["num_hidden_layers"], numbers["num_attention_heads"]
    arch = get_arch(
        {
            "embed_dims": width,
            "num_layers": layers,
            "num_heads": heads,
            "feedforward_channels": numbers["intermediate_size"],
            "num_tokenizer_layers": 0,
        }
    )
    kv_heads = _kv_heads(config, layers, heads)
    expected_kv = [arch.kv_heads(i) for i in range(layers)]
    if kv_heads != expected_kv:
        raise _unsupported("num_key_value_heads_per_layer", kv_heads, expected_kv)
    input_size = _pair(config.get("image_size", _DEFAULTS["image_size"]), "image_size")
    head = {} if task == PRETRAIN else _head_from_config(task, config, width, input_size)
    return TransformersSpec(task, _arch_name_or_dict(arch), head, input_size)


def _arch_name_or_dict(arch: Arch) -> str | dict[str, int]:
    for known in ARCHS.values():
        if not known.use_tokenizer and all(
            getattr(known, f) == getattr(arch, f) for f in ARCH_FIELDS if f != "num_tokenizer_layers"
        ):
            return known.name
    return {field: getattr(arch, field) for field in ARCH_FIELDS}


def config_from_spec(
    task: str,
    arch: str | dict | Arch,
    head: Mapping[str, Any] | None = None,
    input_size: tuple[int, int] = (1024, 768),
    *,
    dtype: torch.dtype = torch.float32,
    layerscale_value: float = 1e-4,
) -> dict[str, Any]:
    """The transformers ``config.json`` (as a dict) of a ``task`` model of ``arch`` with head kwargs ``head``.

    ``head`` takes the official names, as ``build_model``/``infer_head_config`` (ignored for ``"pretrain"``).

    Raises:
        ValueError: what transformers' Sapiens2 classes cannot build: albedo, the 4K tokenizer, deconv kernels other
            than 4 or conv kernels other than 1 in pose/seg heads, a head without upsampling units, or a pointmap
            scale MLP without exactly two hidden layers ending in one output.
    """
    _check_task(task)
    arch = get_arch(arch)
    if arch.use_tokenizer:
        raise ValueError(f"transformers' Sapiens2 has no 4K windowed tokenizer, so {arch.name} cannot be written")
    heads, layers = arch.num_heads, arch.num_layers
    config: dict[str, Any] = {
        "architectures": [TRANSFORMERS_CLASSES[task]],
        "model_type": MODEL_TYPE,
        "dtype": str(dtype).removeprefix("torch."),
        "hidden_size": arch.embed_dims,
        "intermediate_size": arch.feedforward_channels,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_attention_heads": max(heads // 2, 1),
        "num_key_value_heads_per_layer": [arch.kv_heads(i) for i in range(layers)],
        "num_first_full_attention_layers": 8,
        "num_last_full_attention_layers": 8,
        "image_size": [int(input_size[0]), int(input_size[1])],
        "layerscale_value": layerscale_value,
        **_FIXED_FIELDS,
    }
    if task != PRETRAIN:
        labels, head_config = _head_config(task, dict(head or {}))
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(labels)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(labels)}
        config["head_config"] = head_config
    return config


def _head_config(task: str, head: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    convs = [int(c) for c in head.get("conv_out_channels", ())]
    conv_kernels = [int(k) for k in head.get("conv_kernel_sizes") or [1 if task in _DECONV_TASKS else 3] * len(convs)]
    if task in _DECONV_TASKS:
        upsample = [int(c) for c in head.get("deconv_out_channels", ())]
        kernels = [int(k) for k in head.get("deconv_kernel_sizes") or [4] * len(upsample)]
        if any(k != 4 for k in kernels) or any(k != 1 for k in conv_kernels):
            raise ValueError(
                f"transformers' {task} head supports deconv kernels 4 and conv kernels 1 only; this head has "
                f"deconv_kernel_sizes={kernels}, conv_kernel_sizes={conv_kernels}"
            )
        labels = int(head.get("out_channels" if task == "pose" else "num_classes", 308 if task == "pose" else 29))
    else:
        upsample = [int(c) for c in head.get("upsample_channels", ())]
        kernels = [3] * len(upsample)  # our pixel-shuffle unit's conv is always 3x3
        labels = _FIXED_OUTPUTS[task]
    if not upsample:
        raise ValueError(f"transformers' {task} head needs at least one upsampling unit; this head has none")
    config: dict[str, Any] = {
        "model_type": "sapiens2_head",
        "upsample_out_channels": upsample,
        "upsample_kernel_sizes": kernels,
        "use_pixel_shuffle": task not in _DECONV_TASKS,
        "conv_out_channels": convs,
        "conv_kernel_sizes": conv_kernels,
    }
    if task == "pointmap":
        scale = [int(c) for c in head["scale_conv_out_channels"]]
        mlp = [int(c) for c in head["scale_final_layer"]]
        if len(mlp) != 4 or mlp[-1] != 1:
            raise ValueError(
                "transformers' pointmap scale MLP has exactly two hidden layers and one output, i.e. "
                f"scale_final_layer=(input, hidden1, hidden2, 1); this head has {tuple(mlp)}"
            )
        config["scale_conv_out_channels"] = scale
        config["scale_conv_kernel_sizes"] = [int(k) for k in head.get("scale_conv_kernel_sizes") or [1] * len(scale)]
        config["scale_final_input_size"] = mlp[0]
        config["scale_final_hidden_sizes"] = mlp[1:3]
    return labels, config


# --------------------------------------------------------------------------------------------------------- reading


def _task_of_weights(state_dict: Mapping[str, torch.Tensor]) -> str:
    """The task of weights whose config names no class: from the official output layer, or none for a backbone."""
    for task, layer in OUTPUT_LAYERS.items():
        if f"decode_head.{layer}.weight" in state_dict:
            return task
    if any(key.startswith(("decode_head.", "scale_head.")) for key in state_dict):
        raise ValueError(
            "config architectures is empty and the head's transformers key names do not tell the task; add the "
            f"class, e.g. \"architectures\": [\"{TRANSFORMERS_CLASSES['seg']}\"]"
        )
    return PRETRAIN


def _rope_periods(head_dim: int, rope_dtype: str | torch.dtype) -> torch.Tensor:
    """The periods a freshly built model of this RoPE dtype computes (bf16: the official files' values)."""
    from .models.layers.rope import RopePositionEmbedding

    rope = RopePositionEmbedding(head_dim, base=_FIXED_FIELDS["rope_theta"], dtype=rope_dtype, device="cpu")
    rope.reset_parameters()
    return rope.periods


# A transformers Sapiens2 block's key (``model.layer.3.``, ``model.model.layer.3.``); the official layout says blocks.
_TRANSFORMERS_LAYER = re.compile(r"(^|\.)layer\.\d+\.")


def convert_if_transformers(
    path: str | os.PathLike, state_dict: dict[str, torch.Tensor], rope_dtype: str | torch.dtype = "bf16"
) -> dict[str, torch.Tensor]:
    """The official-layout state dict of the weight file ``path`` when it sits in a transformers Sapiens2 folder
    (``config.json`` with ``model_type: "sapiens2"`` beside it); any other file's ``state_dict`` is returned as is.

    transformers' names are renamed, and the RoPE periods (which transformers does not store) are added as a model
    with ``rope_dtype`` RoPE computes them; stored periods are kept.

    Raises:
        ValueError: a config this package cannot build (see ``spec_from_config``), or weights whose head is another
            task's than the config's class, with the config's path in the message.
    """
    folder = Path(path).parent
    config = read_transformers_config(folder)
    if config is None:
        named = next((key for key in state_dict if _TRANSFORMERS_LAYER.search(key)), None)
        if named is not None and not any(".blocks." in key or key.startswith("blocks.") for key in state_dict):
            raise ValueError(
                f"{path} holds Hugging Face transformers Sapiens2 weights (keys like {named!r}) but there is no "
                f"Sapiens2 {CONFIG_NAME} beside it to read them by; put the folder's {CONFIG_NAME} next to it"
            )
        return state_dict
    try:
        spec = spec_from_config(config, task=None if config.get("architectures") else _task_of_weights(state_dict))
    except ValueError as error:
        raise ValueError(f"{folder / CONFIG_NAME}: {error}") from None
    converted = official_keys(state_dict, spec.task)
    if spec.task != PRETRAIN:
        held = [task for task, layer in OUTPUT_LAYERS.items() if f"decode_head.{layer}.weight" in converted]
        if held and spec.task not in held:
            raise ValueError(
                f"{folder / CONFIG_NAME} describes a {spec.task} model ({TRANSFORMERS_CLASSES[spec.task]}) but "
                f"{Path(path).name} holds a {held[0]} head"
            )
    prefix = "" if spec.task == PRETRAIN else "backbone."
    rope_key = f"{prefix}{_ROPE_KEY}"
    q_norm = converted.get(f"{prefix}blocks.0.attn.q_norm.weight")
    if rope_key not in converted and q_norm is not None:
        converted[rope_key] = _rope_periods(q_norm.shape[0], rope_dtype)
    return converted


# --------------------------------------------------------------------------------------------------------- writing


def save_transformers(
    model: nn.Module, folder: str | os.PathLike, *, input_size: tuple[int, int] | None = None
) -> Path:
    """Write ``model`` as a transformers Sapiens2 folder: ``config.json`` + ``model.safetensors``.

    transformers' ``Sapiens2Model`` (a bare ``Sapiens2`` backbone) or ``Sapiens2For*`` class (a ``TaskModel``)
    loads it with ``from_pretrained(folder)``; ``load_backbone``/``load_model`` read it back bit for bit. The
    tensors keep the model's dtype; the RoPE periods are not written (transformers recomputes them).

    Args:
        model: a ``Sapiens2`` backbone or a ``TaskModel`` (pose, seg, normal, pointmap, matting).
        folder: created if needed; an existing ``config.json``/``model.safetensors`` is replaced.
        input_size: the config's ``image_size`` (H, W); defaults to the backbone's ``img_size``.

    Returns:
        The folder.

    Raises:
        ValueError: a model transformers has no class for (albedo, the 4K tokenizer) or a head it builds
            differently (see ``config_from_spec``).

    Example:
        >>> save_transformers(load_model("seg", "my_seg.safetensors"), "my_seg_hf")
        >>> # transformers.Sapiens2ForSemanticSegmentation.from_pretrained("my_seg_hf")
    """
    from .data.io import write_safetensors
    from .models.backbone import Sapiens2
    from .models.task_model import TaskModel

    if isinstance(model, TaskModel):
        task, backbone = model.task, model.backbone
    elif isinstance(model, Sapiens2):
        task, backbone = PRETRAIN, model
    else:
        raise TypeError(f"save_transformers needs a Sapiens2 backbone or a TaskModel, got {type(model).__name__}")
    _check_task(task)
    if backbone.use_tokenizer:
        raise ValueError("transformers' Sapiens2 has no 4K windowed tokenizer, so this backbone cannot be written")
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if any(v.is_meta for v in state.values()):
        raise ValueError("the model is on the meta device (no weights); load or initialise it first")
    head = {}
    if task != PRETRAIN:
        head_state = {k.removeprefix("decode_head."): v for k, v in state.items() if k.startswith("decode_head.")}
        head = infer_head_config(task, head_state)
    dtypes = {v.dtype for k, v in state.items() if v.is_floating_point() and not k.endswith(_ROPE_KEY)}
    if len(dtypes) != 1:
        raise ValueError(f"the model mixes parameter dtypes {sorted(map(str, dtypes))}; cast it to one dtype first")
    config = config_from_spec(
        task,
        backbone.arch,
        head,
        tuple(input_size or backbone.img_size),
        dtype=dtypes.pop(),
        layerscale_value=backbone.layer_scale_init_value,
    )
    tensors = {k: v.to("cpu").contiguous() for k, v in transformers_keys(state, task).items()}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / WEIGHTS_NAME, tensors, {"format": "pt"})
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder
