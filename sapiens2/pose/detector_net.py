"""RTMDet-m network (CSPNeXt-P5 backbone, CSPNeXtPAFPN neck, RTMDetSepBNHead), 1 class, in plain PyTorch.

Implements DETECTOR.md §3. Module attribute names are the official mmdet state-dict names (Appendix A), so the
published checkpoint loads with ``load_state_dict(strict=True)``. Tensors are NCHW float32; the network input is a
normalised **BGR** batch (B, 3, 640, 640) (DETECTOR.md §2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["HEAD_STRIDES", "RTMDet", "fuse_batchnorm"]

HEAD_STRIDES: tuple[int, int, int] = (8, 16, 32)
# DETECTOR.md §3: the config's SyncBN carries no eps, so PyTorch's 1e-5 applies (not RTMDet's class default 1e-3).
BN_EPS = 1e-5


class ConvModule(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d (eps 1e-5) -> SiLU; mmcv's ``ConvModule`` with this config (spec §0).

    After :func:`fuse_batchnorm` the BN is folded into ``conv`` (which then has a bias) and ``bn`` is an Identity.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        groups: int = 1,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel_size, stride, kernel_size // 2, groups=groups, bias=False, **factory
        )
        self.bn: nn.Module = nn.BatchNorm2d(out_channels, eps=BN_EPS, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.bn(self.conv(x)))


class DepthwiseSeparableConv(nn.Module):
    """k×k depthwise ConvModule then 1×1 pointwise ConvModule, each with its own BN and SiLU (spec §0 "DWSep")."""

    def __init__(self, channels: int, kernel_size: int, **factory) -> None:
        super().__init__()
        self.depthwise_conv = ConvModule(channels, channels, kernel_size, groups=channels, **factory)
        self.pointwise_conv = ConvModule(channels, channels, 1, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise_conv(self.depthwise_conv(x))


class CSPNeXtBlock(nn.Module):
    """Regular 3×3 ConvModule, then a 5×5 depthwise-separable conv, plus an optional residual (spec §3.1)."""

    def __init__(self, channels: int, add_identity: bool, **factory) -> None:
        super().__init__()
        self.add_identity = add_identity
        self.conv1 = ConvModule(channels, channels, 3, **factory)
        self.conv2 = DepthwiseSeparableConv(channels, 5, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(self.conv1(x))
        return out + x if self.add_identity else out


class ChannelAttention(nn.Module):
    """Global average pool -> biased 1×1 conv -> Hardsigmoid (clamp(x/6 + 1/2, 0, 1)) gate (spec §3.1)."""

    def __init__(self, channels: int, **factory) -> None:
        super().__init__()
        self.fc = nn.Conv2d(channels, channels, 1, bias=True, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # adaptive_avg_pool2d rather than x.mean(): same reduction kernel as the reference, bit-exact on CPU.
        gate = F.hardsigmoid(self.fc(F.adaptive_avg_pool2d(x, 1)))  # (B, C, 1, 1)
        return x * gate


class CSPLayer(nn.Module):
    """CSP layer: concat[main_conv -> blocks, short_conv] (main first) -> optional attention -> final_conv."""

    def __init__(
        self, in_channels: int, out_channels: int, num_blocks: int, *, add_identity: bool, attention: bool, **factory
    ) -> None:
        super().__init__()
        mid = out_channels // 2
        self.main_conv = ConvModule(in_channels, mid, 1, **factory)
        self.short_conv = ConvModule(in_channels, mid, 1, **factory)
        self.final_conv = ConvModule(2 * mid, out_channels, 1, **factory)
        self.blocks = nn.Sequential(*[CSPNeXtBlock(mid, add_identity, **factory) for _ in range(num_blocks)])
        self.attention = ChannelAttention(2 * mid, **factory) if attention else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([self.blocks(self.main_conv(x)), self.short_conv(x)], dim=1)
        if self.attention is not None:
            y = self.attention(y)
        return self.final_conv(y)


class SPPBottleneck(nn.Module):
    """1×1 conv, parallel 5/9/13 stride-1 max pools of the same tensor, concat [t, p5, p9, p13], 1×1 conv."""

    def __init__(self, channels: int, kernel_sizes: tuple[int, ...] = (5, 9, 13), **factory) -> None:
        super().__init__()
        mid = channels // 2
        self.kernel_sizes = kernel_sizes
        self.conv1 = ConvModule(channels, mid, 1, **factory)
        self.conv2 = ConvModule(mid * (len(kernel_sizes) + 1), channels, 1, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.conv1(x)
        pooled = [F.max_pool2d(t, k, stride=1, padding=k // 2) for k in self.kernel_sizes]
        return self.conv2(torch.cat([t, *pooled], dim=1))


class CSPNeXt(nn.Module):
    """CSPNeXt-P5 backbone at deepen 0.67 / widen 0.75 (RTMDet-m), returning (C3, C4, C5) (spec §3.2).

    Input (B, 3, H, W); outputs (B, 192, H/8, W/8), (B, 384, H/16, W/16), (B, 768, H/32, W/32).
    """

    def __init__(self, **factory) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            ConvModule(3, 24, 3, stride=2, **factory),
            ConvModule(24, 24, 3, **factory),
            ConvModule(24, 48, 3, **factory),
        )
        # (in, out, blocks, add_identity, spp), already scaled: channels int(c * 0.75), blocks round(b * 0.67).
        settings = [(48, 96, 2, True, False), (96, 192, 4, True, False), (192, 384, 4, True, False)]
        settings.append((384, 768, 2, False, True))
        for index, (cin, cout, blocks, identity, spp) in enumerate(settings, start=1):
            layers: list[nn.Module] = [ConvModule(cin, cout, 3, stride=2, **factory)]
            if spp:
                layers.append(SPPBottleneck(cout, **factory))
            layers.append(CSPLayer(cout, cout, blocks, add_identity=identity, attention=True, **factory))
            self.add_module(f"stage{index}", nn.Sequential(*layers))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.stage1(self.stem(x))
        c3 = self.stage2(x)
        c4 = self.stage3(c3)
        c5 = self.stage4(c4)
        return c3, c4, c5


class CSPNeXtPAFPN(nn.Module):
    """PAFPN neck, channels (192, 384, 768) -> 192 at strides 8/16/32 (spec §3.3; concat orders per §6 item 10)."""

    def __init__(self, **factory) -> None:
        super().__init__()

        def csp(cin: int, cout: int) -> CSPLayer:
            return CSPLayer(cin, cout, 2, add_identity=False, attention=False, **factory)

        self.reduce_layers = nn.ModuleList([ConvModule(768, 384, 1, **factory), ConvModule(384, 192, 1, **factory)])
        self.top_down_blocks = nn.ModuleList([csp(768, 384), csp(384, 192)])
        self.downsamples = nn.ModuleList(
            [ConvModule(192, 192, 3, stride=2, **factory), ConvModule(384, 384, 3, stride=2, **factory)]
        )
        self.bottom_up_blocks = nn.ModuleList([csp(384, 384), csp(768, 768)])
        self.out_convs = nn.ModuleList([ConvModule(c, 192, 3, **factory) for c in (192, 384, 768)])

    def forward(self, feats: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
        c3, c4, c5 = feats
        r5 = self.reduce_layers[0](c5)
        t4 = self.top_down_blocks[0](torch.cat([F.interpolate(r5, scale_factor=2.0, mode="nearest"), c4], dim=1))
        r4 = self.reduce_layers[1](t4)
        t3 = self.top_down_blocks[1](torch.cat([F.interpolate(r4, scale_factor=2.0, mode="nearest"), c3], dim=1))
        # The bottom-up laterals are the *reduced* maps R4, R5 (not T4, C5): spec §3.3.
        b4 = self.bottom_up_blocks[0](torch.cat([self.downsamples[0](t3), r4], dim=1))
        b5 = self.bottom_up_blocks[1](torch.cat([self.downsamples[1](b4), r5], dim=1))
        return [self.out_convs[0](t3), self.out_convs[1](b4), self.out_convs[2](b5)]


class RTMDetSepBNHead(nn.Module):
    """Per-level towers of two 3×3 ConvModules whose convs are shared across levels (BN per level) (spec §3.4).

    Returns per level ``cls_score`` (B, num_classes, H_l, W_l) raw logits and ``bbox_pred`` (B, 4, H_l, W_l) =
    exp(raw) · stride: distances (left, top, right, bottom) in network-input pixels.
    """

    def __init__(self, num_classes: int = 1, channels: int = 192, stacked_convs: int = 2, **factory) -> None:
        super().__init__()
        self.strides = HEAD_STRIDES

        def tower() -> nn.Sequential:
            return nn.Sequential(*[ConvModule(channels, channels, 3, **factory) for _ in range(stacked_convs)])

        self.cls_convs = nn.ModuleList([tower() for _ in self.strides])
        self.reg_convs = nn.ModuleList([tower() for _ in self.strides])
        # share_conv=True: one Conv2d per tower depth for all levels; the BNs stay per level. The checkpoint repeats the
        # shared weight under every level's name, so the shared module is simply loaded three times with equal values.
        for level in range(1, len(self.strides)):
            for depth in range(stacked_convs):
                self.cls_convs[level][depth].conv = self.cls_convs[0][depth].conv
                self.reg_convs[level][depth].conv = self.reg_convs[0][depth].conv
        self.rtm_cls = nn.ModuleList([nn.Conv2d(channels, num_classes, 1, **factory) for _ in self.strides])
        self.rtm_reg = nn.ModuleList([nn.Conv2d(channels, 4, 1, **factory) for _ in self.strides])

    def forward(self, feats: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        cls_scores, bbox_preds = [], []
        for level, (x, stride) in enumerate(zip(feats, self.strides, strict=True)):
            cls_scores.append(self.rtm_cls[level](self.cls_convs[level](x)))
            # exp_on_reg=True for RTMDet-m (inherited from the -l config): distances = exp(raw) * stride.
            bbox_preds.append(self.rtm_reg[level](self.reg_convs[level](x)).exp() * stride)
        return cls_scores, bbox_preds


class RTMDet(nn.Module):
    """RTMDet-m (1 class by default): ``backbone`` -> ``neck`` -> ``bbox_head``, the official state-dict layout.

    ``forward(x)`` takes a normalised BGR batch (B, 3, H, W) float32 (H, W multiples of 32; 640×640 in the official
    pipeline) and returns ``(cls_scores, bbox_preds)``, lists over the strides (8, 16, 32) as described in
    :class:`RTMDetSepBNHead`.
    """

    def __init__(
        self, num_classes: int = 1, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.backbone = CSPNeXt(**factory)
        self.neck = CSPNeXtPAFPN(**factory)
        self.bbox_head = RTMDetSepBNHead(num_classes, **factory)

    def forward(self, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return self.bbox_head(self.neck(self.backbone(x)))


@torch.no_grad()
def fuse_batchnorm(model: nn.Module) -> nn.Module:
    """Fold every ConvModule's eval-mode BatchNorm into its conv, in place; returns ``model`` for chaining.

    Speeds inference up; outputs change at float32 rounding level only (DETECTOR.md §7). The folded weights are
    computed in float64. Each ConvModule gets its own new Conv2d, so the head's shared convs become per-level convs
    (their BNs differ). The fused model no longer has the official state-dict layout: load weights first.
    """
    for module in model.modules():
        if not isinstance(module, ConvModule) or not isinstance(module.bn, nn.BatchNorm2d):
            continue
        conv, bn = module.conv, module.bn
        inv_std = torch.rsqrt(bn.running_var.double() + bn.eps)
        gain = bn.weight.double() * inv_std  # (C_out,)
        dtype = conv.weight.dtype
        # Built on `meta` (no wasted random init), then given the folded tensors.
        fused = nn.Conv2d(
            conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, groups=conv.groups,
            device="meta",
        )  # fmt: skip
        fused.weight = nn.Parameter((conv.weight.double() * gain[:, None, None, None]).to(dtype), requires_grad=False)
        fused.bias = nn.Parameter((bn.bias.double() - bn.running_mean.double() * gain).to(dtype), requires_grad=False)
        module.conv = fused
        module.bn = nn.Identity()
    return model
