"""Multi-head / grouped-query self-attention with QK-norm and RoPE (MODEL.md §1.3 "Attention").

Two paths side by side: the reference path (separate ``wq``/``wk``/``wv``, repeat-interleaved GQA: the official op
order) and the fused fast path (``fuse_qkv``: one projection, GQA inside SDPA without repeated K/V; with
``fused_kernels`` also q/k-norm + RoPE as one op, ``fused.qk_norm_rope``). The fused module still reads and writes the
official ``wq``/``wk``/``wv`` keys (state-dict hooks split and join the fused tensors).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .fused import qk_norm_rope
from .layer_scale import LayerScale
from .norm import RMSNorm
from .rope import apply_rope, apply_rope_fast


class Attention(nn.Module):
    """Self-attention with separate ``wq``/``wk``/``wv`` projections (the checkpoint layout).

    ``num_kv_heads < num_heads`` gives grouped-query attention: kv head j serves query heads j*r ... j*r+r-1
    (repeat-interleave). QK-norm is one RMSNorm over the head dim shared by all heads; LayerScale (``gamma``)
    multiplies the projected output.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        *,
        qk_norm: bool = True,
        layer_scale_init: float | None = 1e-4,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        num_kv_heads = num_kv_heads or num_heads
        if dim % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"dim {dim} / heads {num_heads} / kv heads {num_kv_heads} do not divide evenly")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = dim // num_heads
        kv_dim = num_kv_heads * self.head_dim
        factory = {"device": device, "dtype": dtype}
        self.wq = nn.Linear(dim, dim, bias=True, **factory)
        self.wk = nn.Linear(dim, kv_dim, bias=True, **factory)
        self.wv = nn.Linear(dim, kv_dim, bias=True, **factory)
        self.q_norm = RMSNorm(self.head_dim, **factory) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, **factory) if qk_norm else None
        self.proj = nn.Linear(dim, dim, bias=True, **factory)
        self.gamma = LayerScale(dim, layer_scale_init, **factory) if layer_scale_init is not None else None
        # Fast mode only (``make_fast(..., fused_kernels=True)``, after ``fuse_qkv``): q/k-norm + RoPE as one fused op.
        self.fused_kernels = False

    @property
    def fused(self) -> bool:
        return hasattr(self, "wqkv")

    @torch.no_grad()
    def fuse_qkv(self) -> None:
        """Replace ``wq``/``wk``/``wv`` by one ``wqkv`` projection (rows: q, then k, then v), in place.

        The state dict keeps the official layout: ``state_dict()`` returns the three projections split off (copies,
        so a checkpoint writer sees no shared storage) and ``load_state_dict`` takes the three and joins them.
        """
        if self.fused:
            return
        projections = (self.wq, self.wk, self.wv)
        weight = torch.cat([p.weight for p in projections])
        bias = torch.cat([p.bias for p in projections])
        self.wqkv = nn.Linear(weight.shape[1], weight.shape[0], bias=True, device="meta", dtype=weight.dtype)
        self.wqkv.weight = nn.Parameter(weight, requires_grad=self.wq.weight.requires_grad)
        self.wqkv.bias = nn.Parameter(bias, requires_grad=self.wq.bias.requires_grad)
        del self.wq, self.wk, self.wv
        self.register_state_dict_post_hook(_split_qkv_state)
        self.register_load_state_dict_pre_hook(_join_qkv_state)

    def _qkv_sizes(self) -> list[int]:
        kv_dim = self.num_kv_heads * self.head_dim
        return [self.num_heads * self.head_dim, kv_dim, kv_dim]

    def _split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        batch, tokens, _ = x.shape
        return x.reshape(batch, tokens, heads, self.head_dim).transpose(1, 2)  # (B, N, h*hd) -> (B, h, N, hd)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        x = self.attend(x, rope)
        return self.gamma(x) if self.gamma is not None else x

    def attend(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The attention branch up to ``proj``, before LayerScale (which a fused block folds into its residual add)."""
        if self.fused:
            return self._attend_fused(x, rope)
        batch, tokens, dim = x.shape
        q = self._split_heads(self.wq(x), self.num_heads)
        k = self._split_heads(self.wk(x), self.num_kv_heads)
        v = self._split_heads(self.wv(x), self.num_kv_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            sin, cos = rope
            q, k = apply_rope(q, sin, cos), apply_rope(k, sin, cos)
        if self.num_kv_heads != self.num_heads:
            repeats = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(repeats, dim=1)
            v = v.repeat_interleave(repeats, dim=1)
        x = F.scaled_dot_product_attention(q, k, v)
        x = x.transpose(1, 2).reshape(batch, tokens, dim)  # (B, h, N, hd) -> (B, N, D)
        return self.proj(x)

    def _attend_fused(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        batch, tokens, dim = x.shape
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = self.wqkv(x)
        if self.fused_kernels and self.q_norm is not None and rope is not None and rope[0].dim() == 2:
            q, k, v = qk_norm_rope(qkv, self.q_norm.weight, self.k_norm.weight, rope, num_heads=heads,
                                   num_kv_heads=kv_heads, eps=self.q_norm.eps)  # fmt: skip
        else:
            qkv = qkv.view(batch, tokens, heads + 2 * kv_heads, self.head_dim)
            q, k, v = qkv.transpose(1, 2).split([heads, kv_heads, kv_heads], dim=1)  # (B, h|kv|kv, N, hd) views
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            if rope is not None:
                sin, cos = rope
                q, k = apply_rope_fast(q, sin, cos), apply_rope_fast(k, sin, cos)
        # GQA inside SDPA: query head j*r ... j*r+r-1 reads kv head j, the same grouping as repeat_interleave.
        x = F.scaled_dot_product_attention(q, k, v, enable_gqa=kv_heads != heads)
        x = x.transpose(1, 2).reshape(batch, tokens, dim)  # (B, h, N, hd) -> (B, N, D)
        return self.proj(x)


_QKV = ("wq", "wk", "wv")


def _split_qkv_state(module: Attention, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """State-dict post-hook of a fused module: ``wqkv.*`` -> the official ``wq.*``, ``wk.*``, ``wv.*`` (copies)."""
    split = {}
    for name in _QKV:
        for suffix in ("weight", "bias"):
            index = _QKV.index(name)
            split[f"{prefix}{name}.{suffix}"] = state_dict[f"{prefix}wqkv.{suffix}"].split(module._qkv_sizes())[index]
    # Put the three projections first among this module's entries, where the official layout has them.
    items = [(k, v) for k, v in state_dict.items() if not k.startswith(f"{prefix}wqkv.")]
    first = next(i for i, (key, _) in enumerate(items) if key.startswith(prefix))
    state_dict.clear()
    state_dict.update(items[:first])
    state_dict.update({key: value.clone() for key, value in split.items()})
    state_dict.update(items[first:])


def _join_qkv_state(module: Attention, state_dict: dict, prefix: str, *args) -> None:
    """Load pre-hook of a fused module: the official ``wq/wk/wv.*`` tensors of a checkpoint -> ``wqkv.*``."""
    for suffix in ("weight", "bias"):
        keys = [f"{prefix}{name}.{suffix}" for name in _QKV]
        if all(key in state_dict for key in keys):
            state_dict[f"{prefix}wqkv.{suffix}"] = torch.cat([state_dict.pop(key) for key in keys])
