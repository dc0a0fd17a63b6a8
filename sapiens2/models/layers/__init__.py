"""Generic transformer parts, one idea per file; nothing Sapiens-specific."""

from .attention import Attention
from .block import TransformerBlock
from .ffn import SwiGLUFFN
from .layer_scale import LayerScale
from .norm import RMSNorm
from .patch_embed import PatchEmbed
from .rope import RopePositionEmbedding, apply_rope, rope_dtype_from_name

__all__ = [
    "Attention",
    "LayerScale",
    "PatchEmbed",
    "RMSNorm",
    "RopePositionEmbedding",
    "SwiGLUFFN",
    "TransformerBlock",
    "apply_rope",
    "rope_dtype_from_name",
]
