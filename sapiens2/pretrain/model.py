"""The networks of pretraining (PRETRAIN.md §5-7, §9): the released backbone run on visible tokens only, the
student-only MAE decoder, the DINO projection head, and the EMA teacher.

``encode`` runs a ``Sapiens2`` backbone's own modules (patch embed, optional 4K tokenizer, blocks, final norm) in
the order of ``Sapiens2.forward_features``, with two additions: the kept tokens are gathered after the patch
embedding (4K: the kept windows before the tokenizer), and the RoPE tables of the full grid, optionally augmented,
are gathered to the kept rows per sample, (B, 1, n_keep, hd). With nothing masked and no augmentation it computes
the backbone's forward bit for bit (tests/test_pretrain_model.py).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.backbone import Sapiens2
from ..models.layers import RMSNorm, RopePositionEmbedding, TransformerBlock
from ..models.tokenizer import WINDOW_CHUNK, WindowTokenizer

__all__ = [
    "DinoHead",
    "MaeDecoder",
    "PretrainStudent",
    "PretrainTeacher",
    "encode",
    "ema_update",
    "patchify",
    "rope_tables",
]


def rope_tables(
    rope: RopePositionEmbedding,
    grid: tuple[int, int],
    *,
    rescale: float | None = None,
    shift: float | None = None,
    jitter: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """(sin, cos) of ``grid`` as ``RopePositionEmbedding.forward`` computes them, with DINOv3's training
    augmentations of the [-1, 1] coordinates (PRETRAIN.md §5): one draw per call, shared by the batch, in the
    RoPE dtype. No augmentation: bit-identical to ``rope(grid)``."""
    height, width = grid
    device, dtype = rope.periods.device, rope.dtype
    coords_h = (torch.arange(height, dtype=dtype, device=device) + 0.5) / height
    coords_w = (torch.arange(width, dtype=dtype, device=device) + 0.5) / width
    coords = torch.stack(torch.meshgrid(coords_h, coords_w, indexing="ij"), dim=-1).flatten(0, 1)  # (HW, 2)
    coords = 2.0 * coords - 1.0

    def uniform(low: float, high: float, count: int) -> Tensor:
        draw = torch.rand(count, generator=generator, dtype=torch.float32)
        return (low + (high - low) * draw).to(device=device, dtype=dtype)

    if shift:
        coords = coords + uniform(-shift, shift, 2)
    if jitter:
        coords = coords * torch.exp(uniform(-math.log(jitter), math.log(jitter), 2))
    if rescale:
        coords = coords * torch.exp(uniform(-math.log(rescale), math.log(rescale), 1))
    angles = (2 * math.pi * coords)[:, :, None] / rope.periods.to(dtype)[None, None, :]  # (HW, 2, hd/4)
    angles = angles.flatten(1, 2).tile(2)  # (HW, hd)
    return torch.sin(angles), torch.cos(angles)


def _windows(tokens: Tensor, grid: tuple[int, int], window: int) -> Tensor:
    """(B, Hp*Wp, D) -> (B, windows, ws*ws, D), windows row-major, tokens row-major inside (as the tokenizer)."""
    batch, _, dim = tokens.shape
    rows, cols = grid[0] // window, grid[1] // window
    # (B, Hp*Wp, D) -> (B, rows, ws, cols, ws, D) -> (B, rows, cols, ws, ws, D)
    windows = tokens.reshape(batch, rows, window, cols, window, dim).permute(0, 1, 3, 2, 4, 5)
    return windows.reshape(batch, rows * cols, window * window, dim)


def tokenize(
    tokenizer: WindowTokenizer, tokens: Tensor, grid: tuple[int, int], keep: Tensor | None = None
) -> tuple[Tensor, tuple[int, int]]:
    """The 4K tokenizer on the kept windows only (all when ``keep`` is None). Windows attend only within themselves,
    so a window's output does not depend on which others run (PRETRAIN.md §5.1)."""
    ws = tokenizer.window_size
    if grid[0] % ws or grid[1] % ws:
        raise ValueError(f"the 4K tokenizer needs a patch grid divisible by {ws}, got {grid[0]}x{grid[1]}")
    windows = _windows(tokens, grid, ws)  # (B, W, ws*ws, D)
    batch, _, _, dim = windows.shape
    if keep is not None:
        windows = windows.gather(1, keep[:, :, None, None].expand(-1, -1, ws * ws, dim))
    windows = windows.reshape(-1, ws * ws, dim)
    windows = torch.cat((tokenizer.w_cls.expand(windows.shape[0], -1, -1), windows), dim=1) + tokenizer.local_pos_embed
    outputs = []
    for chunk in windows.split(WINDOW_CHUNK, dim=0):
        for block in tokenizer.blocks:
            chunk = block(chunk)
        outputs.append(chunk[:, 0])
    return torch.cat(outputs, dim=0).reshape(batch, -1, dim), (grid[0] // ws, grid[1] // ws)


def _drop_path_block(block: nn.Module, tokens: Tensor, rope: tuple[Tensor, Tensor], rate: float) -> Tensor:
    """Stochastic depth on the whole block's residual, per sample, rescaled by 1 / (1 - rate)."""
    keep = torch.rand(tokens.shape[0], 1, 1, device=tokens.device) >= rate
    return tokens + (block(tokens, rope) - tokens) * keep.to(tokens.dtype) / (1 - rate)


def encode(
    backbone: Sapiens2,
    images: Tensor,
    keep: Tensor | None = None,
    *,
    rope_augment: dict | None = None,
    drop_path: float = 0.0,
) -> tuple[Tensor, tuple[int, int]]:
    """Backbone forward on the visible tokens.

    Args:
        backbone: a ``Sapiens2`` (its modules are used; its ``out_indices`` are ignored: all blocks run).
        images: (B, 3, H, W) normalised.
        keep: (B, n_keep) ascending indices of visible cells (patches, or 4K windows); None: every token.
        rope_augment: keyword arguments of ``rope_tables`` (``rescale``, ``shift``, ``jitter``, ``generator``).
        drop_path: stochastic-depth rate of every block (training only).

    Returns:
        ((B, 9 + n_keep, D) final-norm tokens, the full token grid (Hp, Wp)).
    """
    tokens, grid = backbone.patch_embed(images)  # (B, Hp*Wp, D)
    if backbone.tokenizer is not None:
        tokens, grid = tokenize(backbone.tokenizer, tokens, grid, keep)
    elif keep is not None:
        tokens = tokens.gather(1, keep[:, :, None].expand(-1, -1, tokens.shape[-1]))  # (B, n_keep, D)
    batch = tokens.shape[0]
    prefix = (backbone.cls_token.expand(batch, -1, -1), backbone.storage_tokens.expand(batch, -1, -1))
    tokens = torch.cat((*prefix, tokens), dim=1)
    if rope_augment:
        sin, cos = rope_tables(backbone.rope_embed, grid, **rope_augment)
    else:
        sin, cos = backbone.rope_embed(grid)
    if keep is not None:  # the full-grid rows of the kept tokens, per sample: (B, 1, n_keep, hd)
        sin, cos = sin[keep].unsqueeze(1), cos[keep].unsqueeze(1)
    for block in backbone.blocks:
        if drop_path > 0 and block.training:
            tokens = _drop_path_block(block, tokens, (sin, cos), drop_path)
        else:
            tokens = block(tokens, (sin, cos))
    return backbone.ln1(tokens), grid


def patchify(images: Tensor, patch: int) -> Tensor:
    """(B, 3, H, W) -> (B, Hp*Wp, 3*p*p) in the decoder's pixel-shuffle order (channel, row, column)."""
    batch, channels, height, width = images.shape
    rows, cols = height // patch, width // patch
    x = images.reshape(batch, channels, rows, patch, cols, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(batch, rows * cols, channels * patch * patch)


class MaeDecoder(nn.Module):
    """MAE decoder for a backbone without absolute positions (PRETRAIN.md §6.2): embed, scatter the visible tokens
    into a grid of mask tokens, prefix carried, Sapiens2-style blocks with 2-D RoPE over the full grid, RMSNorm, a
    linear to 3·p² values per token (read as a pixel shuffle by ``patchify``'s order)."""

    def __init__(
        self,
        in_dim: int,
        dim: int = 512,
        depth: int = 8,
        num_heads: int = 16,
        patch: int = 16,
        *,
        rope_dtype: str = "bf16",
        layer_scale_init: float = 1e-4,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.patch = patch
        self.embed = nn.Linear(in_dim, dim, **factory)
        self.mask_token = nn.Parameter(torch.empty(1, 1, dim, **factory))
        self.rope_embed = RopePositionEmbedding(dim // num_heads, dtype=rope_dtype, device=device)
        self.blocks = nn.ModuleList(
            TransformerBlock(dim, num_heads, 4 * dim, layer_scale_init=layer_scale_init, **factory)
            for _ in range(depth)
        )
        self.norm = RMSNorm(dim, **factory)
        self.pred = nn.Linear(dim, 3 * patch * patch, **factory)
        if torch.device(device or "cpu").type != "meta":
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
            elif hasattr(module, "reset_parameters") and module is not self:
                module.reset_parameters()
        nn.init.normal_(self.mask_token, std=0.02)

    def forward(self, tokens: Tensor, keep: Tensor, grid: tuple[int, int], num_prefix: int = 9) -> Tensor:
        """tokens (B, prefix + n_keep, D) encoder outputs, keep (B, n_keep) -> (B, Hp*Wp, 3·p²) predictions."""
        x = self.embed(tokens)
        batch, _, dim = x.shape
        prefix, visible = x[:, :num_prefix], x[:, num_prefix:]
        cells = grid[0] * grid[1]
        full = self.mask_token.to(x.dtype).expand(batch, cells, dim)
        full = full.scatter(1, keep[:, :, None].expand(-1, -1, dim), visible)  # (B, Hp*Wp, Dd)
        x = torch.cat((prefix, full), dim=1)
        rope = self.rope_embed(grid)
        for block in self.blocks:
            x = block(x, rope)
        return self.pred(self.norm(x[:, num_prefix:]))


class DinoHead(nn.Module):
    """DINOv3 projection head: 3-layer MLP (GELU) to a bottleneck, L2 normalisation, plain linear ``last_layer`` to
    K prototypes (no bias). Trunc-normal(0.02) init, zero biases (PRETRAIN.md §7.1)."""

    def __init__(self, in_dim: int, hidden: int, bottleneck: int, prototypes: int, *, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.mlp = nn.Sequential(
            nn.Linear(in_dim, hidden, **factory),
            nn.GELU(),
            nn.Linear(hidden, hidden, **factory),
            nn.GELU(),
            nn.Linear(hidden, bottleneck, **factory),
        )
        self.last_layer = nn.Linear(bottleneck, prototypes, bias=False, **factory)
        if torch.device(device or "cpu").type != "meta":
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.mlp(x)
        x = F.normalize(x, dim=-1, eps=1e-6 if x.dtype == torch.float16 else 1e-12)
        return self.last_layer(x)


class PretrainStudent(nn.Module):
    """Backbone + MAE decoder + DINO head; one forward computes everything the losses need (so DDP and FSDP2 see
    a single call). Parameter names: ``backbone.*`` (the official keys), ``decoder.*``, ``dino_head.*``."""

    def __init__(self, backbone: Sapiens2, decoder: MaeDecoder, dino_head: DinoHead, drop_path: float = 0.0):
        super().__init__()
        self.backbone = backbone
        self.decoder = decoder
        self.dino_head = dino_head
        self.drop_path = drop_path

    def forward(
        self, global_views: Tensor, keep: Tensor, local_views: Tensor | None = None, rope_augment: dict | None = None
    ) -> dict[str, Tensor]:
        """global_views (B·Gs, 3, H, W) with keep (B·Gs, n_keep); local_views (B·L, 3, h, w) or None.

        Returns:
            ``cls`` (B·Gs, D) pre-head final-norm CLS of the masked globals, ``global_logits`` (B·Gs, K),
            ``local_logits`` (B·L, K) (empty without locals), ``pred`` (B·Gs, cells, 3·p²) reconstructions.
        """
        tokens, grid = encode(self.backbone, global_views, keep, rope_augment=rope_augment, drop_path=self.drop_path)
        cls = tokens[:, 0]
        pred = self.decoder(tokens, keep, grid, self.backbone.num_prefix_tokens)
        heads_in = cls
        count = 0
        if local_views is not None and local_views.shape[0]:
            local_tokens, _ = encode(self.backbone, local_views, rope_augment=rope_augment, drop_path=self.drop_path)
            heads_in = torch.cat((cls, local_tokens[:, 0]))
            count = local_views.shape[0]
        logits = self.dino_head(heads_in)  # one head call for globals and locals
        split = logits.shape[0] - count
        return {"cls": cls, "global_logits": logits[:split], "local_logits": logits[split:], "pred": pred}


class PretrainTeacher(nn.Module):
    """The EMA teacher: backbone + DINO head, always in eval mode, never trained by gradients (PRETRAIN.md §9)."""

    def __init__(self, student: PretrainStudent) -> None:
        super().__init__()
        # The same architecture with the student's values, buffers included (the RoPE periods).
        # The frozen Arch (it holds read-only mappings that cannot be copied) is shared, not copied.
        self.backbone = copy.deepcopy(student.backbone, memo={id(student.backbone.arch): student.backbone.arch})
        self.dino_head = copy.deepcopy(student.dino_head)
        self.requires_grad_(False)
        self.train(False)

    def train(self, mode: bool = True) -> PretrainTeacher:
        return super().train(False)  # no drop path, no RoPE augmentation, whatever the caller asks

    @torch.no_grad()
    def forward(self, views: Tensor) -> tuple[Tensor, Tensor]:
        """views (B·Gt, 3, H, W), unmasked -> (final-norm CLS (B·Gt, D), logits (B·Gt, K))."""
        tokens, _ = encode(self.backbone, views)
        cls = tokens[:, 0]
        return cls, self.dino_head(cls)


def ema_parameters(student: PretrainStudent, teacher: PretrainTeacher) -> tuple[list[Tensor], list[Tensor]]:
    """(teacher, student) parameters in matching order: backbone then head, parameters only (no buffers)."""
    names = dict(teacher.named_parameters())
    pairs = [(names[name], param) for name, param in student.named_parameters() if name in names]
    if len(pairs) != len(names):
        raise RuntimeError("teacher and student parameters do not match")
    return [t for t, _ in pairs], [s for _, s in pairs]


@torch.no_grad()
def ema_update(teacher_params: list[Tensor], student_params: list[Tensor], momentum: float) -> None:
    """theta_t <- m * theta_t + (1 - m) * theta_s, in place (on local shards under FSDP2)."""
    local_t = [getattr(p, "_local_tensor", p) for p in teacher_params]
    local_s = [getattr(p, "_local_tensor", p).detach() for p in student_params]
    torch._foreach_mul_(local_t, momentum)
    torch._foreach_add_(local_t, local_s, alpha=1.0 - momentum)
