"""Triton kernels behind the fused ops of ``fused.py``, each with its launcher (issue #25).

Imported only when a fused op runs on CUDA (or by the tests, on CPU tensors under ``TRITON_INTERPRET=1``): importing
``sapiens2`` never imports Triton. Each kernel keeps the reference layers' numerics recipe: every value is rounded to
the dtype the reference op would store it in (the model dtype, or bf16 inside the bf16 RoPE of MODEL.md §1.4), with
the arithmetic in float32 between roundings. Rounding to bf16 is done with integer ops (round to nearest, ties to
even) rather than a float cast, because Triton's interpreter truncates in that cast while GPUs round; and the
launchers turn off the contraction of a multiply and an add into one FMA, which would skip a rounding the reference
makes. What remains different from torch is the order of the sum of squares and the last bit of ``exp``.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError as error:  # fused.py checks first; this is for a direct import
    raise ImportError("the fused GPU kernels need Triton: pip install triton (torch's CUDA wheels ship it)") from error

__all__ = ["launch_qk_norm_rope", "launch_scale_add", "launch_silu_mul"]

# How each kernel rounds its stored values: 0 keeps float32, 1 rounds to bfloat16, 2 to float16.
ROUNDING = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# Launch options of every kernel: no a * b + c -> fma(a, b, c) contraction (the reference rounds a * b first).
LAUNCH_OPTIONS = {"enable_fp_fusion": False}


@triton.jit
def _round_to(x, KIND: tl.constexpr):
    """Round float32 values as a store in the dtype coded by ``KIND`` (``ROUNDING``) would; kept in float32.

    bfloat16 (KIND 1): add half a bf16 step (minus one unless the kept last bit is odd: ties to even) and drop the
    16 low bits. Finite inputs only.
    """
    if KIND == 1:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    elif KIND == 2:
        x = x.to(tl.float16).to(tl.float32)
    return x


@triton.jit
def _qk_norm_rope_kernel(
    qkv_ptr,
    q_weight_ptr,
    k_weight_ptr,
    sin_ptr,
    cos_ptr,
    q_ptr,
    k_ptr,
    tokens,
    num_prefix,
    stride_batch,
    stride_token,
    eps,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    OUT_KIND: tl.constexpr,
    ROPE_KIND: tl.constexpr,
):
    """One program: BLOCK_T tokens of one q or k head. Grid: (batch * token blocks, NUM_HEADS + NUM_KV_HEADS).

    RoPE pairs dimension j with j + hd/2 (MODEL.md §1.4 "Application"): each tile is loaded twice, as itself (x) and
    with its halves swapped (partner), so rotate_half(x) = sign * partner with sign -1 on the first half.
    """
    HALF: tl.constexpr = HEAD_DIM // 2
    blocks = tl.cdiv(tokens, BLOCK_T)
    batch = (tl.program_id(0) // blocks).to(tl.int64)
    token = (tl.program_id(0) % blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)  # q heads first, then k heads: the order of wqkv's output rows
    dim = tl.arange(0, HEAD_PAD)
    first_half = dim < HALF
    partner = tl.where(first_half, dim + HALF, dim - HALF)
    token_ok = token < tokens
    mask = token_ok[:, None] & (dim < HEAD_DIM)[None, :]

    source = qkv_ptr + batch * stride_batch + token[:, None] * stride_token + head * HEAD_DIM
    x = tl.load(source + dim[None, :], mask=mask, other=0.0).to(tl.float32)
    x_partner = tl.load(source + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    if head < NUM_HEADS:
        weight_ptr = q_weight_ptr
        out_ptr = q_ptr + ((batch * NUM_HEADS + head) * tokens) * HEAD_DIM
    else:
        weight_ptr = k_weight_ptr
        out_ptr = k_ptr + ((batch * NUM_KV_HEADS + head - NUM_HEADS) * tokens) * HEAD_DIM
    weight = tl.load(weight_ptr + dim, mask=dim < HEAD_DIM, other=0.0).to(tl.float32)
    weight_partner = tl.load(weight_ptr + partner, mask=dim < HEAD_DIM, other=0.0).to(tl.float32)

    # q_norm / k_norm as torch's rms_norm: float32 throughout, x * rsqrt(mean(x^2) + eps) * w with mean = sum * (1/hd)
    # and rsqrt as 1 / sqrt, both correctly rounded (Triton's rsqrt is an approximation); one rounding to the model
    # dtype at the end.
    mean_square = tl.sum(x * x, axis=1) * (1.0 / HEAD_DIM)
    inverse = tl.math.div_rn(tl.full(mean_square.shape, 1.0, tl.float32), tl.math.sqrt_rn(mean_square + eps))
    y = _round_to(x * inverse[:, None] * weight[None, :], OUT_KIND)
    y_partner = _round_to(x_partner * inverse[:, None] * weight_partner[None, :], OUT_KIND)

    # RoPE (MODEL.md §1.4): the whole head, prefix tokens too, is cast to the table dtype (ROPE_KIND); each product
    # and the sum are rounded there, as apply_rope does: out = x * cos + rotate_half(x) * sin, where
    # rotate_half(x) * sin rounds as -(x2 * s1) on the first half, so the sum rounds as apply_rope_fast's difference.
    y = _round_to(y, ROPE_KIND)
    y_partner = _round_to(y_partner, ROPE_KIND)
    row = token - num_prefix  # table row of a patch token; negative for the prefix tokens, which are not rotated
    rotated = token_ok & (row >= 0)
    table = row[:, None] * HEAD_DIM + dim[None, :]
    table_mask = rotated[:, None] & (dim < HEAD_DIM)[None, :]
    sin = tl.load(sin_ptr + table, mask=table_mask, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + table, mask=table_mask, other=1.0).to(tl.float32)
    rotate_half = tl.where(first_half[None, :], -y_partner, y_partner)
    out = _round_to(_round_to(y * cos, ROPE_KIND) + _round_to(rotate_half * sin, ROPE_KIND), ROPE_KIND)
    out = _round_to(tl.where(rotated[:, None], out, y), OUT_KIND)  # back to the model dtype

    target = out_ptr + token[:, None] * HEAD_DIM + dim[None, :]  # (B, heads, N, hd) contiguous
    tl.store(target, out.to(out_ptr.dtype.element_ty), mask=mask)


def launch_qk_norm_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    sin: torch.Tensor,
    cos: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    eps: float,
    *,
    block_tokens: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q/k RMSNorm + RoPE over a fused projection's output in one kernel; see ``fused.qk_norm_rope``.

    qkv (B, N, (h + 2 kv) * hd) with unit stride on the last dimension; tables (P, hd), P <= N. Returns q (B, h, N, hd)
    and k (B, kv, N, hd), new contiguous tensors in qkv's dtype.
    """
    batch, tokens, _ = qkv.shape
    head_dim = q_weight.shape[0]
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    q = qkv.new_empty(batch, num_heads, tokens, head_dim)
    k = qkv.new_empty(batch, num_kv_heads, tokens, head_dim)
    blocks = triton.cdiv(tokens, block_tokens)
    grid = (batch * blocks, num_heads + num_kv_heads)
    _qk_norm_rope_kernel[grid](
        qkv,
        q_weight.contiguous(),
        k_weight.contiguous(),
        sin.contiguous(),
        cos.contiguous(),
        q,
        k,
        tokens,
        tokens - sin.shape[0],
        qkv.stride(0),
        qkv.stride(1),
        eps,
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEAD_PAD=triton.next_power_of_2(head_dim),
        BLOCK_T=block_tokens,
        OUT_KIND=ROUNDING[qkv.dtype],
        ROPE_KIND=ROUNDING[sin.dtype],
        **LAUNCH_OPTIONS,
    )
    return q, k


