"""The Triton kernels of ``sapiens2.models.layers.triton_kernels`` on CPU tensors through Triton's interpreter.

Run by ``tests/test_fused_kernels.py`` in a subprocess (``TRITON_INTERPRET=1`` must be set before Triton is
imported, and the CUDA tests of the same session need the real compiler): ``python tests/fused_interpreter.py ops``
(or ``backbones``). Prints one JSON object of disagreement figures (max|kernel - reference| / max|reference|, the
issue #11 figure) that the test holds to its bounds. The interpreter runs each kernel program in Python (tens of ms
each), so the backbones (about 300 programs per forward) take minutes:

- ``ops``: each kernel against its op's reference implementation (the CPU one: the layers' torch ops), on random
  inputs of the parity cases' shapes (4 heads, 2 kv heads in GQA, token grids 4x3, 6x5, 5x4, 3x7) with head dims 16
  (the parity cases), 64, 76 and 80 (the released archs), float32 and bfloat16, bf16 and fp32 RoPE; with negative
  controls: the RoPE kernel given its tables with sin negated (rotate_half with its halves swapped) or shifted by one
  token (the prefix count off by one);
- ``backbones``: the parity backbones in fast mode with the kernels as the ops' CPU implementation, against the
  reference mode (float32) and against the fast mode without fused ops (bfloat16); and the same with the
  swapped-halves RoPE kernel.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: kernels are built as interpreted functions

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import PARITY  # noqa: E402
from parity import tensor_rule  # noqa: E402
from test_backbone_parity import build_from_case  # noqa: E402

from sapiens2.models.fast import make_fast  # noqa: E402
from sapiens2.models.layers import RopePositionEmbedding  # noqa: E402
from sapiens2.models.layers import triton_kernels as kernels  # noqa: E402
from sapiens2.models.layers.fused import qk_norm_rope, scale_add, silu_mul  # noqa: E402

HEADS, KV_HEADS = 4, 2
HEAD_DIMS = (16, 64, 76, 80)
GRIDS = ((4, 3), (6, 5), (5, 4), (3, 7))
PREFIX = 9  # cls + 8 storage tokens
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def disagreement(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(tensor_rule(got.float().numpy(), want.float().numpy())[0])


def _qk_inputs(head_dim: int, grid: tuple[int, int], dtype: torch.dtype, rope_dtype: str, kv_heads: int):
    generator = torch.Generator().manual_seed(head_dim * 100 + grid[0])
    tokens = PREFIX + grid[0] * grid[1]
    qkv = (torch.randn(2, tokens, (HEADS + 2 * kv_heads) * head_dim, generator=generator) * 2).to(dtype)
    weights = [(torch.rand(head_dim, generator=generator) + 0.5).to(dtype) for _ in range(2)]
    rope = RopePositionEmbedding(head_dim, dtype=rope_dtype)
    rope.reset_parameters()
    return qkv, weights, rope(grid)


def _qk_figures(head_dim: int, dtype_name: str, rope_dtype: str, kv_heads: int, grid: tuple[int, int]) -> dict:
    qkv, (q_weight, k_weight), (sin, cos) = _qk_inputs(head_dim, grid, DTYPES[dtype_name], rope_dtype, kv_heads)
    name = f"qk_norm_rope/hd{head_dim}/{dtype_name}/rope_{rope_dtype}/kv{kv_heads}/{grid[0]}x{grid[1]}"
    want = qk_norm_rope(qkv, q_weight, k_weight, (sin, cos), num_heads=HEADS, num_kv_heads=kv_heads, eps=1e-6)[:2]
    figures = {}
    for suffix, tables in (
        ("", (sin, cos)),
        ("/wrong_swapped_halves", (-sin, cos)),
        ("/wrong_prefix_off_by_one", (torch.cat([sin[:1], sin]), torch.cat([cos[:1], cos]))),
    ):
        got = kernels.launch_qk_norm_rope(qkv, q_weight, k_weight, *tables, HEADS, kv_heads, 1e-6)
        figures[name + suffix] = max(disagreement(g, w) for g, w in zip(got, want, strict=True))
    return figures


def op_figures() -> dict[str, float]:
    figures = {}
    index = 0
    for head_dim in HEAD_DIMS:
        for dtype_name in DTYPES:
            for rope_dtype in ("bf16", "fp32"):
                kv_heads = (HEADS, KV_HEADS)[index % 2]  # MHA and GQA blocks, and the grids, in turn
                figures |= _qk_figures(head_dim, dtype_name, rope_dtype, kv_heads, GRIDS[index % len(GRIDS)])
                index += 1
        tokens, dim = PREFIX + 30, HEADS * head_dim
        hidden = torch.randn(2, tokens, 2 * 4 * dim)  # (B, N, 2F), F = 4 D as in the released archs
        x, y, scale = torch.randn(2, tokens, dim), torch.randn(2, tokens, dim), torch.rand(dim) * 1e-2
        for dtype_name, dtype in DTYPES.items():
            h = hidden.to(dtype)
            figures[f"silu_mul/hd{head_dim}/{dtype_name}"] = disagreement(kernels.launch_silu_mul(h), silu_mul(h))
            args = (x.to(dtype), y.to(dtype), scale.to(dtype))
            figures[f"scale_add/hd{head_dim}/{dtype_name}"] = disagreement(
                kernels.launch_scale_add(*args), scale_add(*args)
            )
    return figures


def _wrong_rope_kernel(qkv, q_weight, k_weight, sin, cos, num_heads, num_kv_heads, eps):
    return kernels.launch_qk_norm_rope(qkv, q_weight, k_weight, -sin, cos, num_heads, num_kv_heads, eps)


KERNELS = {"right": kernels.launch_qk_norm_rope, "wrong": _wrong_rope_kernel}
chosen = ["right"]


def use_kernels_on_cpu() -> None:
    """Make the Triton launchers the ops' CPU implementation (this process only)."""
    torch.library.register_kernel("sapiens2::qk_norm_rope", "cpu", lambda *args: KERNELS[chosen[0]](*args))
    torch.library.register_kernel("sapiens2::silu_mul", "cpu", kernels.launch_silu_mul)
    torch.library.register_kernel("sapiens2::scale_add", "cpu", kernels.launch_scale_add)


