"""Loading: sources (file, folder, repo id), safe formats, dtype handling, strict errors, offline behaviour."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

from sapiens2 import Sapiens2, load_backbone
from sapiens2.checkpoints import (
    CheckpointMismatchError,
    CheckpointNotFoundError,
    infer_arch,
    read_state_dict,
    resolve_checkpoint,
)
from sapiens2.models.zoo import ARCHS

TINY = {"embed_dims": 32, "num_layers": 10, "num_heads": 4, "feedforward_channels": 128, "num_tokenizer_layers": 0}
TINY_4K = TINY | {"num_tokenizer_layers": 2}


def tiny_model(**kwargs) -> Sapiens2:
    torch.manual_seed(0)
    return Sapiens2(TINY, **kwargs).eval()


def save(model: torch.nn.Module, path, dtype=None) -> None:
    state = {
        k: (v.to(dtype) if dtype and k != "rope_embed.periods" else v).contiguous()
        for k, v in model.state_dict().items()
    }
    save_file(state, str(path))


def outputs(model, x):
    with torch.inference_mode():
        return model(x)[0]


@pytest.mark.parametrize("name", list(ARCHS))
def test_arch_is_inferred_from_shapes_for_every_released_model(name):
    state = Sapiens2(name, device="meta").state_dict()
    assert infer_arch(state).name == name
    prefixed = {f"backbone.{k}": v for k, v in state.items()}
    assert infer_arch(prefixed, prefix="backbone.").name == name


def test_round_trip_file_and_folder_give_identical_outputs(tmp_path):
    model = tiny_model()
    save(model, tmp_path / "tiny.safetensors")
    x = torch.randn(2, 3, 64, 48)
    loaded = load_backbone(tmp_path / "tiny.safetensors")
    assert loaded.arch.embed_dims == 32 and loaded.arch.num_layers == 10
    assert torch.equal(outputs(loaded, x), outputs(model, x))
    assert torch.equal(outputs(load_backbone(tmp_path), x), outputs(model, x))
    featmap = load_backbone(tmp_path, out_type="featmap")
    assert outputs(featmap, x).shape == (2, 32, 4, 3)


def test_tokenizer_checkpoint_infers_the_4k_variant(tmp_path):
    torch.manual_seed(0)
    model = Sapiens2(TINY_4K, use_tokenizer=True).eval()
    save(model, tmp_path / "tiny4k.safetensors")
    loaded = load_backbone(tmp_path / "tiny4k.safetensors")
    assert loaded.tokenizer is not None
    x = torch.randn(1, 3, 128, 128)
    assert torch.equal(outputs(loaded, x), outputs(model, x))


def test_bf16_file_loads_into_float32_or_keeps_bf16_on_request(tmp_path):
    model = tiny_model()
    save(model, tmp_path / "bf16.safetensors", dtype=torch.bfloat16)
    loaded = load_backbone(tmp_path / "bf16.safetensors")
    assert loaded.blocks[0].attn.wq.weight.dtype == torch.float32
    assert loaded.rope_embed.periods.dtype == torch.bfloat16
    assert torch.equal(loaded.blocks[0].attn.wq.weight, model.blocks[0].attn.wq.weight.bfloat16().float())
    kept = load_backbone(tmp_path / "bf16.safetensors", dtype="auto")
    assert kept.blocks[0].attn.wq.weight.dtype == torch.bfloat16


def test_pth_loads_with_weights_only_and_pickled_code_is_refused(tmp_path):
    model = tiny_model()
    torch.save({"state_dict": model.state_dict()}, tmp_path / "tiny.pth")
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(outputs(load_backbone(tmp_path / "tiny.pth"), x), outputs(model, x))

    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"state_dict": model.state_dict(), "evil": Exploit()}, tmp_path / "evil.pth")
    with pytest.raises(ValueError, match="evil.pth"):
        read_state_dict(tmp_path / "evil.pth")


def test_mismatched_file_lists_missing_unexpected_misshaped_keys_and_names_the_arch(tmp_path):
    state = dict(tiny_model().state_dict())
    del state["blocks.3.ffn.w3.bias"]
    state["blocks.0.attn.extra"] = torch.zeros(1)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "broken.safetensors"))
    with pytest.raises(CheckpointMismatchError) as error:
        load_backbone(tmp_path / "broken.safetensors")
    message = str(error.value)
    assert "broken.safetensors" in message
    assert "1 missing keys: blocks.3.ffn.w3.bias" in message
    assert "1 unexpected keys: blocks.0.attn.extra" in message
    save(tiny_model(), tmp_path / "tiny.safetensors")
    with pytest.raises(CheckpointMismatchError) as error:
        load_backbone(tmp_path / "tiny.safetensors", arch="sapiens2_0.1b")
    message = str(error.value)
    assert "mis-shaped" in message and "cls_token: file (1, 1, 32) vs model (1, 1, 768)" in message
    assert "embed_dims=32, num_layers=10, num_heads=4" in message


def test_released_shapes_name_the_released_arch_in_the_error():
    from sapiens2.checkpoints import check_keys, describe_arch

    state = Sapiens2("sapiens2_0.4b", device="meta").state_dict()
    with pytest.raises(CheckpointMismatchError, match="suggest: sapiens2_0.4b"):
        check_keys(Sapiens2("sapiens2_0.1b", device="meta"), state, describe_arch(infer_arch(state)))


def test_bad_sources_give_clear_errors(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="not found"):
        resolve_checkpoint(tmp_path / "nope.safetensors")
    with pytest.raises(CheckpointNotFoundError, match="No weight file"):
        resolve_checkpoint(tmp_path)
    (tmp_path / "a.safetensors").write_bytes(b"x")
    (tmp_path / "b.safetensors").write_bytes(b"x")
    with pytest.raises(CheckpointNotFoundError, match="Several weight files"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="Cannot read checkpoint .*a.safetensors"):
        read_state_dict(tmp_path / "a.safetensors")
    with pytest.raises(CheckpointNotFoundError, match="No released 'pose' weights for sapiens2_0.1b"):
        resolve_checkpoint("0.1b", task="pose")


def _run_isolated(code: str, env_extra: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )


def test_offline_download_fails_fast_with_one_clear_message(tmp_path):
    """HF_HUB_OFFLINE=1 and an empty cache: one message naming the repo, the file and the local-path fix."""
    code = """
        from sapiens2 import load_backbone
        try:
            load_backbone("facebook/sapiens2-pretrain-1b")
        except FileNotFoundError as error:
            print("ERROR:", error)
    """
    result = _run_isolated(code, {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("ERROR: Cannot download 'sapiens2_1b_pretrain.safetensors'")
    assert "'facebook/sapiens2-pretrain-1b'" in line and "HF_HUB_OFFLINE" in line and "local path" in line


def test_unreachable_hub_fails_fast_without_retrying(tmp_path):
    code = """
        import time
        from sapiens2.checkpoints import download
        start = time.monotonic()
        try:
            download("facebook/sapiens2-seg-1b", "sapiens2_1b_seg.safetensors")
        except FileNotFoundError as error:
            print(f"{time.monotonic() - start:.1f}", error)
    """
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
    result = _run_isolated(code, env)
    seconds, message = result.stdout.split(" ", 1)
    assert float(seconds) < 10, "should not go through huggingface_hub's retry loop"
    assert "not reachable" in message and "facebook/sapiens2-seg-1b" in message


def test_cached_download_is_used_offline(tmp_path):
    """A file already in the Hugging Face cache loads by repo id with HF_HUB_OFFLINE=1."""
    commit = "0" * 40
    repo = tmp_path / "hub" / "models--facebook--sapiens2-pretrain-0.1b"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    save(tiny_model(), repo / "snapshots" / commit / "sapiens2_0.1b_pretrain.safetensors")
    code = """
        from sapiens2 import load_backbone
        model = load_backbone("facebook/sapiens2-pretrain-0.1b")
        print(model.arch.embed_dims, len(model.blocks))
    """
    result = _run_isolated(code, {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["32", "10"]


# Peak host memory: a 34M-parameter seg model stored in bf16 (67 MiB), loaded in a fresh process. The peak resident
# set (VmHWM, Linux) must rise by about the bf16 size when loading in bf16, and by about the fp32 size (plus one
# tensor in flight) when loading in fp32: never the file plus a float32 copy of it.
MEMORY_ARCH = TINY | {"embed_dims": 512, "num_layers": 8, "num_heads": 8, "feedforward_channels": 2048}
MEMORY_HEAD = {
    "deconv_out_channels": (32,),
    "deconv_kernel_sizes": (4,),
    "conv_out_channels": (32,),
    "conv_kernel_sizes": (1,),
}
_PEAK_SCRIPT = """
import sys, torch
from sapiens2 import Predictor, load_model

