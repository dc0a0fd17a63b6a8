"""The fast mode of a Sapiens2 network: the same weights, rearranged for speed, in place (issue #11).

``make_fast(model)`` turns a loaded backbone or task model into its fast form:

- one fused ``wqkv`` projection per attention instead of ``wq``/``wk``/``wv`` (the state dict keeps the official
  keys: ``state_dict`` splits the fused tensors, ``load_state_dict`` joins them); GQA runs inside SDPA without
  repeated K/V (``enable_gqa``); the FFN's gate/up projection ``w12`` is fused in the official layout already;
- RoPE sin/cos tables cached per token grid (``RopePositionEmbedding.cache_tables``);
- on CPU, optionally (``pack_linears``), every linear layer of the blocks runs through oneDNN with its weight
  reordered once into oneDNN's blocked layout (``PackedLinear``); MKL's ``addmm`` is the default otherwise.

The fast mode keeps the model's numerics recipe (bf16 RoPE, op order of each block) and moves results only in the
last bits of float32 (different GEMM shapes and kernels); ``tests/test_fast_agreement.py`` bounds the movement on the
parity fixtures. The reference mode is the model as loaded: nothing here runs unless asked.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from .layers import Attention, RopePositionEmbedding, SwiGLUFFN

__all__ = ["PackedLinear", "is_fast", "make_fast", "onednn_linear_available"]

logger = logging.getLogger(__name__)


def onednn_linear_available() -> bool:
    """True when this torch build has oneDNN (``mkldnn``) with the prepacked linear ops used by ``PackedLinear``."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (
        torch.backends.mkldnn.is_available()
        and ops is not None
        and hasattr(ops, "_linear_pointwise")
        and hasattr(ops, "_reorder_linear_weight")
    )


class PackedLinear(nn.Module):
    """A CPU ``nn.Linear`` that multiplies through oneDNN's brgemm with a weight reordered once (inference only).

    ``weight``/``bias`` stay the ordinary parameters (same state-dict keys and values); ``packed`` is a non-persistent
    copy of the weight in oneDNN's blocked layout, so the layer holds its weight twice. A float32 ``addmm`` goes
    through MKL and runs below oneDNN's AVX-512 brgemm on the same shapes; bf16 skips a weight reorder per call.
    The packed copy is made for ``batch_hint`` rows and serves any row count.
    """

    def __init__(self, linear: nn.Linear, batch_hint: int = 1024) -> None:
        super().__init__()
        if linear.weight.device.type != "cpu":
            raise ValueError(f"PackedLinear runs on CPU only; this weight is on {linear.weight.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), batch_hint)
        self.register_buffer("packed", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dtype != self.packed.dtype:
            return F.linear(x, self.weight, self.bias)  # training or a dtype change: the plain path
        leading = x.shape[:-1]
        # oneDNN takes a 2-D row-major input: (..., in) -> (rows, in) -> (rows, out) -> (..., out)
        out = torch.ops.mkldnn._linear_pointwise(
            x.reshape(-1, self.in_features).contiguous(), self.packed, self.bias, "none", [], ""
        )
        return out.reshape(*leading, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN packed"


def is_fast(model: nn.Module) -> bool:
    """True when ``make_fast`` has run on ``model`` (or the model has no attention to fuse)."""
    return all(module.fused for module in model.modules() if isinstance(module, Attention))


def _pack_block_linears(model: nn.Module) -> int:
    """Swap the linear layers inside attention and FFN modules for ``PackedLinear``; returns how many."""
    count = 0
    for module in list(model.modules()):
        if not isinstance(module, (Attention, SwiGLUFFN)):
            continue
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PackedLinear(child))
                count += 1
    return count


@torch.no_grad()
def make_fast(model: nn.Module, *, pack_linears: bool | None = None) -> nn.Module:
    """Turn ``model`` (a ``Sapiens2`` backbone, a ``TaskModel`` or anything holding them) into its fast form, in place.

    Args:
        model: the loaded network, on its final device and dtype (move it first: packed weights do not move).
        pack_linears: route the blocks' linear layers through oneDNN with prepacked weights (``PackedLinear``).
            None: on when the model is on the CPU and oneDNN is available. Costs a second copy of those weights.

    Returns:
        ``model`` itself. Calling it twice is harmless.

    Example:
        >>> model = make_fast(load_model("seg", "1b").eval())
        >>> logits = model(images)  # same keys in model.state_dict(), last-bit differences in the outputs
    """
    for module in model.modules():
        if isinstance(module, Attention):
            module.fuse_qkv()
        elif isinstance(module, RopePositionEmbedding):
            module.cache_tables = True
    parameter = next(model.parameters(), None)
    on_cpu = parameter is not None and parameter.device.type == "cpu"
    if pack_linears is None:
        pack_linears = on_cpu and onednn_linear_available()
    if pack_linears:
        if not on_cpu or not onednn_linear_available():
            raise ValueError("pack_linears needs a CPU model and a torch build with oneDNN")
        logger.debug("packed %d linear layers for oneDNN", _pack_block_linears(model))
    return model
