"""Built-in person detector: the Sapiens2 pose demo's RTMDet-m (1 class) with no mm* package.

Implements DETECTOR.md: checkpoint loading (§1), preprocessing (§2) and post-processing (§5), ending where mmdet's
``inference_detector`` returns; the demo's box selection after it (POSE.md §2.2) is
``sapiens2.pose.topdown.filter_detections``. Boxes are xyxy float32 in pixels of the original image, x right, y down,
with no ±0.5 shift anywhere (DETECTOR.md §0). The public API takes **RGB** uint8 images; the network sees BGR like the
official ``cv2.imread`` pipeline, converted once in :func:`rgb_to_bgr`.

Example:
    >>> detector = PersonDetector.from_checkpoint(None)  # downloads rtmdet_m.pth once
    >>> boxes = detector([image_rgb])[0]  # (N, 5) float32: x1, y1, x2, y2, score
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch

from ..checkpoints import download, load_into, read_tensors
from .detector_net import HEAD_STRIDES, RTMDet, fuse_batchnorm

__all__ = [
    "DETECTOR_FILENAME",
    "DETECTOR_REPO_ID",
    "Candidates",
    "PersonDetector",
    "build_detector_model",
    "decode_candidates",
    "finalize_detections",
    "letterbox",
    "load_detector_state_dict",
    "normalize_bgr",
    "rescale_boxes",
    "resolve_detector_checkpoint",
    "rgb_to_bgr",
]

logger = logging.getLogger(__name__)

DETECTOR_REPO_ID = "facebook/sapiens-pose-bbox-detector"
DETECTOR_FILENAME = "rtmdet_m.pth"

INPUT_SIZE = 640  # square network input, DETECTOR.md §2
PAD_VALUE = 114
# ImageNet statistics listed in BGR order, because the network is fed BGR (DETECTOR.md §2 step 3).
MEAN_BGR = (103.53, 116.28, 123.675)
STD_BGR = (57.375, 57.12, 58.395)
# The Sapiens2 config's test_cfg (DETECTOR.md, header): no NMS inside the detector.
SCORE_THR = 0.05
NMS_PRE = 1000
MAX_PER_IMG = 100


# ----------------------------------------------------------------------------------------------------------------
# Checkpoint
# ----------------------------------------------------------------------------------------------------------------


def resolve_detector_checkpoint(path: str | Path | None, *, local_hint: str | None = None) -> Path:
    """Return a local checkpoint file: ``path`` itself, or ``rtmdet_m.pth`` fetched through the Hugging Face cache.

    ``local_hint`` is how the offline message tells to pass a local file (default: the ``from_checkpoint`` call; the
    CLI names its ``--detector`` option); see ``sapiens2.checkpoints.download``.

    Raises:
        FileNotFoundError: ``path`` does not exist, or ``path`` is None and the file is neither reachable (offline,
            ``HF_HUB_OFFLINE=1``, no network) nor in the local cache. The message says how to pass a local file.
    """
    if path is not None:
        path = Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"person-detector checkpoint not found: {path}. Pass the path of a local '{DETECTOR_FILENAME}' "
                f"(from Hugging Face repo '{DETECTOR_REPO_ID}'), or None to download it."
            )
        return path
    return download(
        DETECTOR_REPO_ID,
        DETECTOR_FILENAME,
        local_hint=local_hint or f"PersonDetector.from_checkpoint('/path/to/{DETECTOR_FILENAME}')",
    )


def load_detector_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read the state dict of an mmengine/mmdet checkpoint on the CPU, through ``sapiens2.checkpoints.read_tensors``.

    Weights-only unpickling (numpy scalars in ``meta`` allowed), legacy and zip torch formats, a top-level
    ``state_dict`` entry (other top-level keys such as ``meta`` are ignored) or a bare state dict; a leading
    ``module.`` is stripped (DETECTOR.md §1).

    Raises:
        ValueError: the file is not a weights-only-loadable checkpoint, or holds no tensor state dict.
    """
    state = read_tensors(path)
    return {key.removeprefix("module."): tensor for key, tensor in state.items()}