def hwm_mib():
    status = open("/proc/self/status").read()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024

tiny, big, call = sys.argv[1:]
eval(call.replace("PATH", repr(tiny)))  # the same path once on a tiny file: lazy imports and first-use caches
before = hwm_mib()
model = eval(call.replace("PATH", repr(big)))
model = getattr(model, "model", model)
torch.stack([tensor.sum() for tensor in model.state_dict().values()])  # every page resident, even if memory-mapped
print(hwm_mib() - before)
"""


@pytest.fixture(scope="module")
def bf16_seg_files(tmp_path_factory):
    from sapiens2 import build_model

    folder = tmp_path_factory.mktemp("memory")
    generator = torch.Generator().manual_seed(0)
    files = {}
    for name, arch in (("tiny", TINY), ("big", MEMORY_ARCH)):
        shapes = build_model("seg", arch, device="meta", **MEMORY_HEAD).state_dict()
        state = {k: torch.randn(v.shape, generator=generator).to(torch.bfloat16) for k, v in shapes.items()}
        save_file(state, str(folder / f"{name}.safetensors"))
        files[name] = (folder / f"{name}.safetensors", sum(v.numel() * 2 for v in state.values()) / 2**20)
    return files


def _peak_growth_mib(files, call: str) -> float:
    if not os.path.exists("/proc/self/status"):
        pytest.skip("peak resident set is read from /proc/self/status (Linux)")
    (tiny, _), (big, _) = files["tiny"], files["big"]
    result = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(tiny), str(big), call], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return float(result.stdout.split()[-1])


def test_bf16_file_loads_in_bf16_with_peak_host_memory_of_the_bf16_size(bf16_seg_files):
    bf16_mib = bf16_seg_files["big"][1]
    for call in ('Predictor("seg", model=PATH, device="cpu", dtype="bf16")', 'load_model("seg", PATH, dtype="auto")'):
        growth = _peak_growth_mib(bf16_seg_files, call)
        assert 0.9 * bf16_mib < growth < 1.2 * bf16_mib, f"{call}: peak +{growth:.0f} MiB for a {bf16_mib:.0f} MiB file"


def test_bf16_file_loads_in_fp32_without_keeping_the_bf16_copy(bf16_seg_files):
    bf16_mib = bf16_seg_files["big"][1]
    growth = _peak_growth_mib(bf16_seg_files, 'load_model("seg", PATH)')
    # fp32 is twice the file; reading everything first and casting after would need three times.
    assert 1.8 * bf16_mib < growth < 2.4 * bf16_mib, f"peak +{growth:.0f} MiB for a {bf16_mib:.0f} MiB bf16 file"


def test_loaded_model_holds_the_file_tensors_in_the_requested_dtype(bf16_seg_files):
    from safetensors.torch import load_file

    from sapiens2 import load_model

    path = bf16_seg_files["tiny"][0]
    stored = load_file(str(path))
    model = load_model("seg", path, dtype=torch.bfloat16)
    assert all(not t.is_meta for t in model.state_dict().values())
    for key, tensor in model.state_dict().items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, stored[key]), key


def test_a_tensor_no_checkpoint_key_fills_is_refused():
    from sapiens2.checkpoints import load_into

    class WithScratch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(2, device="meta"))
            self.register_buffer("scratch", torch.empty(2, device="meta"), persistent=False)

    with pytest.raises(RuntimeError, match="scratch"):
        load_into(WithScratch(), {"weight": torch.ones(2)})


def test_read_state_dict_places_every_tensor_on_the_device_periods_keeping_their_dtype(tmp_path):
    """A transformers folder's RoPE periods are computed, not read: they go to the device too (meta stands for GPU)."""
    from sapiens2 import save_transformers

    save_transformers(tiny_model(), tmp_path / "hf")
    state = read_state_dict(tmp_path / "hf" / "model.safetensors", device="meta", dtype=torch.float16)
    assert all(tensor.is_meta for tensor in state.values())
    assert state["rope_embed.periods"].dtype == torch.bfloat16 and state["cls_token"].dtype == torch.float16


