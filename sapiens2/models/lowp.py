"""Low-precision linear layers through torchao (issue #11 point 3): FP8 on GPUs that have it, int8 anywhere.

``quantize(model, "fp8")`` replaces the weights of the transformer blocks' linear layers (attention and FFN
projections, most of the FLOPs) with torchao's quantized tensors, in place; the patch embedding, the norms and the
task heads stay in the model's dtype. Kinds (``QUANTIZATIONS``):

- ``fp8``: float8 (e4m3) weights and activations, scaled per row, multiplied by the FP8 tensor cores
  (``torch._scaled_mm``). Needs a CUDA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell).
- ``int8``: int8 weights (per channel) and int8 activations (per token, dynamic).
- ``int8-weight``: int8 weights only, dequantized on the fly (saves memory; speed depends on the kernels).

A quantized model is for inference: its state dict holds torchao tensors, not the official layout. Load, move to
the device and dtype (bf16 for ``fp8``), ``make_fast`` if wanted, then quantize. torchao is the optional extra
``pip install 'sapiens2[lowp]'``.
"""

from __future__ import annotations

import functools

from torch import nn

from ..messages import library_noise_muted

__all__ = ["QUANTIZATIONS", "int8_activations_exact", "quantize"]

QUANTIZATIONS = ("fp8", "int8", "int8-weight")


def _torchao():
    try:
        with library_noise_muted():  # torchao's import names each CUDA library a CPU build cannot load
            import torchao.quantization as quantization
    except ImportError as error:
        raise ImportError("quantization needs torchao, which is not installed: pip install 'sapiens2[lowp]'") from error
    return quantization


def _block_linear(module: nn.Module, name: str) -> bool:
    """The quantize_ filter: linear layers inside the transformer blocks (``blocks.N....``), not the heads."""
    return isinstance(module, nn.Linear) and (".blocks." in f".{name}" or name.startswith("blocks."))


@functools.cache
def int8_activations_exact(device: str = "cpu") -> bool:
    """Whether ``int8`` (int8 activations times int8 weights) sums without overflow on ``device``, found once by
    running it on a layer whose sums a 16-bit accumulator cannot hold.

    oneDNN's int8 GEMM on a CPU without VNNI (AVX2 only: AMD Zen 3, Intel before Cascade Lake) multiplies unsigned
    by signed bytes with ``vpmaddubsw``, whose pairwise 16-bit sums saturate: the parity seg model's logits then
    move 27 % (mean) instead of 4 %, three labels in four kept. The probe: 256 inputs of 1 against weights of 1 and
    0.5 is exact in int8 (127 each) yet overflows such sums (0.66 relative error under ``ONEDNN_MAX_CPU_ISA=AVX2``,
    0.005 with VNNI).
    """
    import torch

    quantization = _torchao()
    layer = nn.Sequential(nn.Linear(256, 8, bias=False)).to(device)
    with torch.no_grad():
        layer[0].weight.fill_(1.0)[:, 1::2] = 0.5
        x = torch.ones(4, 256, device=device)
        want = layer(x)
        quantization.quantize_(layer, quantization.Int8DynamicActivationInt8WeightConfig())
        got = layer(x)
    return float((got - want).abs().max() / want.abs().max()) < 0.05


def quantize(model: nn.Module, kind: str) -> nn.Module:
    """Quantize the transformer blocks' linear layers of ``model`` in place (see the module docstring).

    Args:
        model: a backbone or task model on its final device and dtype, in eval mode.
        kind: one of ``QUANTIZATIONS``.

    Returns:
        ``model`` itself.

    Raises:
        ValueError: an unknown kind, ``fp8`` on a device without FP8 tensor cores, ``int8`` where its sums overflow
            (``int8_activations_exact``: CPUs without VNNI), or a model without blocks.
        ImportError: torchao is not installed.
    """
    if kind not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {kind!r}")
    parameter = next(model.parameters(), None)
    if parameter is None or not any(_block_linear(m, n) for n, m in model.named_modules()):
        raise ValueError("nothing to quantize: the model has no transformer-block linear layers")
    if kind == "fp8":
        import torch

        device = parameter.device
        if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
            where = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
            raise ValueError(
                f"fp8 needs a CUDA GPU with FP8 tensor cores (compute capability 8.9+: Ada, Hopper, Blackwell); "
                f"the model is on {where}. Use int8 or int8-weight instead"
            )
    if kind == "int8" and parameter.device.type == "cpu" and not int8_activations_exact():
        raise ValueError(
            "int8 on this CPU: its int8 kernels sum in 16 bits that overflow (no VNNI: AVX2 only, e.g. AMD Zen 3), "
            "which moves the outputs by ~30 %. Use int8-weight (int8 weights, float activations) instead"
        )
    quantization = _torchao()
    config = {
        "fp8": lambda: quantization.Float8DynamicActivationFloat8WeightConfig(granularity=quantization.PerRow()),
        "int8": quantization.Int8DynamicActivationInt8WeightConfig,
        "int8-weight": quantization.Int8WeightOnlyConfig,
    }[kind]()
    quantization.quantize_(model, config, filter_fn=_block_linear)
    return model
