"""The fast mode's pieces: the official key layout kept through fusing, RoPE table cache, packed linears, the torch
DARK-UDP decoder, and Predictor's ``mode`` option."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TINY_ARCH, TINY_HEADS, load_case
from safetensors.torch import load_file, save_file

from sapiens2 import Predictor, build_model, load_model
from sapiens2.models.fast import (
    CompiledBuckets,
    PackedLinear,
    fast_precision,
    is_fast,
    make_fast,
    onednn_linear_available,
)
from sapiens2.models.layers import Attention, RopePositionEmbedding, apply_rope
from sapiens2.models.layers.rope import apply_rope_fast
from sapiens2.pose.codec import decode_heatmaps, decode_heatmaps_torch, encode_heatmaps

GQA_ARCH = {"embed_dims": 64, "num_layers": 18, "num_heads": 4, "feedforward_channels": 128, "num_tokenizer_layers": 0}


def _tiny(task: str = "seg", arch=TINY_ARCH):
    torch.manual_seed(0)
    return build_model(task, arch, input_size=(64, 48), **TINY_HEADS[task]).eval()


def test_fused_model_keeps_the_official_state_dict_keys_order_and_values():
    reference = _tiny()
    fast = make_fast(_tiny(), pack_linears=False)
    assert is_fast(fast) and not is_fast(reference)
    assert not any(hasattr(m, "wq") for m in fast.modules() if isinstance(m, Attention))
    want, got = reference.state_dict(), fast.state_dict()
    assert list(got) == list(want)
    assert all(torch.equal(got[key], want[key]) for key in want)


def test_fused_model_saves_and_loads_official_files(tmp_path):
    fast = make_fast(_tiny(arch=GQA_ARCH), pack_linears=False)  # GQA blocks: q, k and v of different sizes
    path = tmp_path / "fast.safetensors"
    save_file(fast.state_dict(), str(path))  # no shared storage between the split tensors
    reloaded = load_model("seg", path)
    x = torch.randn(2, 3, 64, 48)
    with torch.inference_mode():
        assert torch.equal(reloaded(x), _tiny(arch=GQA_ARCH)(x))
    # An official file loads strictly into an already fused model.
    target = make_fast(build_model("seg", GQA_ARCH, input_size=(64, 48), **TINY_HEADS["seg"]), pack_linears=False)
    target.load_state_dict(load_file(str(path)), strict=True)
    with torch.inference_mode():
        assert torch.equal(target.eval()(x), reloaded(x))


def test_make_fast_is_idempotent_and_gqa_matches_repeated_kv():
    reference = _tiny(arch=GQA_ARCH)
    fast = make_fast(make_fast(_tiny(arch=GQA_ARCH), pack_linears=False), pack_linears=False)
    x = torch.randn(1, 3, 64, 48)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), reference(x), rtol=1e-4, atol=1e-5)


def test_rope_tables_are_cached_per_grid_only_without_gradients():
    fast = make_fast(_tiny(), pack_linears=False)
    rope = fast.backbone.rope_embed
    with torch.inference_mode():
        first, again, other = rope((4, 3)), rope((4, 3)), rope((5, 3))
    assert first[0] is again[0] and other[0].shape[0] == 15
    assert all(torch.equal(a, b) for a, b in zip(first, rope._compute((4, 3)), strict=True))
    with torch.enable_grad():
        assert rope((4, 3))[0] is not first[0]  # training never reads an inference-mode table
    rope.reset_parameters()
    assert not rope._tables
    with torch.inference_mode():
        first = rope((4, 3))
        with torch.no_grad():
            rope.periods.mul_(2)  # rewritten in place: same address, new version
        assert not torch.equal(rope((4, 3))[0], first[0])
    rope((4, 3))
    rope.load_state_dict(rope.state_dict())
    assert not rope._tables  # loading new periods drops every table (a compiled graph reads them unchecked)


def test_fast_model_trains_with_gradients_everywhere():
    fast = make_fast(_tiny(), pack_linears=False).train()
    fast(torch.randn(2, 3, 64, 48)).square().mean().backward()
    assert all(p.grad is not None for p in fast.parameters() if p.requires_grad)


@pytest.mark.skipif(not onednn_linear_available(), reason="torch without oneDNN")
def test_packed_linear_matches_linear_and_falls_back_under_autograd():
    linear = torch.nn.Linear(48, 40)
    packed = PackedLinear(linear)
    x = torch.randn(3, 7, 48)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
    out = packed(x.requires_grad_())
    out.sum().backward()
    assert x.grad is not None and linear.weight.grad is not None
    assert set(packed.state_dict()) == {"weight", "bias"}


def test_torch_decoder_agrees_with_the_numpy_decoder_on_the_fixtures():
    for case in ("E_codec_decode", "E_codec_decode_small"):
        _, folder = load_case(case)
        maps = load_file(folder / "inputs.safetensors")["heatmaps"]
        want, want_scores = decode_heatmaps(maps.numpy(), input_size=(1024, 768))
        got, scores = decode_heatmaps_torch(maps[None], input_size=(1024, 768))
        assert np.array_equal(scores[0].numpy(), want_scores)
        valid = want_scores > 0
        assert np.abs(got[0].numpy() - want)[valid].max() < 1e-3  # network-input pixels


def test_torch_decoder_on_random_batches_and_bad_input():
    rng = np.random.default_rng(0)
    points = rng.uniform([0, 0], [95, 127], size=(3, 5, 2))  # heatmaps as the network learns them, plus noise
    encoded = [encode_heatmaps(p, np.ones(5), input_size=(128, 96), heatmap_size=(32, 24), sigma=2)[0] for p in points]
    maps = torch.from_numpy(np.stack(encoded) + rng.normal(0, 0.01, (3, 5, 32, 24)).astype(np.float32))
    maps[1, 2] = 0  # an all-zero channel: NaN in both decoders
    want, want_scores = decode_heatmaps(maps.numpy(), input_size=(128, 96))
    got, scores = decode_heatmaps_torch(maps, input_size=(128, 96))
    assert np.array_equal(np.isnan(got.numpy()), np.isnan(want))
    np.testing.assert_allclose(got.numpy(), want, atol=1e-3, equal_nan=True)
    np.testing.assert_array_equal(scores.numpy(), want_scores)
    assert decode_heatmaps_torch(torch.zeros(0, 5, 8, 6))[0].shape == (0, 5, 2)
    with pytest.raises(ValueError, match="heatmaps must be"):
        decode_heatmaps_torch(torch.zeros(5, 8, 6))
    with pytest.raises(ValueError, match="blur_kernel_size"):
        decode_heatmaps_torch(maps, blur_kernel_size=4)


def test_predictor_mode_defaults_and_refusals(tiny_checkpoints):
    cpu = Predictor("seg", model=tiny_checkpoints["seg"], device="cpu", input_size=(64, 48))
    assert cpu.mode == "reference" and cpu.dtype == torch.float32 and not is_fast(cpu.model)
    fast = Predictor("seg", model=tiny_checkpoints["seg"], device="cpu", input_size=(64, 48), mode="fast")
    assert fast.mode == "fast" and is_fast(fast.model) and fast.dtype == fast_precision("cpu").dtype
    fast = Predictor("seg", model=tiny_checkpoints["seg"], device="cpu", input_size=(64, 48), mode="fast", dtype="fp32")
    image = np.random.default_rng(0).integers(0, 255, (40, 30, 3), dtype=np.uint8)
    assert (fast(image).labels == cpu(image).labels).mean() >= 0.999
    with pytest.raises(ValueError, match="mode must be one of fast, reference"):
        Predictor("seg", model=tiny_checkpoints["seg"], device="cpu", mode="turbo")
    with pytest.raises(ValueError, match="reference=True"):
        Predictor("seg", model=tiny_checkpoints["seg"], device="cpu", mode="fast", reference=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_default_is_fast_bf16(tiny_checkpoints):
    predictor = Predictor("seg", model=tiny_checkpoints["seg"], device="cuda", input_size=(64, 48))
    assert predictor.mode == "fast" and is_fast(predictor.model)
    assert predictor.dtype == (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32)
    reference = Predictor("seg", model=tiny_checkpoints["seg"], device="cuda", mode="reference")
    assert reference.dtype == torch.float32 and not is_fast(reference.model)


def test_compiled_buckets_round_batches_up_and_check_their_sizes():
    buckets = CompiledBuckets(torch.nn.Identity(), buckets=(1, 2, 4))
    assert [buckets.bucket(b) for b in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 12]
    with pytest.raises(ValueError, match="ascending"):
        CompiledBuckets(torch.nn.Identity(), buckets=(4, 2))


@pytest.mark.slow
def test_compiled_buckets_compile_once_per_bucket_and_agree_with_eager():
    """torch.compile with static shapes (about a minute per bucket on 2 CPU cores)."""
    model = make_fast(_tiny(), pack_linears=False)
    compiled = CompiledBuckets(model, buckets=(2, 4))
    x = torch.randn(3, 3, 64, 48)
    with torch.inference_mode():
        first = compiled(x)  # padded to 4
        again = compiled(x[:1].expand(4, -1, -1, -1).contiguous())  # same bucket: reused
        assert len(compiled.compiled) == 1 and first.shape == (3, 29, 64, 48)
        torch.testing.assert_close(first, model(x), rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(again[0], model(x[:1])[0], rtol=1e-3, atol=1e-4)
        # The RoPE tables were cached by one eager call before compiling; the graph reads them and never stores one
        # (a table stored inside a CUDA graph is an output the next replay overwrites: seen on an H100).
        (rope,) = [m for m in model.modules() if type(m).__name__ == "RopePositionEmbedding"]
        ((key, (stamp, tables)),) = rope._tables.items()
        compiled(x)
        assert rope._tables[key][1] is tables
        rope._tables[key] = (stamp, tuple(torch.zeros_like(t) for t in tables))  # the graph must see this
        unrotated = compiled(x)
        assert len(compiled.compiled) == 1 and not torch.equal(unrotated, first)  # (LayerScale 1e-4: a small change)
        torch.testing.assert_close(unrotated, model(x), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("rope_dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_rope_rotation_is_bit_identical_to_the_reference(rope_dtype, dtype):
    rope = RopePositionEmbedding(64, dtype=rope_dtype)
    rope.reset_parameters()
    sin, cos = rope((6, 5))
    x = torch.randn(2, 39, 4, 64).to(dtype).transpose(1, 2)  # a strided view, as the fused path hands it over
    got = apply_rope_fast(x, sin, cos)
    assert torch.equal(got, apply_rope(x, sin, cos)) and got.dtype == dtype


def test_keeping_freed_host_memory_stops_page_faults_between_networks():
    """glibc unmaps freed activations when another network ran in between; the fast mode's allocator setting keeps
    them (run in a fresh process: the setting is process-wide)."""
    import os
    import subprocess
    import sys

    script = """
