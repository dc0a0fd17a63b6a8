"""Fused ops of the fast mode (issue #25): q/k RMSNorm + RoPE, SiLU(gate) * up, LayerScale + residual add.

Each op is a ``torch.library.custom_op`` (``torch.ops.sapiens2.*``) whose default implementation is the reference
layers' own torch ops (``F.rms_norm`` as ``RMSNorm``, ``apply_rope_fast``, ``F.silu``, ``x + y * gamma``), and whose
CUDA implementation launches a Triton kernel from ``triton_kernels.py`` with the same numerics recipe. A fake
implementation gives ``torch.compile`` the output shapes, so compiled graphs call the ops as they are (eager CUDA
calls skip the dispatcher and launch the kernels directly). Triton is imported only when a CUDA implementation first
runs; without it, or if a kernel fails to launch (a warning says so once), and on any other device, the ops run their
reference implementation. The layers call these ops only when ``make_fast(..., fused_kernels=True)`` set their
``fused_kernels`` flag: reference mode never does. Inference only: under autograd the wrappers below run the
reference composition instead (the ops have no backward).
"""

from __future__ import annotations

import importlib.util
import logging

import torch
import torch.nn.functional as F

from .rope import apply_rope_fast

__all__ = ["KERNEL_DTYPES", "qk_norm_rope", "scale_add", "silu_mul", "triton_available"]

logger = logging.getLogger(__name__)


def triton_available() -> bool:
    """True when Triton is installed (found without importing it)."""
    return importlib.util.find_spec("triton") is not None


