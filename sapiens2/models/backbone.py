"""Sapiens2: the vision transformer backbone, assembled from ``layers`` (MODEL.md §1).

Sequence layout: [cls, 8 storage tokens, patch tokens row-major]; pre-norm blocks with 2-D RoPE on the patch tokens
only; a final RMSNorm after the last block. Module names are the official checkpoint keys, so official files load
with a plain ``load_state_dict``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .layers import PatchEmbed, RMSNorm, RopePositionEmbedding, TransformerBlock
from .tokenizer import WindowTokenizer
from .zoo import Arch, get_arch

OUT_TYPES = ("raw", "featmap", "cls_token")


class Sapiens2(nn.Module):
    """The Sapiens2 backbone.

    Args:
        arch: an arch name (``"sapiens2_1b"``, short ``"1b"``), or a dict with ``embed_dims, num_layers, num_heads,
            feedforward_channels, num_tokenizer_layers`` (GQA layout by the official rule).
        img_size: nominal (H, W). Informational: the token grid is taken from the actual input at run time.
            Defaults to the arch's training size.
        patch_size: patch side in pixels (16 for every released model).
        use_tokenizer: add the 4K hierarchical tokenizer (implied by ``arch="sapiens2_1b_4k"``).
        window_size: tokenizer window side in patches.
        out_type: ``"raw"`` (B, 9 + Hp*Wp, D), ``"featmap"`` (B, D, Hp, Wp) patch tokens, or ``"cls_token"`` (B, D).
        out_indices: block index or list of indices whose outputs are returned (negatives count from the end);
            the final norm applies to the last block's output only.
        n_storage_tokens: register tokens after the cls token.
        rope_dtype: ``"bf16"`` reproduces the official numerics (default); ``"fp32"`` is a plain float32 RoPE.
        frozen_stages: freeze patch embed, tokens and tokenizer, plus this many first blocks (-1: nothing).
        layer_scale_init_value: initial LayerScale value (used by ``init_weights``).

    Example:
        >>> model = Sapiens2(arch="sapiens2_0.1b", img_size=(256, 192)).eval()
        >>> features = model(torch.zeros(1, 3, 256, 192))[0]  # (1, 9 + 16*12, 768)
    """

    def __init__(
        self,
        arch: str | dict | Arch = "sapiens2_1b",
        img_size: tuple[int, int] | int | None = None,
        patch_size: int = 16,
        use_tokenizer: bool | None = None,
        window_size: int = 4,
        out_type: str = "raw",
        out_indices: int | Sequence[int] = -1,
        n_storage_tokens: int = 8,
        rope_dtype: str | torch.dtype = "bf16",
        frozen_stages: int = -1,
        *,
        layer_scale_init_value: float = 1e-4,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.arch = get_arch(arch)
        if out_type not in OUT_TYPES:
            raise ValueError(f"out_type must be one of {OUT_TYPES}, got {out_type!r}")
        self.use_tokenizer = self.arch.use_tokenizer if use_tokenizer is None else bool(use_tokenizer)
        if img_size is None:
            img_size = (4096, 3072) if self.use_tokenizer else self.arch.img_size
        img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        # Official convention: with the tokenizer, the stored img_size is the post-tokenizer size.
        self.img_size = (img_size[0] // window_size, img_size[1] // window_size) if self.use_tokenizer else img_size
        self.patch_size = patch_size
        self.window_size = window_size
        self.out_type = out_type
        self.embed_dims = dim = self.arch.embed_dims
        self.num_layers = self.arch.num_layers
        self.out_indices = self._normalize_indices(out_indices)
        self.n_storage_tokens = n_storage_tokens
        self.num_prefix_tokens = 1 + n_storage_tokens
        self.frozen_stages = frozen_stages
        self.layer_scale_init_value = layer_scale_init_value
        factory = {"device": device, "dtype": dtype}

        self.cls_token = nn.Parameter(torch.empty(1, 1, dim, **factory))
        self.storage_tokens = nn.Parameter(torch.empty(1, n_storage_tokens, dim, **factory))
        self.patch_embed = PatchEmbed(3, dim, patch_size, **factory)
        self.rope_embed = RopePositionEmbedding(self.arch.head_dim, base=100.0, dtype=rope_dtype, device=device)
        if self.use_tokenizer:
            self.tokenizer = WindowTokenizer(
                dim,
                self.arch.num_heads,
                self.arch.feedforward_channels,
                self.arch.num_tokenizer_layers,
                window_size,
                **factory,
            )
        else:
            self.tokenizer = None
        self.blocks = nn.ModuleList(
            TransformerBlock(
                dim,
                self.arch.num_heads,
                self.arch.feedforward_channels,
                self.arch.kv_heads(i),
                layer_scale_init=layer_scale_init_value,
                **factory,
            )
            for i in range(self.num_layers)
        )
        self.ln1 = RMSNorm(dim, **factory)  # final norm; the checkpoint key is "ln1"

        if torch.device(device or "cpu").type != "meta":
            self.init_weights()
        self._freeze_stages()

    def _normalize_indices(self, out_indices: int | Sequence[int]) -> tuple[int, ...]:
        indices = [out_indices] if isinstance(out_indices, int) else list(out_indices)
        if not indices:
            raise ValueError("out_indices must name at least one block")
        normalized = []
        for index in indices:
            resolved = index + self.num_layers if index < 0 else index
            if not 0 <= resolved < self.num_layers:
                raise ValueError(f"out_indices entry {index} is out of range for {self.num_layers} blocks")
            normalized.append(resolved)
        return tuple(sorted(set(normalized)))

    @torch.no_grad()
    def init_weights(self) -> None:
        """Random init as the official recipe: trunc-normal(0.02) for weights and tokens, zero biases, norms 1."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif hasattr(module, "reset_parameters") and module is not self:
                module.reset_parameters()
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.storage_tokens, std=0.02)
        if self.tokenizer is not None:
            nn.init.trunc_normal_(self.tokenizer.w_cls, std=0.02)
            nn.init.trunc_normal_(self.tokenizer.local_pos_embed, std=0.02)

    def _frozen_modules(self) -> list[nn.Module]:
        if self.frozen_stages < 0:
            return []
        modules: list[nn.Module] = [self.patch_embed]
        if self.tokenizer is not None:
            modules.append(self.tokenizer)
        modules += list(self.blocks[: self.frozen_stages])
        if self.frozen_stages >= self.num_layers:
            modules.append(self.ln1)
        return modules

    def _freeze_stages(self) -> None:
        if self.frozen_stages < 0:
            return
        self.cls_token.requires_grad_(False)
        self.storage_tokens.requires_grad_(False)
        for module in self._frozen_modules():
            module.eval()
            module.requires_grad_(False)

    def train(self, mode: bool = True) -> Sapiens2:
        super().train(mode)
        for module in self._frozen_modules():
            module.eval()
        return self

    def forward_features(self, x: torch.Tensor) -> tuple[list[torch.Tensor], tuple[int, int]]:
        """Run the network; returns the raw (B, N, D) outputs of ``self.out_indices`` and the token grid."""
        tokens, grid = self.patch_embed(x)  # (B, Hp*Wp, D)
        if self.tokenizer is not None:
            tokens, grid = self.tokenizer(tokens, grid)
        batch = tokens.shape[0]
        prefix = (self.cls_token.expand(batch, -1, -1), self.storage_tokens.expand(batch, -1, -1))
        tokens = torch.cat((*prefix, tokens), dim=1)  # (B, 9 + Hp*Wp, D)
        rope = self.rope_embed(grid)
        outputs = []
        last = self.out_indices[-1]
        for index, block in enumerate(self.blocks[: last + 1]):
            tokens = block(tokens, rope)
            if index == self.num_layers - 1:
                tokens = self.ln1(tokens)
            if index in self.out_indices:
                outputs.append(tokens)
        return outputs, grid

    def format_output(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Shape one (B, N, D) block output according to ``out_type``."""
        if self.out_type == "raw":
            return tokens
        if self.out_type == "cls_token":
            return tokens[:, 0]
        batch, _, dim = tokens.shape
        patches = tokens[:, self.num_prefix_tokens :]
        # (B, Hp*Wp, D) -> (B, Hp, Wp, D) -> (B, D, Hp, Wp): a permuted (channels-last) view, as the official model
        # hands it to the heads; the heads' CPU convolutions depend on this layout in the last bits (MODEL.md §5.4).
        return patches.reshape(batch, grid[0], grid[1], dim).permute(0, 3, 1, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x: (B, 3, H, W) normalised float images. Returns one tensor per ``out_indices`` entry, in block order."""
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"expected images of shape (B, 3, H, W), got {tuple(x.shape)}")
        outputs, grid = self.forward_features(x)
        return tuple(self.format_output(tokens, grid) for tokens in outputs)

    def extra_repr(self) -> str:
        return f"arch={self.arch.name}, img_size={self.img_size}, out_type={self.out_type!r}"