# (case, dtype, with the wrong kernel too)
BACKBONE_RUNS = (
    ("A_backbone_bf16rope", "fp32", True),
    ("A_backbone_bf16rope", "bf16", True),
    ("A_backbone_fp32rope", "fp32", False),
    ("B_backbone_tokenizer", "fp32", False),
)


def backbone_figures() -> dict[str, float]:
    figures = {}
    for name, dtype_name, with_wrong in BACKBONE_RUNS:
        dtype = DTYPES[dtype_name]
        folder = PARITY / name
        case = json.loads((folder / "case.json").read_text())
        weights = load_file(folder / "weights.safetensors")
        inputs = list(load_file(folder / "inputs.safetensors").values())
        models = []
        for fused in (None, False, True):  # reference mode, fast without and with the fused ops
            model = build_from_case(case)
            model.load_state_dict(weights)
            model = model.to(dtype)
            models.append(model if fused is None else make_fast(model, pack_linears=False, fused_kernels=fused))
        reference, fast, fused = models
        # float32: against the reference mode, as tests/test_fast_agreement.py; bfloat16: against the fast mode
        # without fused ops (what the kernels themselves add, as its bf16 tests).
        baseline = reference if dtype == torch.float32 else fast
        for kernel in KERNELS if with_wrong else ("right",):
            chosen[0] = kernel
            with torch.inference_mode():
                worst = max(disagreement(fused(x.to(dtype))[0], baseline(x.to(dtype))[0]) for x in inputs)
            suffix = "" if kernel == "right" else "/wrong_swapped_halves"
            figures[f"{name}/{dtype_name}{suffix}"] = worst
        chosen[0] = "right"
    return figures


if __name__ == "__main__":
    torch.manual_seed(0)
    if sys.argv[1:] == ["ops"]:
        print(json.dumps(op_figures()))
    elif sys.argv[1:] == ["backbones"]:
        use_kernels_on_cpu()
        print(json.dumps(backbone_figures()))
    else:
        sys.exit("usage: python tests/fused_interpreter.py ops|backbones")