def build_detector_model(state: Mapping[str, torch.Tensor], *, fuse_bn: bool = True) -> RTMDet:
    """Build RTMDet-m in eval mode and load ``state`` strictly (``sapiens2.checkpoints.load_into``); optionally fold
    BN into the convs.

    The model is built on the ``meta`` device (no wasted random init) and given its own contiguous copies of the
    tensors of ``state`` (file tensors can be views into shared storages, DETECTOR.md §1.2), on ``state``'s device.
    BN counters absent from the file (580 entries, §1.2) start at zero: training bookkeeping, unused in eval.

    Raises:
        ValueError: missing, unexpected or mis-shaped keys, or head convs that differ across levels.
    """
    model = RTMDet(device="meta").eval()
    own = {name: tensor.clone(memory_format=torch.contiguous_format) for name, tensor in state.items()}
    notes = [f"Use '{DETECTOR_FILENAME}' from Hugging Face repo '{DETECTOR_REPO_ID}'."]
    cls_weight = own.get("bbox_head.rtm_cls.0.weight")
    if cls_weight is not None and cls_weight.shape[0] != 1:
        classes = cls_weight.shape[0]
        notes.insert(0, f"The file's head predicts {classes} classes: it is not the 1-class person detector.")
    load_into(model, own, what="RTMDet-m (1 class, person)", notes=notes, optional=("num_batches_tracked",))
    # The head's convs are shared across levels (§3.4); the file repeats them, and they must agree.
    for tower in ("cls_convs", "reg_convs"):
        for level in (1, 2):
            for depth in (0, 1):
                name = f"bbox_head.{tower}.{level}.{depth}.conv.weight"
                if not torch.equal(own[name], own[f"bbox_head.{tower}.0.{depth}.conv.weight"]):
                    raise ValueError(f"{name} differs from level 0's; RTMDetSepBNHead shares these convs across levels")
    return fuse_batchnorm(model) if fuse_bn else model


# ----------------------------------------------------------------------------------------------------------------
# Preprocessing (DETECTOR.md §2)
# ----------------------------------------------------------------------------------------------------------------