import resource, sys, torch
from sapiens2.models import Sapiens2
from sapiens2.memory import keep_freed_host_memory
tuned = sys.argv[1] == "tuned" and keep_freed_host_memory()
torch.set_num_threads(1)
arch = {"embed_dims": 384, "num_layers": 2, "num_heads": 6, "feedforward_channels": 1536, "num_tokenizer_layers": 0}
fp32, bf16 = Sapiens2(arch).eval(), Sapiens2(arch).eval().bfloat16()
x = torch.randn(1, 3, 512, 384)
faults = []
with torch.inference_mode():
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fp32(x)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        bf16(x.bfloat16())  # another network in between
print(int(tuned), min(faults[1:]))
"""
    # glibc's dynamic mmap threshold makes the plain case depend on the machine's history of frees; pinning the
    # threshold at glibc's documented default (128 KiB) makes every forward map its activations afresh, which is
    # what the setting under test must undo.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    results = {}
    for variant in ("plain", "tuned"):
        out = subprocess.run(
            [sys.executable, "-c", script, variant], capture_output=True, text=True, check=True, env=env
        )
        results[variant] = [int(v) for v in out.stdout.split()]
    if not results["tuned"][0]:
        pytest.skip("not glibc: mallopt unavailable")
    assert results["plain"][1] > 1000, results  # the control: without the setting, every forward faults
    assert results["tuned"][1] < results["plain"][1] / 4, results