def _tiny_seg_file(path, **change):
    """A tiny seg task checkpoint (official layout) at ``path`` with ``change``: key -> function of its tensor."""
    from sapiens2 import build_model

    torch.manual_seed(0)
    model = build_model("seg", TINY, input_size=(64, 48), deconv_out_channels=[16], deconv_kernel_sizes=[4],
                        conv_out_channels=[8], conv_kernel_sizes=[1])  # fmt: skip
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    for key, function in change.items():
        state[key] = function(state[key]).contiguous()
    if str(path).endswith(".safetensors"):
        save_file(state, str(path))
    else:
        torch.save(state, path)
    return path


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_integer_or_boolean_weights_are_refused_by_name(dtype, suffix, tmp_path):
    from sapiens2 import load_model

    key = "decode_head.conv_seg.weight"
    path = _tiny_seg_file(tmp_path / f"seg{suffix}", **{key: lambda t: t.to(dtype)})
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(CheckpointMismatchError, match=f"1 wrong-dtype keys: {key}: file {name} vs model floating"):
        load_model("seg", path)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("empty", "the file is empty \\(0 bytes\\)"),
        ("random", "not a (PyTorch checkpoint|safetensors file) \\("),
        ("truncated", "truncated: "),
        ("html", "not a (PyTorch checkpoint|safetensors file) but a text file \\(it starts '<!DOCTYPE html>"),
    ],
)
@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_empty_random_truncated_or_text_checkpoints_get_one_line_naming_the_file(kind, message, suffix, tmp_path):
    from sapiens2 import load_model

    path = tmp_path / f"seg{suffix}"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "random":
        path.write_bytes(b"\x01" + os.urandom(4095))  # neither a pickle, a zip nor a plausible safetensors header
    elif kind == "truncated":
        whole = _tiny_seg_file(tmp_path / f"whole{suffix}").read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    else:
        path.write_bytes(b"<!DOCTYPE html><html><body>Access denied</body></html>\n")
    with pytest.raises(ValueError, match=message) as caught:
        load_model("seg", path)
    text = str(caught.value)
    assert str(path) in text and "\n" not in text and "_use_new_zipfile" not in text and "weights_only" not in text