def rgb_to_bgr(image: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """Reverse the last (channel) axis of an (..., 3) array or tensor: this module's one RGB -> BGR boundary.

    The official pipeline feeds the network ``cv2.imread``'s BGR order (DETECTOR.md §2); the public API takes RGB.
    Returns a contiguous copy.
    """
    if isinstance(image, torch.Tensor):
        return image.flip(-1)
    return np.ascontiguousarray(image[..., ::-1])


def letterbox(
    image: np.ndarray, size: int = INPUT_SIZE, pad_value: int = PAD_VALUE, *, out: np.ndarray | None = None
) -> tuple[np.ndarray, tuple[float, float]]:
    """Resize keeping the aspect ratio to fit ``size``×``size``, then pad bottom/right with ``pad_value``.

    The mmcv rules of DETECTOR.md §2 steps 1–2: scale ``s = size / max(H0, W0)`` (upscaling included), new sizes
    ``int(W0·s + 0.5)``, ``int(H0·s + 0.5)``, OpenCV INTER_LINEAR on uint8. Both steps act per channel, so the channel
    order of ``image`` is kept as is.

    Args:
        image: (H0, W0, 3) uint8.
        size: side of the square output canvas.
        pad_value: value of the padded pixels, all channels.
        out: optional (size, size, 3) uint8 array to write the canvas into (e.g. a slot of a pinned batch buffer).

    Returns:
        (canvas, scale_factor): canvas (size, size, 3) uint8 with the image at the top-left corner (``out`` if
        given); scale_factor (w_scale, h_scale) = (new_w / W0, new_h / H0) as Python floats, the per-axis factors
        that map original-image pixels to canvas pixels.
    """
    h0, w0 = image.shape[:2]
    scale = min(size / max(h0, w0), size / min(h0, w0))
    new_w, new_h = int(w0 * scale + 0.5), int(h0 * scale + 0.5)  # mmcv's round-half-up by truncation (§2 step 1)
    canvas = np.empty((size, size, 3), dtype=np.uint8) if out is None else out
    canvas[:new_h, :new_w] = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    canvas[new_h:] = pad_value
    canvas[:new_h, new_w:] = pad_value
    return canvas, (new_w / w0, new_h / h0)


def normalize_bgr(batch: torch.Tensor) -> torch.Tensor:
    """(B, H, W, 3) uint8 BGR -> (B, 3, H, W) float32 ``(x - mean) / std`` with the BGR-ordered ImageNet statistics."""
    mean = torch.tensor(MEAN_BGR, dtype=torch.float32, device=batch.device).view(1, 3, 1, 1)
    std = torch.tensor(STD_BGR, dtype=torch.float32, device=batch.device).view(1, 3, 1, 1)
    x = batch.permute(0, 3, 1, 2).float()  # (B, H, W, 3) -> (B, 3, H, W)
    return (x - mean) / std


# ----------------------------------------------------------------------------------------------------------------
# Post-processing (DETECTOR.md §5), batched over images, no loop over priors
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidates:
    """Per-level score-filtered, top-k candidates, levels concatenated in order 0, 1, 2 (DETECTOR.md §5.1–5.3).

    K = sum over levels of min(nms_pre, H_l·W_l). Entry [b, k] is a candidate of image b iff ``valid[b, k]``;
    within a level, candidates are sorted by descending score.

    Attributes:
        scores: (B, K) float32 sigmoid scores.
        boxes: (B, K, 4) float32 xyxy boxes in network-input (canvas) pixels, clamped to the canvas.
        valid: (B, K) bool, score > score_thr.
        level: (K,) int64 level index of each column.
        prior_index: (B, K) int64 row-major prior index within the level (row·W_l + col).
    """

    scores: torch.Tensor
    boxes: torch.Tensor
    valid: torch.Tensor
    level: torch.Tensor
    prior_index: torch.Tensor


def decode_candidates(
    cls_scores: Sequence[torch.Tensor],
    bbox_preds: Sequence[torch.Tensor],
    *,
    strides: Sequence[int] = HEAD_STRIDES,
    canvas_hw: tuple[int, int] = (INPUT_SIZE, INPUT_SIZE),
    score_thr: float = SCORE_THR,
    nms_pre: int = NMS_PRE,
) -> Candidates:
    """Sigmoid, strict ``> score_thr`` filter, per-level top ``nms_pre``, distance decoding and canvas clamp.

    Args:
        cls_scores: per level (B, 1, H_l, W_l) logits.
        bbox_preds: per level (B, 4, H_l, W_l) distances (left, top, right, bottom) in canvas pixels.
        strides: per-level prior strides; the prior of (row, col) is (col·stride, row·stride), offset 0 (§4.2).
        canvas_hw: (H, W) the boxes are clamped to: the padded canvas, since mmcv's Pad overwrites img_shape (§5.3).
        score_thr: strict score threshold.
        nms_pre: candidates kept per level and image, before decoding.
    """
    scores_l, boxes_l, valid_l, level_l, index_l = [], [], [], [], []
    for level, (logits, dists, stride) in enumerate(zip(cls_scores, bbox_preds, strides, strict=True)):
        batch, _, height, width = logits.shape
        scores = logits.permute(0, 2, 3, 1).reshape(batch, height * width).sigmoid()  # (B, HW), row-major priors
        dists = dists.permute(0, 2, 3, 1).reshape(batch, height * width, 4)
        # Masking then top-k selects the same set as mmdet's filter-then-sort (ties only matter as an order).
        masked = scores.masked_fill(scores <= score_thr, -1.0)
        top, index = masked.topk(min(nms_pre, height * width), dim=1)  # (B, k), descending
        rows = torch.div(index, width, rounding_mode="floor")
        points = torch.stack([index - rows * width, rows], dim=-1).to(torch.float32) * stride  # (B, k, 2) = (x, y)
        dist = torch.gather(dists, 1, index.unsqueeze(-1).expand(-1, -1, 4))  # (B, k, 4)
        boxes = torch.cat([points - dist[..., :2], points + dist[..., 2:]], dim=-1)  # (B, k, 4) xyxy
        boxes[..., 0::2] = boxes[..., 0::2].clamp(0, canvas_hw[1])
        boxes[..., 1::2] = boxes[..., 1::2].clamp(0, canvas_hw[0])
        scores_l.append(torch.gather(scores, 1, index))
        boxes_l.append(boxes)
        valid_l.append(top > score_thr)
        level_l.append(torch.full((index.shape[1],), level, dtype=torch.int64, device=index.device))
        index_l.append(index)
    return Candidates(
        scores=torch.cat(scores_l, dim=1),
        boxes=torch.cat(boxes_l, dim=1),
        valid=torch.cat(valid_l, dim=1),
        level=torch.cat(level_l),
        prior_index=torch.cat(index_l, dim=1),
    )


def rescale_boxes(boxes: torch.Tensor, scale_factors: Sequence[tuple[float, float]]) -> torch.Tensor:
    """Canvas -> original-image pixels: x·(1/w_scale), y·(1/h_scale), reciprocals taken in float64 then cast (§5.4).

    Args:
        boxes: (B, K, 4) float32 xyxy.
        scale_factors: per image (w_scale, h_scale) from :func:`letterbox`.
    """
    inverse = [[1.0 / w, 1.0 / h, 1.0 / w, 1.0 / h] for w, h in scale_factors]
    return boxes * torch.tensor(inverse, dtype=torch.float32, device=boxes.device).unsqueeze(1)  # (B, 1, 4)


def finalize_detections(
    candidates: Candidates, scale_factors: Sequence[tuple[float, float]], *, max_per_img: int = MAX_PER_IMG
) -> list[torch.Tensor]:
    """Rescale, drop boxes of non-positive width/height, sort all levels by score and keep ``max_per_img`` (§5.4–5.6).

    Returns:
        Per image a (N, 5) float32 tensor [x1, y1, x2, y2, score], original-image pixels, scores descending, N ≤
        ``max_per_img``. Boxes are not clipped to the image and can extend past it (§5.4).
    """
    boxes = rescale_boxes(candidates.boxes, scale_factors)
    valid = candidates.valid & (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])  # min_bbox_size 0
    # With nms=None, mmcv's batched_nms only sorts by descending score (§5.6).
    scores = candidates.scores.masked_fill(~valid, float("-inf"))
    top, index = scores.topk(min(max_per_img, scores.shape[1]), dim=1)  # (B, n)
    picked = torch.gather(boxes, 1, index.unsqueeze(-1).expand(-1, -1, 4))
    detections = torch.cat([picked, top.unsqueeze(-1)], dim=-1)  # (B, n, 5)
    counts = torch.isfinite(top).sum(dim=1).tolist()  # valid entries come first: they are sorted before the -inf
    return [detections[b, :count] for b, count in enumerate(counts)]


