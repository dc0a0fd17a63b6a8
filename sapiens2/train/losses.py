"""Training losses of the five Sapiens2 tasks, term by term as the official configs (DENSE.md §2.5, §3.3, §4.3, §5.3;
POSE.md §4.4).

Every task loss is an ``nn.Module`` whose ``forward`` returns a dict of named scalar terms (``loss_*`` already
weighted, ``acc_*`` logged only) plus ``"loss"``, the sum of the ``loss_*`` terms — the official loss parser's rule.
Images are ``(B, C, H, W)``; masks are boolean ``(B, 1, H, W)`` (``(B, H, W)`` is accepted); pixel ``u`` is the column,
``v`` the row. The unweighted term functions are public so they can be reused and tested on their own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sapiens2.metadata import seg_metadata

IGNORE_INDEX = 255


def seg_class_weights() -> tuple[float, ...]:
    """The 29 cross-entropy class weights of the released seg configs (``assets/seg29.json``)."""
    return seg_metadata().ce_class_weights


# ---------------------------------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------------------------------


def _as_mask(mask: Tensor, like: Tensor) -> Tensor:
    """Validity mask as float ``(B, 1, H, W)`` matching ``like``'s batch and spatial size."""
    if mask.dim() == 3:
        mask = mask.unsqueeze(1)
    if mask.dim() != 4 or mask.shape[1] != 1:
        raise ValueError(f"mask must have shape (B, 1, H, W) or (B, H, W), got {tuple(mask.shape)}")
    if mask.shape[0] != like.shape[0] or mask.shape[-2:] != like.shape[-2:]:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match the target's {tuple(like.shape)}")
    return mask.to(like.dtype)


def _resize_like(pred: Tensor, target: Tensor) -> Tensor:
    """Bilinearly resize ``pred`` to ``target``'s H×W (align_corners=False) when they differ, as the heads do."""
    if pred.shape[-2:] == target.shape[-2:]:
        return pred
    return F.interpolate(pred, size=target.shape[-2:], mode="bilinear", align_corners=False)


def _check_image_pair(pred: Tensor, target: Tensor, name: str) -> None:
    if pred.dim() != 4 or target.dim() != 4 or pred.shape[:2] != target.shape[:2]:
        raise ValueError(
            f"{name}: prediction {tuple(pred.shape)} and target {tuple(target.shape)} must both be (B, C, H, W) "
            "with the same B and C"
        )


def _empty_or(loss: Tensor, mask_sum: Tensor, pred: Tensor) -> Tensor:
    """``0 * pred.sum()`` (keeps the graph) when the mask is empty, else ``loss`` (DENSE.md §3.3, §4.3)."""
    return torch.where(mask_sum > 0, loss, pred.sum() * 0)


def _finite_or_zero(loss: Tensor) -> Tensor:
    """NaN/Inf losses become 0 (DENSE.md §3.3)."""
    return torch.where(torch.isfinite(loss), loss, torch.zeros_like(loss))


def _forward_differences(x: Tensor) -> tuple[Tensor, Tensor]:
    """Right and downward forward differences of ``(B, C, H, W)``: shapes ``(B, C, H, W-1)`` and ``(B, C, H-1, W)``."""
    return x[..., :, 1:] - x[..., :, :-1], x[..., 1:, :] - x[..., :-1, :]


# ---------------------------------------------------------------------------------------------------------------------
# Unweighted loss terms
# ---------------------------------------------------------------------------------------------------------------------


