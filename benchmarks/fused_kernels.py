"""The fast mode's fused ops (issue #25) against their unfused torch forms, and the fast mode with and without them.

Two tables, every variant alternating with the others, one timed batch of ``--iters`` calls each per round, after a
warm-up that compiles; medians over ``--rounds``:

1. each fused op (``sapiens2.models.layers.fused``: Triton kernels on CUDA) against the same work as the unfused
   fast mode does it, eager and compiled by Inductor, at the 1b shapes (batch 8, 1024x768: 3081 tokens, width 1536,
   24 heads of 64, GQA blocks 12 kv heads, FFN 6144), in bf16: ms per call, speed-up, and the bytes each call must
   move over the time (GB/s);
2. the 1b backbone in bf16, 1024x768, batch 8, fast mode eager and compiled (``CompiledBuckets`` with CUDA graphs, as
   ``sapiens2 benchmark --compile``), without and with the fused ops: ms per image, images/s, TFLOP/s, MFU against
   the device peak (``sapiens2.benchmark.GPU_PEAK_TFLOPS``), and each output's distance from the first variant's;
   eager first (and transformers' port with ``--transformers``), printed before the compiles start; last a
   ``decision`` line on ``FUSED_KERNELS_ON_CUDA`` (compiled with the fused ops against compiled without).

``--device cpu --tiny`` runs the same code on a tiny configuration (4 blocks of width 64, 4 heads of 16, 64x48,
batch 2, float32), where the fused ops run their reference torch ops: it checks the script, not the speed.

    python benchmarks/fused_kernels.py                          # GPU: the figures of docs/benchmarks.md
    python benchmarks/fused_kernels.py --device cpu --tiny --rounds 2 --iters 2
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from sapiens2 import Sapiens2
from sapiens2.benchmark import device_peak_tflops
from sapiens2.models.fast import CompiledBuckets, attention_backends, make_fast
from sapiens2.models.layers import RopePositionEmbedding
from sapiens2.models.layers.fused import qk_norm_rope, scale_add, silu_mul
from sapiens2.models.layers.rope import apply_rope_fast
from sapiens2.models.zoo import get_arch

TINY_ARCH = {"embed_dims": 64, "num_layers": 4, "num_heads": 4, "feedforward_channels": 256, "num_tokenizer_layers": 0}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alternate(variants: dict[str, Callable[[], object]], device: torch.device, rounds: int, iters: int) -> dict:
    """Median seconds per call of each variant, timed in turn (one batch of ``iters`` calls each per round)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            _synchronize(device)
            start = time.perf_counter()
            for _ in range(iters):
                run()
            _synchronize(device)
            times[name].append((time.perf_counter() - start) / iters)
    return {name: statistics.median(values) for name, values in times.items()}


def _unfused_qk(qkv, q_weight, k_weight, sin, cos, heads, kv_heads, eps):
    """What the fast mode does without the fused op (``Attention._attend_fused``'s other branch)."""
    batch, tokens, _ = qkv.shape
    head_dim = q_weight.shape[0]
    heads_first = qkv.view(batch, tokens, heads + 2 * kv_heads, head_dim).transpose(1, 2)  # (B, h+2kv, N, hd)
    q, k, v = heads_first.split([heads, kv_heads, kv_heads], dim=1)
    q = apply_rope_fast(F.rms_norm(q, (head_dim,), q_weight, eps), sin, cos)
    k = apply_rope_fast(F.rms_norm(k, (head_dim,), k_weight, eps), sin, cos)
    return q, k, v


def _unfused_silu_mul(hidden):
    gate, up = hidden.chunk(2, dim=-1)
    return F.silu(gate) * up


def _unfused_scale_add(x, y, scale):
    return x + y * scale