# ----------------------------------------------------------------------------------------------------------------
# User-facing detector
# ----------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _exact_fp32_convolutions(device: torch.device, allow_tf32: bool) -> Iterator[None]:
    """Run CUDA convolutions in true fp32 inside the block (cuDNN defaults to TF32, which breaks parity: §8)."""
    if device.type != "cuda" or allow_tf32:
        yield
        return
    # torch >= 2.9 has the per-backend fp32_precision setting; older versions only the allow_tf32 flag.
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is not None:
        owner, name, exact = conv, "fp32_precision", "ieee"
    else:
        owner, name, exact = torch.backends.cudnn, "allow_tf32", False
    previous = getattr(owner, name)
    setattr(owner, name, exact)
    try:
        yield
    finally:
        setattr(owner, name, previous)


class PersonDetector:
    """RTMDet-m person detector with the official pre/post-processing; images in, boxes out.

    ``detector(images)`` takes RGB uint8 (H, W, 3) arrays and returns per image a (N, 5) float32 array
    [x1, y1, x2, y2, score] in original-image pixels, scores descending, N ≤ 100, score > 0.05 — the output of
    mmdet's ``inference_detector`` with the Sapiens2 config (no NMS). The pose demo's filtering (score > 0.3, NMS 0.3,
    whole-image fallback) is ``sapiens2.pose.topdown.filter_detections``.

    Example:
        >>> detector = PersonDetector.from_checkpoint("rtmdet_m.pth", device="cpu")
        >>> detections = detector([image_rgb_a, image_rgb_b])  # list of (N, 5) float32 arrays
    """

    def __init__(
        self,
        model: RTMDet,
        *,
        device: torch.device | str | None = None,
        batch_size: int = 16,
        allow_tf32: bool = False,
    ) -> None:
        """Wrap a loaded ``model``; moves it to ``device`` (default: CUDA if available, else CPU) in eval mode.

        Args:
            model: RTMDet with weights loaded (BN fused or not).
            device: where the network and post-processing run.
            batch_size: images per forward pass.
            allow_tf32: let cuDNN use TF32 on CUDA (faster, but outside the fixtures' tolerances, DETECTOR.md §8).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = model.eval().to(self.device)
        self.batch_size = batch_size
        self.allow_tf32 = allow_tf32
        self._pin_memory = self.device.type == "cuda"

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path | None = None,
        device: torch.device | str | None = None,
        *,
        fuse_bn: bool = True,
        batch_size: int = 16,
        allow_tf32: bool = False,
    ) -> PersonDetector:
        """Load the official ``rtmdet_m.pth`` (mmengine format) from ``path``, or from the Hugging Face hub if None.

        Args:
            path: local .pth file; None downloads ``rtmdet_m.pth`` from ``facebook/sapiens-pose-bbox-detector``
                (cached by huggingface_hub).
            device: see :meth:`__init__`.
            fuse_bn: fold BatchNorm into the convs (faster; float32-rounding-level changes, DETECTOR.md §7).
            batch_size: images per forward pass.
            allow_tf32: see :meth:`__init__`.

        Raises:
            FileNotFoundError: no such file, or offline with nothing cached (the message names the repo and file).
            ValueError: the file is not weights-only loadable, or its keys/shapes are not RTMDet-m 1-class.
        """
        checkpoint = resolve_detector_checkpoint(path)
        model = build_detector_model(load_detector_state_dict(checkpoint), fuse_bn=fuse_bn)
        logger.info("person detector loaded from %s", checkpoint)
        return cls(model, device=device, batch_size=batch_size, allow_tf32=allow_tf32)

    def preprocess(self, images: Sequence[np.ndarray]) -> tuple[torch.Tensor, list[tuple[float, float]]]:
        """RGB uint8 images -> ((B, 3, 640, 640) float32 normalised BGR batch on the device, scale factors)."""
        # Letterbox straight into one (pinned, for an async copy to CUDA) uint8 batch; resize and pad are per channel,
        # so the RGB -> BGR swap can wait until the batch is on the device.
        batch = torch.empty((len(images), INPUT_SIZE, INPUT_SIZE, 3), dtype=torch.uint8, pin_memory=self._pin_memory)
        canvases = batch.numpy()
        scale_factors = [letterbox(image, out=canvases[i])[1] for i, image in enumerate(images)]
        batch = batch.to(self.device, non_blocking=True)  # (B, 640, 640, 3) uint8 RGB
        return normalize_bgr(rgb_to_bgr(batch)), scale_factors

    @torch.inference_mode()
    def detect_batch(self, images: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """One batch: preprocess, forward, post-process; returns per image a (N, 5) float32 tensor on the device."""
        inputs, scale_factors = self.preprocess(images)
        with _exact_fp32_convolutions(self.device, self.allow_tf32):
            cls_scores, bbox_preds = self.model(inputs)
        return finalize_detections(decode_candidates(cls_scores, bbox_preds), scale_factors)

    def __call__(self, images: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Detect people in RGB uint8 (H, W, 3) images; returns per image (N, 5) float32 [x1, y1, x2, y2, score]."""
        images = _check_images(images)
        results: list[np.ndarray] = []
        for start in range(0, len(images), self.batch_size):
            detections = self.detect_batch(images[start : start + self.batch_size])
            # One device -> host copy per batch, then split per image.
            flat = torch.cat(detections).cpu().numpy()
            results.extend(np.split(flat, np.cumsum([len(d) for d in detections])[:-1]))
        return results


def _check_images(images: Sequence[np.ndarray]) -> list[np.ndarray]:
    if isinstance(images, np.ndarray) or not isinstance(images, Sequence):
        raise TypeError("images must be a list of RGB uint8 (H, W, 3) arrays; wrap a single image as [image]")
    for index, image in enumerate(images):
        if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
            kind = image.dtype if isinstance(image, np.ndarray) else type(image).__name__
            raise TypeError(f"images[{index}] must be a uint8 numpy array (RGB, H×W×3), got {kind}")
        if image.ndim != 3 or image.shape[2] != 3 or image.shape[0] < 1 or image.shape[1] < 1:
            raise ValueError(
                f"images[{index}] has shape {image.shape}; expected (H, W, 3) RGB — convert grey/RGBA images first"
            )
    return list(images)