@triton.jit
def _silu_mul_kernel(
    hidden_ptr, out_ptr, rows, width, stride_row, OUT_KIND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr
):
    """One program: a BLOCK_M x BLOCK_F tile of the output. Grid: (row blocks, column blocks). Each input row is
    [gate, up], F columns each."""
    row = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    column = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    ok = (row < rows)[:, None] & (column < width)[None, :]
    source = hidden_ptr + row[:, None] * stride_row + column[None, :]
    gate = tl.load(source, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(source + width, mask=ok, other=0.0).to(tl.float32)
    # F.silu computes x / (1 + exp(-x)) in float32 and stores it in the model dtype; the product is rounded again.
    activated = _round_to(gate / (1.0 + tl.exp(-gate)), OUT_KIND)
    out = _round_to(activated * up, OUT_KIND)
    tl.store(out_ptr + row[:, None] * width + column[None, :], out.to(out_ptr.dtype.element_ty), mask=ok)


def launch_silu_mul(hidden: torch.Tensor, *, block_rows: int = 16, block_columns: int = 256) -> torch.Tensor:
    """SiLU(gate) * up for hidden (..., 2F) = [gate, up]; returns a new contiguous (..., F) tensor."""
    width = hidden.shape[-1] // 2
    rows = hidden.reshape(-1, hidden.shape[-1])  # (..., 2F) -> (M, 2F), a view when the input allows it
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = hidden.new_empty(*hidden.shape[:-1], width)
    if rows.shape[0]:
        grid = (triton.cdiv(rows.shape[0], block_rows), triton.cdiv(width, block_columns))
        _silu_mul_kernel[grid](
            rows, out, rows.shape[0], width, rows.stride(0), OUT_KIND=ROUNDING[hidden.dtype], BLOCK_M=block_rows,
            BLOCK_F=block_columns, **LAUNCH_OPTIONS,
        )  # fmt: skip
    return out


@triton.jit
def _scale_add_kernel(
    x_ptr, y_ptr, scale_ptr, out_ptr, rows, width, OUT_KIND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr
):
    """out = x + y * scale, scale per column; one program per BLOCK_M x BLOCK_D tile of the (rows, D) tensors."""
    row = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    column = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ok = (row < rows)[:, None] & (column < width)[None, :]
    index = row[:, None] * width + column[None, :]
    x = tl.load(x_ptr + index, mask=ok, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + index, mask=ok, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr + column, mask=column < width, other=0.0).to(tl.float32)
    # LayerScale stores y * gamma in the model dtype; the residual add rounds once more.
    out = _round_to(x + _round_to(y * scale[None, :], OUT_KIND), OUT_KIND)
    tl.store(out_ptr + index, out.to(out_ptr.dtype.element_ty), mask=ok)


def launch_scale_add(
    x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, *, block_rows: int = 16, block_columns: int = 256
) -> torch.Tensor:
    """x + y * scale for x, y (..., D) and scale (D,), all of one dtype; returns a new contiguous tensor."""
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    if rows:
        grid = (triton.cdiv(rows, block_rows), triton.cdiv(width, block_columns))
        _scale_add_kernel[grid](
            x, y, scale.contiguous(), out, rows, width, OUT_KIND=ROUNDING[x.dtype], BLOCK_M=block_rows,
            BLOCK_D=block_columns, **LAUNCH_OPTIONS,
        )  # fmt: skip
    return out