def op_table(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> None:
    arch = TINY_ARCH if args.tiny else {"embed_dims": 1536, "num_heads": 24, "feedforward_channels": 6144}
    size = (64, 48) if args.tiny else (1024, 768)
    batch, dim, heads = args.batch, arch["embed_dims"], arch["num_heads"]
    head_dim, grid = dim // heads, (size[0] // 16, size[1] // 16)
    tokens = 9 + grid[0] * grid[1]
    rope = RopePositionEmbedding(head_dim, device=device)
    rope.reset_parameters()
    sin, cos = rope(grid)
    generator = torch.Generator(device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device).to(dtype)

    weights = randn(head_dim) * 0.1 + 1, randn(head_dim) * 0.1 + 1
    compiled_qk = torch.compile(_unfused_qk, dynamic=False)
    compiled_silu_mul = torch.compile(_unfused_silu_mul, dynamic=False)
    compiled_scale_add = torch.compile(_unfused_scale_add, dynamic=False)
    rows = []
    for kv_heads in (heads, heads // 2):
        qkv = randn(batch, tokens, (heads + 2 * kv_heads) * head_dim)
        call = (qkv, *weights, sin, cos, heads, kv_heads, 1e-6)
        moved = qkv.element_size() * batch * tokens * (heads + kv_heads) * head_dim * 2  # read q and k, write them
        rows.append((f"q/k-norm + RoPE, {kv_heads} kv heads", moved, {
            "fused": lambda c=call: qk_norm_rope(c[0], c[1], c[2], (c[3], c[4]), num_heads=c[5], num_kv_heads=c[6],
                                                 eps=c[7]),
            "unfused eager": lambda c=call: _unfused_qk(*c),
            "unfused compiled": lambda c=call: compiled_qk(*c),
        }))  # fmt: skip
    hidden = randn(batch, tokens, 2 * arch["feedforward_channels"])
    rows.append(("SiLU(gate) * up", hidden.numel() * hidden.element_size() * 3 // 2, {
        "fused": lambda: silu_mul(hidden),
        "unfused eager": lambda: _unfused_silu_mul(hidden),
        "unfused compiled": lambda: compiled_silu_mul(hidden),
    }))  # fmt: skip
    x, y, scale = randn(batch, tokens, dim), randn(batch, tokens, dim), randn(dim)
    rows.append(("LayerScale + residual", x.numel() * x.element_size() * 3, {
        "fused": lambda: scale_add(x, y, scale),
        "unfused eager": lambda: _unfused_scale_add(x, y, scale),
        "unfused compiled": lambda: compiled_scale_add(x, y, scale),
    }))  # fmt: skip

    print(f"\n### Fused ops, batch {batch}, {tokens} tokens, {dtype} ({args.rounds} rounds x {args.iters} calls)\n")
    print("| op | variant | ms / call | vs unfused eager | GB/s |")
    print("|---|---|---|---|---|")
    with torch.inference_mode():
        for name, moved, variants in rows:
            for run in variants.values():  # warm-up: compiles (Inductor and Triton)
                run()
            medians = alternate(variants, device, args.rounds, args.iters)
            for variant, seconds in medians.items():
                ratio = medians["unfused eager"] / seconds
                print(f"| {name} | {variant} | {seconds * 1e3:.3f} | {ratio:.2f}x | {moved / seconds / 1e9:.0f} |")


def _transformers_port(model: Sapiens2, dtype: torch.dtype, device: torch.device) -> Callable | None:
    """transformers' port of ``model`` (its weights saved and loaded back), eager, or None where transformers has
    none (not installed, or a version without ``Sapiens2Model``)."""
    import importlib.util
    import tempfile

    if importlib.util.find_spec("transformers") is None:
        return None
    import transformers

    if not hasattr(transformers, "Sapiens2Model"):
        return None
    from sapiens2 import save_transformers

    with tempfile.TemporaryDirectory() as folder:
        save_transformers(model, folder)
        hf = transformers.Sapiens2Model.from_pretrained(folder, dtype=dtype).to(device).eval()
    return lambda x: hf(pixel_values=x).last_hidden_state


def _print_rows(title: str, medians: dict, outputs: dict, reference: torch.Tensor, flops: float, peak, batch: int):
    print(f"\n### {title}\n")
    print("| variant | ms / image | images/s | TFLOP/s | MFU | max rel vs eager without fused ops |")
    print("|---|---|---|---|---|---|")
    for name, seconds in medians.items():
        tflops = flops / seconds / 1e12
        mfu = f"{tflops / peak * 100:.1f} %" if peak else "-"
        got = outputs.get(name)
        distance = "-" if got is None or got.shape != reference.shape else (
            f"{((got - reference).abs().max() / reference.abs().max()).item():.1e}")  # fmt: skip
        print(f"| {name} | {seconds / batch * 1e3:.2f} | {batch / seconds:.2f} | {tflops:.1f} | {mfu} | {distance} |",
              flush=True)  # fmt: skip


def model_table(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> None:
    """Eager first (no compile: figures within seconds), then compiled, each pair alternating; the last line is the
    decision on ``FUSED_KERNELS_ON_CUDA`` (compiled with the fused ops against compiled without)."""
    arch = get_arch(TINY_ARCH if args.tiny else "sapiens2_1b")
    size = (64, 48) if args.tiny else (1024, 768)
    models = {}
    for fused in (False, True):
        torch.manual_seed(0)
        model = Sapiens2(arch, img_size=size, out_type="featmap", device=device, dtype=dtype).eval()
        models[fused] = make_fast(model, pack_linears=False, fused_kernels=fused)
    x = torch.randn(args.batch, 3, *size, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    flops, peak = arch.flops(size) * args.batch, device_peak_tflops(device, dtype)
    label = {False: "without fused ops", True: "with fused ops"}
    print(f"\nbackbone {arch.name}, {size[0]}x{size[1]}, batch {args.batch}, {dtype}, random weights "
          f"({args.rounds} rounds x {args.iters} calls, alternating)", flush=True)  # fmt: skip
    eager = {f"eager, {label[fused]}": (lambda m=model: m(x)[0]) for fused, model in models.items()}
    if args.transformers:
        try:  # the same weights (the fast model's state dict has the official keys)
            port = _transformers_port(models[False], dtype, device)
        except Exception as error:  # noqa: BLE001 - a broken port must not cost the compiled rows after it
            port = None
            print(f"transformers' port: failed ({type(error).__name__}: {error}); left out")
        if port is None:
            print("transformers' port: not available here (transformers missing, without Sapiens2Model, or failed)")
        else:  # its tokens after the 9 prefix ones, as our (B, D, Hp, Wp)
            grid = size[0] // 16, size[1] // 16
            eager["transformers' port, eager"] = lambda: port(x)[:, 9:].reshape(
                x.shape[0], *grid, -1).permute(0, 3, 1, 2)  # fmt: skip
    outputs = {}
    with torch.inference_mode(), attention_backends(device):
        for name, run in eager.items():
            outputs[name] = run().float().clone()  # warm-up: RoPE tables, cuDNN plans
        medians = alternate(eager, device, args.rounds, args.iters)
        reference = outputs["eager, without fused ops"]
        _print_rows("eager", medians, outputs, reference, flops, peak, args.batch)
        if args.no_compile:
            return
        compiled = {}
        for fused, model in models.items():  # without first: the baseline if the time runs out in the second
            start = time.perf_counter()
            network = CompiledBuckets(model, cuda_graphs=True)
            network(x)
            name = f"compiled, {label[fused]}"
            outputs[name] = network(x)[0].float().clone()
            compiled[name] = lambda n=network: n(x)
            print(f"compiled {label[fused]} in {time.perf_counter() - start:.0f} s", flush=True)
        medians = alternate(compiled, device, args.rounds, args.iters)
    _print_rows("compiled (CUDA graphs on CUDA)", medians, outputs, reference, flops, peak, args.batch)
    ratio = medians["compiled, without fused ops"] / medians["compiled, with fused ops"]
    verdict = "faster: set FUSED_KERNELS_ON_CUDA = True (sapiens2/models/fast.py) if the tests step passed"
    if ratio <= 1:
        verdict = "not faster: keep FUSED_KERNELS_ON_CUDA off; fix the kernels or remove them"
    print(f"\ndecision: compiled with fused ops runs at {ratio:.3f}x compiled without ({100 * (ratio - 1):+.1f} %): "
          f"{verdict}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny model and shapes, float32 (checks the script)")
    parser.add_argument("--batch", type=int, default=None, help="default 8 (tiny: 2)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true", help="leave out the compiled backbone variants")
    parser.add_argument("--only", choices=["ops", "model"], default=None)
    parser.add_argument("--transformers", action="store_true", help="add transformers' port (eager) to the backbone")
    args = parser.parse_args()
    args.batch = args.batch or (2 if args.tiny else 8)
    device = torch.device(args.device)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    print(f"{where}; torch {torch.__version__}, Triton {triton_version}; {datetime.date.today()}")
    if args.only in (None, "ops"):
        op_table(args, device, dtype)
    if args.only in (None, "model"):
        model_table(args, device, dtype)


if __name__ == "__main__":
    main()
