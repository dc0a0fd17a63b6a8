"""Dense tasks (seg, normal, pointmap, albedo, matting): official pre/post-processing and typed results.

Each task module has ``preprocess(images_rgb, input_size) -> (tensor, meta)``, ``postprocess(raw, meta) -> results``,
a frozen result dataclass and ``REFERENCE_OPTIONS`` (the ``postprocess`` options of ``Predictor(reference=True)``).
Every ``postprocess`` runs the one per-image loop in ``sapiens2.dense.common`` (``each_image``) over a per-image
function holding the task's own rule. The networks live in ``sapiens2.models``.
"""

from sapiens2.dense import albedo, matting, normal, pointmap, seg
from sapiens2.dense.albedo import AlbedoResult
from sapiens2.dense.matting import MattingResult
from sapiens2.dense.normal import NormalResult
from sapiens2.dense.pointmap import PointmapResult
from sapiens2.dense.seg import SegResult

__all__ = [
    "AlbedoResult",
    "MattingResult",
    "NormalResult",
    "PointmapResult",
    "SegResult",
    "albedo",
    "matting",
    "normal",
    "pointmap",
    "seg",
]