def test_transformers_folder_without_config_json_says_so(tmp_path):
    from sapiens2 import load_model
    from sapiens2.transformers_format import save_transformers

    folder = save_transformers(load_model("seg", _tiny_seg_file(tmp_path / "seg.safetensors")), tmp_path / "hf")
    (folder / "config.json").unlink()
    with pytest.raises(ValueError, match="holds Hugging Face transformers Sapiens2 weights .* no Sapiens2 config.json"):
        load_model("seg", folder)


def test_loading_nan_weights_warns_and_finite_ones_do_not(tmp_path, caplog):
    from sapiens2 import load_model

    finite = _tiny_seg_file(tmp_path / "finite.safetensors")
    nan = tmp_path / "nan.safetensors"
    save_file({k: torch.full_like(v, float("nan")) if k.startswith("decode_head") else v
               for k, v in read_state_dict(finite).items()}, str(nan))  # fmt: skip
    with caplog.at_level("WARNING", logger="sapiens2.checkpoints"):
        load_model("seg", finite)
        assert not caplog.records
        model = load_model("seg", nan)
    [record] = caplog.records
    assert str(nan) in record.getMessage() and "hold NaN or infinite values" in record.getMessage()
    assert "decode_head.conv_seg.weight" in record.getMessage() or "..." in record.getMessage()
    assert torch.isnan(model(torch.zeros(1, 3, 64, 48))).all()  # what the warning is about