def masked_l1(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """``Σ m·|pred − target| / max(Σm, 1)`` with channels summed and a pixel-count denominator (DENSE.md §10.15).

    Args:
        pred, target: ``(B, C, H, W)``.
        mask: ``(B, 1, H, W)`` validity (bool or float).

    Returns:
        Scalar; ``0 * pred.sum()`` when the mask is empty.
    """
    _check_image_pair(pred, target, "masked_l1")
    mask = _as_mask(mask, target)
    mask_sum = mask.sum()
    loss = (mask * (pred - target).abs()).sum() / mask_sum.clamp(min=1)
    return _empty_or(loss, mask_sum, pred)


def squared_gradient_loss(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """The "grad L1" term of normals/albedo, which is a *squared* error of forward differences (DENSE.md §3.3).

    ``Σ m_x (Δx_p − Δx_t)² / max(Σ m_x, 1) + Σ m_y (Δy_p − Δy_t)² / max(Σ m_y, 1)`` where a pair counts only when
    both of its pixels are valid; channels are summed in the numerators.

    Args:
        pred, target: ``(B, C, H, W)``.
        mask: ``(B, 1, H, W)`` validity.

    Returns:
        Scalar; ``0 * pred.sum()`` when the mask is empty.
    """
    _check_image_pair(pred, target, "squared_gradient_loss")
    mask = _as_mask(mask, target)
    pred_dx, pred_dy = _forward_differences(pred)
    target_dx, target_dy = _forward_differences(target)
    mask_x = mask[..., :, 1:] * mask[..., :, :-1]
    mask_y = mask[..., 1:, :] * mask[..., :-1, :]
    loss_x = (mask_x * (pred_dx - target_dx).pow(2)).sum() / mask_x.sum().clamp(min=1)
    loss_y = (mask_y * (pred_dy - target_dy).pow(2)).sum() / mask_y.sum().clamp(min=1)
    return _empty_or(loss_x + loss_y, mask.sum(), pred)


def cosine_loss(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Normal cosine term ``Σ m·(1 − n̂_p·n̂_t) / max(Σm, 1)``, both normalised with the norm floored at 1e-6.

    Args:
        pred, target: ``(B, 3, H, W)`` normals (the prediction is not unit length).
        mask: ``(B, 1, H, W)`` validity.

    Returns:
        Scalar; ``0 * pred.sum()`` when the mask is empty.
    """
    _check_image_pair(pred, target, "cosine_loss")
    mask = _as_mask(mask, target)
    cosine = (F.normalize(pred, dim=1, eps=1e-6) * F.normalize(target, dim=1, eps=1e-6)).sum(dim=1, keepdim=True)
    mask_sum = mask.sum()
    loss = (mask * (1 - cosine)).sum() / mask_sum.clamp(min=1)
    return _empty_or(loss, mask_sum, pred)


def cross_entropy_loss(logits: Tensor, labels: Tensor, class_weight: Tensor | None, ignore_index: int) -> Tensor:
    """Class-weighted cross-entropy averaged over *all* pixels, ignored ones included (DENSE.md §2.5, §10.16).

    Args:
        logits: ``(B, C, H, W)``.
        labels: ``(B, H, W)`` int64 class ids, ``ignore_index`` for unlabelled pixels.
        class_weight: ``(C,)`` or None.
        ignore_index: label value that contributes 0.

    Returns:
        Scalar ``Σ_{valid} w[y]·(−log softmax(z)[y]) / (B·H·W)`` (not normalised by the weights).
    """
    per_pixel = F.cross_entropy(logits, labels, weight=class_weight, reduction="none", ignore_index=ignore_index)
    return per_pixel.mean()


def dice_loss(logits: Tensor, labels: Tensor, ignore_index: int, eps: float = 1e-3) -> Tensor:
    """Softmax Dice with squared denominators, background excluded, averaged over present classes (DENSE.md §2.5).

    Args:
        logits: ``(B, C, H, W)``.
        labels: ``(B, H, W)`` int64 class ids.
        ignore_index: label value zeroed out of both prediction and one-hot target.
        eps: smoothing added to numerator and denominator.

    Returns:
        Scalar: mean over B of ``1 − mean_{present c ≥ 1} D_bc``; a sample without valid pixels or without a present
        foreground class contributes 0 but still counts in the mean.
    """
    num_classes = logits.shape[1]
    valid = labels != ignore_index  # (B, H, W)
    probs = logits.softmax(dim=1) * valid.unsqueeze(1)
    one_hot = F.one_hot(torch.where(valid, labels, 0), num_classes).permute(0, 3, 1, 2).to(probs.dtype)
    one_hot = one_hot * valid.unsqueeze(1)
    probs, one_hot = probs[:, 1:].flatten(2), one_hot[:, 1:].flatten(2)  # (B, C-1, H*W): background dropped
    numerator = 2 * (probs * one_hot).sum(dim=2) + eps
    denominator = probs.pow(2).sum(dim=2) + one_hot.pow(2).sum(dim=2) + eps
    dice = numerator / denominator  # (B, C-1)
    present = (one_hot.sum(dim=2) > 0).to(dice.dtype)
    num_present = present.sum(dim=1)
    score = (dice * present).sum(dim=1) / num_present.clamp(min=1)
    keep = (valid.flatten(1).any(dim=1) & (num_present > 0)).to(dice.dtype)
    return ((1 - score) * keep).mean()


def pixel_accuracy(logits: Tensor, labels: Tensor, ignore_index: int) -> Tensor:
    """Top-1 pixel accuracy in percent over non-ignored pixels (the logged ``acc_seg``; mmseg ``accuracy``)."""
    with torch.no_grad():
        valid = labels != ignore_index
        correct = ((logits.argmax(dim=1) == labels) & valid).sum().to(logits.dtype)
        # The float32 eps in the denominator follows the reference; it only matters for an all-ignored batch.
        return correct * (100.0 / (valid.sum().item() + torch.finfo(torch.float32).eps))


def silog_loss(pred_z: Tensor, target_z: Tensor, mask: Tensor, variance_focus: float = 0.5) -> Tensor:
    """Scale-invariant log loss on depth: per sample ``sqrt(Σd²/n − λ(Σd/n)²)``, mean over B (DENSE.md §4.3).

    Validity is ``mask ∧ target > −100 ∧ not NaN`` (the −100 threshold is the reference's, §10.20); both depths are
    floored at 1e-4 before the log, so predictions at or below it get no gradient.

    Args:
        pred_z, target_z: ``(B, 1, H, W)`` canonical Z.
        mask: ``(B, 1, H, W)``.
        variance_focus: λ.

    Returns:
        Scalar.
    """
    valid = _as_mask(mask, target_z).bool() & (target_z > -100) & ~torch.isnan(target_z)
    diff = torch.log(target_z.clamp(min=1e-4)) - torch.log(pred_z.clamp(min=1e-4))
    diff = torch.where(valid, diff, torch.zeros_like(diff)).flatten(1)
    count = valid.flatten(1).sum(dim=1).to(diff.dtype).clamp(min=1e-4)
    mean_sq = diff.pow(2).sum(dim=1) / count
    mean = diff.sum(dim=1) / count
    return torch.sqrt(mean_sq - variance_focus * mean.pow(2)).mean()


def intrinsics_consistency_loss(pred: Tensor, mask: Tensor, intrinsics: Tensor) -> Tensor:
    """How far predicted X, Y are from re-projecting the pixel grid at the predicted Z through K (DENSE.md §4.3).

    ``Σ m·(|P_x − (u − cx)·P_z/fx| + |P_y − (v − cy)·P_z/fy|) / max(Σm, 1)``; NaN/Inf → 0.

    Args:
        pred: ``(B, 3, H, W)`` canonical pointmap.
        mask: ``(B, 1, H, W)``.
        intrinsics: ``(B, 3, 3)`` camera matrices at the H×W frame (the GT's ``original_K``).

    Returns:
        Scalar; ``0 * pred.sum()`` when the mask is empty.
    """
    mask = _as_mask(mask, pred)
    height, width = pred.shape[-2:]
    fx, fy = intrinsics[:, 0, 0].view(-1, 1, 1), intrinsics[:, 1, 1].view(-1, 1, 1)
    cx, cy = intrinsics[:, 0, 2].view(-1, 1, 1), intrinsics[:, 1, 2].view(-1, 1, 1)
    v, u = torch.meshgrid(
        torch.arange(height, device=pred.device, dtype=pred.dtype),
        torch.arange(width, device=pred.device, dtype=pred.dtype),
        indexing="ij",
    )
    x_hat = (u - cx) * pred[:, 2] / fx
    y_hat = (v - cy) * pred[:, 2] / fy
    error = (pred[:, 0] - x_hat).abs() + (pred[:, 1] - y_hat).abs()
    mask_sum = mask.sum()
    loss = (mask[:, 0] * error).sum() / mask_sum.clamp(min=1)
    return _finite_or_zero(_empty_or(loss, mask_sum, pred))


def shift_invariant_l1(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """:func:`masked_l1` after removing each map's per-sample, per-channel masked centroid (``Σm·x / (Σm + 1e-6)``)."""
    mask_f = _as_mask(mask, target)
    count = mask_f.sum(dim=(2, 3), keepdim=True) + 1e-6
    pred_centred = pred - (pred * mask_f).sum(dim=(2, 3), keepdim=True) / count
    target_centred = target - (target * mask_f).sum(dim=(2, 3), keepdim=True) / count
    return masked_l1(pred_centred, target_centred, mask_f)


def pointmap_normals(points: Tensor, amplify: float = 100.0) -> tuple[Tensor, Tensor]:
    """Surface normals of a ``(B, 3, H, W)`` pointmap from reflect-padded right/down forward differences.

    Both differences are multiplied by ``amplify`` before the cross product (DENSE.md §4.3), which keeps small
    metric steps well above the 1e-6 validity floor.

    Returns:
        ``(normals (B, 3, H, W) unit or zero, valid (B, 1, H, W) bool: |cross| > 1e-6)``.
    """
    padded = F.pad(points, (1, 1, 1, 1), mode="reflect")
    centre = padded[..., 1:-1, 1:-1]
    d_right = (padded[..., 1:-1, 2:] - centre) * amplify
    d_down = (padded[..., 2:, 1:-1] - centre) * amplify
    cross = torch.cross(d_right, d_down, dim=1)
    norm = cross.norm(dim=1, keepdim=True)
    return cross / norm.clamp(min=1e-6), norm > 1e-6


def pointmap_normal_loss(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Angular + L1 difference of normals derived from two pointmaps, where the target normal is valid.

    ``Σ v·[(1 − clamp(n_p·n_t, −1, 1)) + mean_c |n_p − n_t|] / max(Σv, 1)`` with ``v = mask ∧ target-normal valid``.

    Args:
        pred, target: ``(B, 3, H, W)`` metric pointmaps (the task divides both by the GT scale first).
        mask: ``(B, 1, H, W)``.

    Returns:
        Scalar; ``0 * pred.sum()`` when the mask is empty.
    """
    mask_f = _as_mask(mask, target)
    pred_normals, _ = pointmap_normals(pred)
    target_normals, target_valid = pointmap_normals(target)
    valid = mask_f * target_valid.to(mask_f.dtype)
    cosine = (pred_normals * target_normals).sum(dim=1, keepdim=True).clamp(-1, 1)
    l1 = (pred_normals - target_normals).abs().mean(dim=1, keepdim=True)
    valid_sum = valid.sum()
    loss = (valid * ((1 - cosine) + l1)).sum() / valid_sum.clamp(min=1)
    return _empty_or(loss, mask_f.sum(), pred)


def chromaticity_l1(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """L1 between chromaticities ``X / (Σ_c X + 1e-6)``, the prediction first clamped to [0, 1] (DENSE.md §5.3)."""
    pred = pred.clamp(0, 1)
    pred_chroma = pred / (pred.sum(dim=1, keepdim=True) + 1e-6)
    target_chroma = target / (target.sum(dim=1, keepdim=True) + 1e-6)
    return masked_l1(pred_chroma, target_chroma, mask)


def keypoint_mse(pred: Tensor, target: Tensor, keypoint_weights: Tensor) -> Tensor:
    """``mean_{b,k,y,x} w_{b,k}·(pred − target)²`` over *all* elements (POSE.md §4.4, before the ×10 weight).

    Args:
        pred, target: ``(B, K, H, W)`` heatmaps; ``pred`` is cast to ``target``'s dtype first.
        keypoint_weights: ``(B, K)`` or ``(B, 1, K)``.
    """
    weights = keypoint_weights.reshape(target.shape[0], target.shape[1], 1, 1)
    return (F.mse_loss(pred.to(target.dtype), target, reduction="none") * weights).mean()


def _heatmap_argmax(heatmaps: Tensor) -> Tensor:
    """(x, y) of each ``(B, K, H, W)`` heatmap's first maximum as float ``(B, K, 2)``; −1 where the maximum ≤ 0."""
    batch, keypoints, _, width = heatmaps.shape
    values, index = heatmaps.flatten(2).max(dim=2)
    locations = torch.stack([index % width, torch.div(index, width, rounding_mode="floor")], dim=-1).float()
    return torch.where((values <= 0).unsqueeze(-1), torch.full_like(locations, -1.0), locations)


def pose_pck_accuracy(pred: Tensor, target: Tensor, keypoint_weights: Tensor, threshold: float = 0.05) -> float:
    """mmpose-style PCK of heatmap argmaxes: per-keypoint accuracy over the batch, averaged over keypoints that have
    any labelled sample (the logged ``acc_pose``, POSE.md §4.4).

    Distances divide (x, y) by (H, W) in that order — the reference's normalisation, kept as is.

    Args:
        pred, target: ``(B, K, H, W)`` heatmaps.
        keypoint_weights: ``(B, K)`` or ``(B, 1, K)``; a keypoint counts where its weight is > 0.
        threshold: normalised distance below which a keypoint is correct.

    Returns:
        Accuracy in [0, 1] (0.0 when nothing is labelled).
    """
    with torch.no_grad():
        height, width = target.shape[-2:]
        labelled = keypoint_weights.reshape(target.shape[0], target.shape[1]) > 0
        pred_xy, target_xy = _heatmap_argmax(pred.float()), _heatmap_argmax(target.float())
        norm = torch.tensor([height, width], dtype=torch.float32, device=target.device)
        distance = ((pred_xy - target_xy) / norm).norm(dim=-1)  # (B, K)
        hits = ((distance < threshold) & labelled).sum(dim=0).double()
        counts = labelled.sum(dim=0).double()
        has_label = counts > 0
        if not bool(has_label.any()):
            return 0.0
        return float((hits[has_label] / counts[has_label]).mean())


# ---------------------------------------------------------------------------------------------------------------------
# Task losses
# ---------------------------------------------------------------------------------------------------------------------


def _total(terms: dict[str, Tensor]) -> dict[str, Tensor]:
    """Add ``"loss"``: the sum of every term whose name contains "loss" (the official loss parser)."""
    terms["loss"] = sum(value for name, value in terms.items() if "loss" in name)
    return terms


class SegLoss(nn.Module):
    """Body-part segmentation: weighted cross-entropy + Dice, and the logged pixel accuracy (DENSE.md §2.5).

    Args:
        class_weight: per-class CE weights; defaults to the released 29-class table.
        ce_weight, dice_weight: term weights (1.0 each in every release).
        ignore_index: unlabelled pixel value.
    """

    def __init__(
        self,
        class_weight: list[float] | tuple[float, ...] | None = None,
        *,
        ce_weight: float = 1.0,
        dice_weight: float = 1.0,
        ignore_index: int = IGNORE_INDEX,
    ) -> None:
        super().__init__()
        weights = seg_class_weights() if class_weight is None else tuple(class_weight)
        self.register_buffer("class_weight", torch.tensor(weights, dtype=torch.float32), persistent=False)
        self.ce_weight = ce_weight
        self.dice_weight = dice_weight
        self.ignore_index = ignore_index

    def forward(self, logits: Tensor, labels: Tensor) -> dict[str, Tensor]:
        """Args: logits ``(B, C, h, w)``; labels ``(B, 1, H, W)`` or ``(B, H, W)`` int class ids.

        Returns: ``loss_ce``, ``loss_dice``, ``acc_seg`` (percent) and ``loss``.
        """
        if labels.dim() == 4:
            labels = labels.squeeze(1)
        if logits.dim() != 4 or labels.dim() != 3 or logits.shape[0] != labels.shape[0]:
            raise ValueError(
                f"expected logits (B, C, h, w) and labels (B, H, W), got {tuple(logits.shape)} and "
                f"{tuple(labels.shape)}"
            )
        if logits.shape[1] != self.class_weight.numel():
            raise ValueError(
                f"logits have {logits.shape[1]} classes but {self.class_weight.numel()} class weights "
                "were given; pass class_weight= with one weight per class"
            )
        labels = labels.long()
        logits = _resize_like(logits, labels.unsqueeze(1))
        weight = self.class_weight.to(device=logits.device, dtype=logits.dtype)
        return _total(
            {
                "loss_ce": self.ce_weight * cross_entropy_loss(logits, labels, weight, self.ignore_index),
                "loss_dice": self.dice_weight * dice_loss(logits, labels, self.ignore_index),
                "acc_seg": pixel_accuracy(logits.detach(), labels, self.ignore_index),
            }
        )


class NormalLoss(nn.Module):
    """Surface normals: 10·cosine + 1·L1 + 10·squared gradient (DENSE.md §3.3).

    The target is expected sanitised (unit inside the mask); the raw, unnormalised prediction enters L1 and gradient.
    """

    def __init__(self, *, cosine_weight: float = 10.0, l1_weight: float = 1.0, grad_weight: float = 10.0) -> None:
        super().__init__()
        self.cosine_weight = cosine_weight
        self.l1_weight = l1_weight
        self.grad_weight = grad_weight

    def forward(self, pred: Tensor, gt_normal: Tensor, mask: Tensor) -> dict[str, Tensor]:
        """Args: pred ``(B, 3, h, w)``; gt_normal ``(B, 3, H, W)``; mask ``(B, 1, H, W)``.

        Returns: ``loss_cosine_sim``, ``loss_l1``, ``loss_grad_l1`` and ``loss``.
        """
        pred = _resize_like(pred, gt_normal)
        return _total(
            {
                "loss_cosine_sim": self.cosine_weight * _finite_or_zero(cosine_loss(pred, gt_normal, mask)),
                "loss_l1": self.l1_weight * _finite_or_zero(masked_l1(pred, gt_normal, mask)),
                "loss_grad_l1": self.grad_weight * _finite_or_zero(squared_gradient_loss(pred, gt_normal, mask)),
            }
        )


class PointmapLoss(nn.Module):
    """Pointmap + scale: the seven terms of DENSE.md §4.3.

    L1-family terms compare P/μ with G/μ (μ = GT mean canonical depth) and are clamped at ``clamp_max`` *after*
    weighting; SiLog works on canonical Z; the normal term works on metric maps P/s and G/s with the GT scale s.
    """

    def __init__(
        self,
        *,
        l1_weight: float = 2.0,
        multiscale_weight: float = 1.0,
        multiscale_factor: int = 2,
        silog_weight: float = 1.0,
        intrinsics_weight: float = 1.0,
        shift_invariant_weight: float = 1.0,
        normal_weight: float = 2.0,
        scale_weight: float = 4.0,
        clamp_max: float = 4.0,
    ) -> None:
        super().__init__()
        self.l1_weight = l1_weight
        self.multiscale_weight = multiscale_weight
        self.multiscale_factor = multiscale_factor
        self.silog_weight = silog_weight
        self.intrinsics_weight = intrinsics_weight
        self.shift_invariant_weight = shift_invariant_weight
        self.normal_weight = normal_weight
        self.scale_weight = scale_weight
        self.clamp_max = clamp_max

    def forward(
        self,
        pred: Tensor,
        pred_scale: Tensor,
        gt_pointmap: Tensor,
        mask: Tensor,
        gt_mean_depth: Tensor,
        scale: Tensor,
        original_K: Tensor,  # noqa: N803 - the official meta key
    ) -> dict[str, Tensor]:
        """Args:
            pred: ``(B, 3, h, w)`` canonical pointmap; pred_scale: ``(B, 1)`` or ``(B,)`` predicted 768/fx.
            gt_pointmap: ``(B, 3, H, W)`` canonical GT; mask: ``(B, 1, H, W)``.
            gt_mean_depth: per-sample mean canonical Z, any shape with B elements; scale: GT scale, B elements.
            original_K: ``(B, 3, 3)`` intrinsics at the H×W frame before canonicalisation.

        Returns: ``loss_l1``, ``loss_multiscale_l1_<f>``, ``loss_silog``, ``loss_K_consistency``,
        ``loss_shift_invariant``, ``loss_normal``, ``loss_scale_l1`` and ``loss``.
        """
        batch = gt_pointmap.shape[0]
        for name, value in (("pred_scale", pred_scale), ("gt_mean_depth", gt_mean_depth), ("scale", scale)):
            if value.numel() != batch:
                raise ValueError(f"{name} must hold one value per sample ({batch}), got shape {tuple(value.shape)}")
        if original_K.shape != (batch, 3, 3):
            raise ValueError(f"original_K must have shape ({batch}, 3, 3), got {tuple(original_K.shape)}")
        pred = _resize_like(pred, gt_pointmap)
        mask_f = _as_mask(mask, gt_pointmap)
        mean_depth = gt_mean_depth.reshape(batch, 1, 1, 1).to(pred.dtype)
        pred_rel, gt_rel = pred / mean_depth, gt_pointmap / mean_depth

        factor = self.multiscale_factor
        pred_up = F.interpolate(pred_rel, scale_factor=factor, mode="bilinear", align_corners=False)
        gt_up = F.interpolate(gt_rel, scale_factor=factor, mode="bilinear", align_corners=False)
        mask_up = F.interpolate(mask_f, scale_factor=factor, mode="nearest")

        gt_scale = scale.reshape(batch, 1, 1, 1).to(pred.dtype)
        scale_error = (pred_scale.reshape(batch) - scale.reshape(batch).to(pred_scale.dtype)).abs().mean()
        clamp = self.clamp_max
        return _total(
            {
                "loss_l1": (self.l1_weight * masked_l1(pred_rel, gt_rel, mask_f)).clamp(max=clamp),
                f"loss_multiscale_l1_{factor}": (self.multiscale_weight * masked_l1(pred_up, gt_up, mask_up)).clamp(
                    max=clamp
                ),
                "loss_silog": self.silog_weight
                * _empty_or(silog_loss(pred[:, 2:3], gt_pointmap[:, 2:3], mask_f), mask_f.sum(), pred),
                "loss_K_consistency": self.intrinsics_weight
                * intrinsics_consistency_loss(pred, mask_f, original_K.to(pred.dtype)),
                "loss_shift_invariant": (
                    self.shift_invariant_weight * shift_invariant_l1(pred_rel, gt_rel, mask_f)
                ).clamp(max=clamp),
                "loss_normal": self.normal_weight
                * pointmap_normal_loss(pred / gt_scale, gt_pointmap / gt_scale, mask_f),
                "loss_scale_l1": self.scale_weight * scale_error,
            }
        )


class AlbedoLoss(nn.Module):
    """Albedo: 2·L1 + 2·(0.5·squared gradient) + 1·chromaticity L1 (DENSE.md §5.3)."""

    def __init__(self, *, l1_weight: float = 2.0, grad_weight: float = 2.0, chroma_weight: float = 1.0) -> None:
        super().__init__()
        self.l1_weight = l1_weight
        self.grad_weight = grad_weight
        self.chroma_weight = chroma_weight

    def forward(self, pred: Tensor, gt_albedo: Tensor, mask: Tensor) -> dict[str, Tensor]:
        """Args: pred ``(B, 3, h, w)`` raw RGB; gt_albedo ``(B, 3, H, W)`` in [0, 1]; mask ``(B, 1, H, W)``.

        Returns: ``loss_l1``, ``loss_grad_l1``, ``loss_chroma_l1`` and ``loss``.
        """
        pred = _resize_like(pred, gt_albedo)
        return _total(
            {
                "loss_l1": self.l1_weight * masked_l1(pred, gt_albedo, mask),
                # The albedo gradient term halves the normal one's x + y sum (DENSE.md §5.3).
                "loss_grad_l1": self.grad_weight * 0.5 * squared_gradient_loss(pred, gt_albedo, mask),
                "loss_chroma_l1": self.chroma_weight * chromaticity_l1(pred, gt_albedo, mask),
            }
        )


class PoseLoss(nn.Module):
    """Top-down pose: keypoint-weighted heatmap MSE ×10 and the logged PCK accuracy (POSE.md §4.4)."""

    def __init__(self, *, loss_weight: float = 10.0, pck_threshold: float = 0.05) -> None:
        super().__init__()
        self.loss_weight = loss_weight
        self.pck_threshold = pck_threshold

    def forward(self, pred: Tensor, heatmaps: Tensor, keypoint_weights: Tensor) -> dict[str, Tensor]:
        """Args: pred, heatmaps ``(B, K, H, W)``; keypoint_weights ``(B, K)`` or ``(B, 1, K)``.

        Returns: ``loss_kpt``, ``acc_pose`` (fraction, float64 tensor) and ``loss``.
        """
        if pred.shape != heatmaps.shape:
            raise ValueError(f"pred {tuple(pred.shape)} and heatmaps {tuple(heatmaps.shape)} must have the same shape")
        if keypoint_weights.numel() != heatmaps.shape[0] * heatmaps.shape[1]:
            raise ValueError(
                f"keypoint_weights must hold B*K = {heatmaps.shape[0] * heatmaps.shape[1]} values, "
                f"got shape {tuple(keypoint_weights.shape)}"
            )
        accuracy = pose_pck_accuracy(pred, heatmaps, keypoint_weights, self.pck_threshold)
        return _total(
            {
                "loss_kpt": self.loss_weight * keypoint_mse(pred, heatmaps, keypoint_weights),
                "acc_pose": torch.tensor(accuracy, dtype=torch.float64, device=heatmaps.device),
            }
        )


TASK_LOSSES: dict[str, type[nn.Module]] = {
    "seg": SegLoss,
    "normal": NormalLoss,
    "pointmap": PointmapLoss,
    "albedo": AlbedoLoss,
    "pose": PoseLoss,
}


def build_loss(task: str, **overrides: object) -> nn.Module:
    """The released configuration's loss for ``task``, with keyword ``overrides`` of its weights.

    Example:
        >>> criterion = build_loss("normal", grad_weight=5.0)
        >>> terms = criterion(pred, gt_normal, mask)  # terms["loss"] is what to backpropagate
    """
    if task not in TASK_LOSSES:
        raise ValueError(f"unknown task {task!r}; choose one of {sorted(TASK_LOSSES)}")
    return TASK_LOSSES[task](**overrides)