def _needs_autograd(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _split_qkv(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int) -> tuple[torch.Tensor, ...]:
    batch, tokens, _ = qkv.shape
    heads = qkv.view(batch, tokens, num_heads + 2 * num_kv_heads, head_dim).transpose(1, 2)  # (B, h+2kv, N, hd)
    return heads.split([num_heads, num_kv_heads, num_kv_heads], dim=1)  # views


def _qk_norm_rope_reference(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    sin: torch.Tensor,
    cos: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    head_dim = q_weight.shape[0]
    q, k, _ = _split_qkv(qkv, num_heads, num_kv_heads, head_dim)
    # RMSNorm.forward on each head, then the bf16 (or fp32) RoPE of rope.py: the unfused fast path's ops, in order.
    q = apply_rope_fast(F.rms_norm(q, (head_dim,), q_weight, eps), sin, cos)
    k = apply_rope_fast(F.rms_norm(k, (head_dim,), k_weight, eps), sin, cos)
    return q.contiguous(), k.contiguous()


@torch.library.custom_op("sapiens2::qk_norm_rope", mutates_args=())
def _qk_norm_rope_op(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    sin: torch.Tensor,
    cos: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _qk_norm_rope_reference(qkv, q_weight, k_weight, sin, cos, num_heads, num_kv_heads, eps)


@_qk_norm_rope_op.register_fake
def _(qkv, q_weight, k_weight, sin, cos, num_heads, num_kv_heads, eps):
    batch, tokens, _ = qkv.shape
    head_dim = q_weight.shape[0]
    return qkv.new_empty(batch, num_heads, tokens, head_dim), qkv.new_empty(batch, num_kv_heads, tokens, head_dim)


def _silu_mul_reference(hidden: torch.Tensor) -> torch.Tensor:
    gate, up = hidden.chunk(2, dim=-1)  # SwiGLUFFN: the first half of w12's output is the gate
    return (F.silu(gate) * up).contiguous()


def _scale_add_reference(x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x + y * scale).contiguous()  # LayerScale's multiply, then the block's residual add


@torch.library.custom_op("sapiens2::silu_mul", mutates_args=())
def _silu_mul_op(hidden: torch.Tensor) -> torch.Tensor:
    return _silu_mul_reference(hidden)


@_silu_mul_op.register_fake
def _(hidden):
    return hidden.new_empty(*hidden.shape[:-1], hidden.shape[-1] // 2)


@torch.library.custom_op("sapiens2::scale_add", mutates_args=())
def _scale_add_op(x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return _scale_add_reference(x, y, scale)


@_scale_add_op.register_fake
def _(x, y, scale):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


_TRITON_FAILURES: dict[str, str] = {}  # op name -> the error of its first failed launch; it runs the reference then
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the kernels store (others: the reference)


def _launch(name: str, launch_name: str, reference, *args):
    """Run the Triton launcher ``launch_name`` on CUDA tensors; if it ever fails (an old GPU, a Triton without a
    feature), warn once and run the reference implementation for this op from then on."""
    if name not in _TRITON_FAILURES and args[0].dtype in KERNEL_DTYPES:
        try:
            from . import triton_kernels

            return getattr(triton_kernels, launch_name)(*args)
        except torch.OutOfMemoryError:
            raise  # not the kernel's fault: the reference would not fit either
        except Exception as error:  # whatever stops the kernel (compiler, driver), the reference still runs
            _TRITON_FAILURES[name] = f"{type(error).__name__}: {error}"
            logger.warning("fused op %s: the Triton kernel failed (%s); using the torch reference ops", name, error)
    return reference(*args)


@_qk_norm_rope_op.register_kernel("cuda")
def _qk_norm_rope_cuda(qkv, q_weight, k_weight, sin, cos, num_heads, num_kv_heads, eps):
    args = (qkv, q_weight, k_weight, sin, cos, num_heads, num_kv_heads, eps)
    return _launch("qk_norm_rope", "launch_qk_norm_rope", _qk_norm_rope_reference, *args)


@_silu_mul_op.register_kernel("cuda")
def _silu_mul_cuda(hidden):
    return _launch("silu_mul", "launch_silu_mul", _silu_mul_reference, hidden)


@_scale_add_op.register_kernel("cuda")
def _scale_add_cuda(x, y, scale):
    return _launch("scale_add", "launch_scale_add", _scale_add_reference, x, y, scale)


def _eager_cuda(tensor: torch.Tensor) -> bool:
    """Eager calls on CUDA go straight to the CUDA implementation: a custom op's Python dispatch layers cost tens of
    microseconds per call, as much as a small kernel runs. Traced (compiled) code calls the ops."""
    return tensor.is_cuda and not torch.compiler.is_compiling()


def qk_norm_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    *,
    num_heads: int,
    num_kv_heads: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q_norm and k_norm (RMSNorm over the head dim) then RoPE on q and k, straight from a fused QKV projection.

    Args:
        qkv: (B, N, (h + 2 kv) * hd), the ``wqkv`` output (rows q, k, v).
        q_weight, k_weight: the (hd,) RMSNorm weights, in qkv's dtype.
        rope: (sin, cos) tables, each (P, hd) in the RoPE dtype; the first N - P tokens (prefix) are not rotated.
        eps: the RMSNorm epsilon (1e-6).

    Returns:
        q (B, h, N, hd) and k (B, kv, N, hd), new contiguous tensors in qkv's dtype, ready for SDPA; v (B, kv, N, hd),
        a view of qkv. Same rounding at every step as ``Attention``'s unfused fast path (MODEL.md §1.4).
    """
    sin, cos = rope
    batch, tokens, width = qkv.shape
    head_dim = q_weight.shape[0]
    if width != (num_heads + 2 * num_kv_heads) * head_dim or sin.shape != cos.shape or sin.shape[-1] != head_dim:
        raise ValueError(
            f"qk_norm_rope: qkv {tuple(qkv.shape)}, tables {tuple(sin.shape)} do not fit {num_heads} q and "
            f"{num_kv_heads} kv heads of {head_dim} dims"
        )
    v = _split_qkv(qkv, num_heads, num_kv_heads, head_dim)[2]
    args = (qkv, q_weight, k_weight, sin, cos, num_heads, num_kv_heads, eps)
    fusable = sin.dim() == 2 and sin.shape[0] <= tokens and q_weight.dtype == k_weight.dtype == qkv.dtype
    if not fusable or _needs_autograd(qkv, q_weight, k_weight):
        return (*_qk_norm_rope_reference(*args), v)
    return (*(_qk_norm_rope_cuda if _eager_cuda(qkv) else _qk_norm_rope_op)(*args), v)


def silu_mul(hidden: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for hidden (..., 2F) = [gate, up] (SwiGLU's middle); a new (..., F) tensor."""
    if _needs_autograd(hidden):
        return _silu_mul_reference(hidden)
    return (_silu_mul_cuda if _eager_cuda(hidden) else _silu_mul_op)(hidden)


def scale_add(x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The residual add after LayerScale, ``x + y * scale`` (scale (D,) over the last dim), as one op."""
    if _needs_autograd(x, y, scale) or not x.dtype == y.dtype == scale.dtype or x.shape != y.shape:
        return x + y * scale
    return (_scale_add_cuda if _eager_cuda(x) else _scale_add_op)(x.contiguous(), y.contiguous(), scale)
