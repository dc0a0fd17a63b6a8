"""Validation metrics of the four dense tasks, pooled over a whole dataset as the official evaluators do
(DENSE.md §2.6, §3.4, §4.4, §5.4).

Each metric is an accumulator: call ``update`` once per batch, then ``compute()`` once for a dict of Python floats.
Statistics are pooled over every valid pixel seen (never averaged per image) and kept as float64 / int64 tensors on
the device of the first batch, so nothing synchronises with the host until ``compute``. Predictions whose H×W differs
from the ground truth are bilinearly resized to it (align_corners=False) — padding is *not* removed, like the
reference (§10.6). Images are ``(B, C, H, W)``; masks ``(B, 1, H, W)`` or ``(B, H, W)``, non-zero = valid.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

NORMAL_THRESHOLDS_DEG = (5.0, 11.25, 22.5, 30.0)
POINTMAP_THRESHOLDS = (0.05, 0.10, 0.20)


def _resize_to(pred: Tensor, size: tuple[int, int]) -> Tensor:
    if tuple(pred.shape[-2:]) == tuple(size):
        return pred
    return F.interpolate(pred, size=size, mode="bilinear", align_corners=False)


def _check_batch(pred: Tensor, target: Tensor, mask: Tensor, channels: int, name: str) -> tuple[Tensor, Tensor, Tensor]:
    """Validate shapes; return (pred resized to the target's H×W, target, bool mask ``(B, H, W)``)."""
    if pred.dim() != 4 or target.dim() != 4 or pred.shape[1] != channels or target.shape[1] != channels:
        raise ValueError(
            f"{name}: pred and target must be (B, {channels}, H, W), got {tuple(pred.shape)} and {tuple(target.shape)}"
        )
    if pred.shape[0] != target.shape[0]:
        raise ValueError(f"{name}: batch sizes differ (pred {pred.shape[0]}, target {target.shape[0]})")
    if mask.dim() == 4:
        if mask.shape[1] != 1:
            raise ValueError(f"{name}: mask must be (B, 1, H, W) or (B, H, W), got {tuple(mask.shape)}")
        mask = mask[:, 0]
    if mask.shape != (target.shape[0], *target.shape[-2:]):
        raise ValueError(f"{name}: mask shape {tuple(mask.shape)} does not match target {tuple(target.shape)}")
    return _resize_to(pred, target.shape[-2:]), target, mask > 0


def _pooled(total: Tensor | None, batch: Tensor) -> Tensor:
    """Running sum of per-batch statistics: the first batch's tensor, then added in place."""
    return batch if total is None else total.add_(batch)


def _angle_deg(a: Tensor, b: Tensor) -> Tensor:
    """Angle in degrees between unit vectors along dim 1, the cosine clamped to [−1, 1]."""
    return torch.rad2deg(torch.acos((a * b).sum(dim=1).clamp(-1.0, 1.0)))


class SegMetrics:
    """aAcc / mIoU / mAcc of body-part segmentation from dataset-level per-class areas (DENSE.md §2.6).

    Args:
        num_classes: number of classes C.
        ignore_index: label value excluded from every area.
        nan_to_num: value given to classes with zero union (IoU) or zero label area (Acc) before the class mean; the
            released configs use 0, so absent classes pull the means down.

    Example:
        >>> metric = SegMetrics()
        >>> metric.update(logits, labels); metric.compute()["mIoU"]
    """

    def __init__(self, num_classes: int = 29, *, ignore_index: int = 255, nan_to_num: float | None = 0.0) -> None:
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.nan_to_num = nan_to_num
        self.reset()

    def reset(self) -> None:
        """Forget every batch seen so far."""
        self._intersect: Tensor | None = None  # (C,) int64 areas
        self._pred: Tensor | None = None
        self._label: Tensor | None = None

    def update(self, logits: Tensor, labels: Tensor | list[Tensor]) -> None:
        """Add one batch.

        Args:
            logits: ``(B, C, h, w)`` raw class scores.
            labels: ``(B, H, W)`` / ``(B, 1, H, W)`` int class ids, or a list of B ``(H_i, W_i)`` maps at each image's
                native size (the seg val collate). Logits are resized per image to its label size, then argmaxed.
        """
        if logits.dim() != 4 or logits.shape[1] != self.num_classes:
            raise ValueError(f"logits must be (B, {self.num_classes}, h, w), got {tuple(logits.shape)}")
        if isinstance(labels, Tensor) and labels.dim() == 4:
            labels = labels[:, 0]
        if len(labels) != logits.shape[0]:
            raise ValueError(f"got {len(labels)} label maps for a batch of {logits.shape[0]} logits")
        for image_logits, label in zip(logits, labels, strict=True):
            if label.dim() != 2:
                raise ValueError(f"each label map must be (H, W), got {tuple(label.shape)}")
            label = label.to(image_logits.device).long()
            self._add(_resize_to(image_logits[None], tuple(label.shape))[0].argmax(dim=0), label)

    def update_labels(self, pred: Tensor, labels: Tensor) -> None:
        """Add predicted class ids instead of logits (what ``Predictor`` returns): pred and labels ``(B, H, W)``."""
        if pred.shape != labels.shape or pred.dim() != 3:
            raise ValueError(
                f"pred and labels must both be (B, H, W), got {tuple(pred.shape)} and {tuple(labels.shape)}"
            )
        if bool(((pred < 0) | (pred >= self.num_classes)).any()):
            raise ValueError(f"predicted ids must be in [0, {self.num_classes})")
        for image_pred, label in zip(pred, labels, strict=True):
            self._add(image_pred.to(label.device).long(), label.long())

    def _add(self, pred: Tensor, label: Tensor) -> None:
        """Accumulate one image's (H, W) predicted and labelled ids."""
        valid = label != self.ignore_index
        pred, label = pred[valid], label[valid]
        if bool(((label < 0) | (label >= self.num_classes)).any()):
            raise ValueError(f"labels must be in [0, {self.num_classes}) or {self.ignore_index} (ignore)")
        counts = [torch.bincount(values, minlength=self.num_classes) for values in (label[pred == label], pred, label)]
        if self._intersect is None:
            self._intersect, self._pred, self._label = counts
        else:
            self._intersect += counts[0]
            self._pred += counts[1]
            self._label += counts[2]

    def label_areas(self) -> Tensor:
        """Labelled pixels per class, int64 ``(C,)`` (ignored pixels excluded)."""
        if self._label is None:
            raise RuntimeError("SegMetrics.label_areas() called before any update(); feed at least one batch")
        return self._label.clone()

    def class_scores(self) -> dict[str, Tensor]:
        """Per-class ``IoU`` and ``Acc`` (fractions, float64 ``(C,)``; NaN where undefined, before ``nan_to_num``)."""
        if self._intersect is None:
            raise RuntimeError("SegMetrics.compute() called before any update(); feed at least one batch")
        intersect, pred, label = (area.double() for area in (self._intersect, self._pred, self._label))
        union = pred + label - intersect
        return {"IoU": intersect / union, "Acc": intersect / label}

    def compute(self) -> dict[str, float]:
        """``aAcc``, ``mIoU``, ``mAcc`` in percent, rounded to 2 decimals as the reference reports them."""
        scores = self.class_scores()
        total_acc = self._intersect.sum().double() / self._label.sum().double()
        result = {"aAcc": total_acc}
        for name, per_class in scores.items():
            if self.nan_to_num is not None:
                per_class = torch.nan_to_num(per_class, nan=self.nan_to_num)
            result[f"m{name}"] = per_class.nanmean()
        return {name: round(float(value) * 100, 2) for name, value in result.items()}


class NormalMetrics:
    """Angular error statistics of surface normals over all valid pixels of a dataset (DENSE.md §3.4).

    ``compute()`` gives ``normal_mae``, ``normal_rmse``, ``normal_median_deg`` (degrees; the median is the centre of
    the first 0.5° histogram bin whose cumulative count reaches N/2) and ``within_<t>_deg`` in **percent** for
    t ∈ {5, 11.25, 22.5, 30} (strictly below t).
    """

    bin_width_deg = 0.5
    num_bins = 360

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every batch seen so far."""
        self._sums: Tensor | None = None  # float64 (count, Σθ, Σθ²)
        self._within: Tensor | None = None  # int64 per threshold
        self._histogram: Tensor | None = None  # int64 (num_bins,)

    def update(self, pred: Tensor, target: Tensor, mask: Tensor) -> None:
        """Add one batch: pred ``(B, 3, h, w)`` raw normals, target ``(B, 3, H, W)``, mask ``(B, 1, H, W)``.

        Both are L2-normalised (norm floored at 1e-6) after resizing the prediction; the angle is taken in the
        inputs' dtype and accumulated in float64.
        """
        pred, target, mask = _check_batch(pred, target, mask, 3, "NormalMetrics")
        angle = _angle_deg(F.normalize(pred, dim=1, eps=1e-6), F.normalize(target, dim=1, eps=1e-6))
        angle = angle[mask.to(angle.device)].double()
        sums = torch.stack([angle.new_tensor(angle.numel()), angle.sum(), angle.pow(2).sum()])
        within = torch.stack([(angle < t).sum() for t in NORMAL_THRESHOLDS_DEG])
        bins = torch.floor(angle / self.bin_width_deg).long().clamp(0, self.num_bins - 1)
        histogram = torch.bincount(bins, minlength=self.num_bins)
        if self._sums is None:
            self._sums, self._within, self._histogram = sums, within, histogram
        else:
            self._sums += sums
            self._within += within
            self._histogram += histogram

    def histogram(self) -> Tensor:
        """Valid pixels per angular-error bin, int64 ``(num_bins,)``: bin i counts [i, i + 1) x ``bin_width_deg``
        degrees (the last bin also holds everything above)."""
        if self._histogram is None:
            raise RuntimeError("NormalMetrics.histogram() called before any update(); feed at least one batch")
        return self._histogram.clone()

    def compute(self) -> dict[str, float]:
        """The pooled statistics (see the class docstring); NaN everywhere when no valid pixel was seen."""
        if self._sums is None:
            raise RuntimeError("NormalMetrics.compute() called before any update(); feed at least one batch")
        count, total, total_sq = (float(v) for v in self._sums)
        if count == 0:
            names = ["normal_mae", "normal_rmse", "normal_median_deg"] + [
                _within_deg_name(t) for t in NORMAL_THRESHOLDS_DEG
            ]
            return dict.fromkeys(names, math.nan)
        cumulative = torch.cumsum(self._histogram, dim=0).double()
        median_bin = int(torch.nonzero(cumulative >= count / 2)[0, 0])
        result = {
            "normal_mae": total / count,
            "normal_rmse": math.sqrt(total_sq / count),
            "normal_median_deg": (median_bin + 0.5) * self.bin_width_deg,
        }
        for threshold, hits in zip(NORMAL_THRESHOLDS_DEG, self._within.tolist(), strict=True):
            result[_within_deg_name(threshold)] = 100.0 * hits / count
        return result


def _within_deg_name(threshold: float) -> str:
    """``within_5_0_deg``-style key (the decimal point becomes an underscore)."""
    return f"within_{str(float(threshold)).replace('.', '_')}_deg"


def _sobel5_pass(x: Tensor, dim: int, derivative: bool) -> Tensor:
    """One separable 5-tap Sobel pass along ``dim`` (-1 columns, -2 rows) with a reflect-101 border.

    Written in OpenCV's symmetric form, derivative ``2(x₊₁ − x₋₁) + (x₊₂ − x₋₂)`` and smoothing
    ``6x₀ + 4(x₋₁ + x₊₁) + (x₋₂ + x₊₂)``, so that the derivative across the first/last row or column is exactly 0 as
    in ``cv2.Sobel`` (a generic 5×5 convolution leaves rounding noise there, which normalises to a random normal).
    """
    size = x.shape[dim]
    # torch "reflect" mirrors without repeating the edge: OpenCV's BORDER_REFLECT_101 (the Sobel default).
    padded = F.pad(x, (2, 2, 0, 0) if dim == -1 else (0, 0, 2, 2), mode="reflect")
    taps = [padded.narrow(dim, offset, size) for offset in range(5)]  # x₋₂, x₋₁, x₀, x₊₁, x₊₂
    if derivative:
        return (taps[3] - taps[1]) * 2 + (taps[4] - taps[0])
    return taps[2] * 6 + (taps[1] + taps[3]) * 4 + (taps[0] + taps[4])


def sobel_normals(points: Tensor) -> Tensor:
    """Normals of a ``(B, 3, H, W)`` pointmap from 5×5 Sobel derivatives, as OpenCV ``Sobel(ksize=5)`` with its
    default reflect-101 border (DENSE.md §4.4): ``n = cross(∂x, ∂y) / (‖·‖ + 1e-6)``, shape ``(B, 3, H, W)``.

    On the first/last column ∂x is exactly 0 (likewise ∂y on the first/last row), so the normal there is 0 and its
    angle to anything is 90°, as in the reference.
    """
    if points.shape[-1] < 3 or points.shape[-2] < 3:
        raise ValueError(f"pointmap must be at least 3×3 for a 5×5 Sobel, got {tuple(points.shape[-2:])}")
    # OpenCV filters rows (along x) first, then columns.
    d_x = _sobel5_pass(_sobel5_pass(points, -1, derivative=True), -2, derivative=False)
    d_y = _sobel5_pass(_sobel5_pass(points, -1, derivative=False), -2, derivative=True)
    cross = torch.cross(d_x, d_y, dim=1)
    return cross / (cross.norm(dim=1, keepdim=True) + 1e-6)


class PointmapMetrics:
    """Distance and normal statistics between canonical pointmaps, no alignment of any kind (DENSE.md §4.4).

    ``compute()`` gives ``l2_mean``, ``x_mae``, ``y_mae``, ``z_mae``, ``rmse`` (canonical units), ``normal_mae``,
    ``normal_rmse`` (degrees, Sobel-k5 normals), and **fractions** (0–1) ``within_05_cm``, ``within_10_cm``,
    ``within_20_cm`` (distance < 0.05 / 0.10 / 0.20) and ``within_<t>_deg`` (angle < t).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every batch seen so far."""
        self._sums: Tensor | None = None  # float64: count, Σd, Σ|dx|, Σ|dy|, Σ|dz|, Σd², Σθ, Σθ²
        self._within: Tensor | None = None  # int64: distance thresholds then angle thresholds

    def update(self, pred: Tensor, target: Tensor, mask: Tensor) -> None:
        """Add one batch: pred ``(B, 3, h, w)`` canonical pointmap (the predicted scale is not used), target
        ``(B, 3, H, W)`` canonical GT, mask ``(B, 1, H, W)``. Normals come from the full maps, background included.
        """
        pred, target, mask = _check_batch(pred, target, mask, 3, "PointmapMetrics")
        mask = mask.to(pred.device)
        diff = (pred - target).permute(0, 2, 3, 1)[mask].double()  # (N, 3)
        distance = diff.norm(dim=1)
        angle = _angle_deg(sobel_normals(pred), sobel_normals(target))[mask].double()
        sums = torch.stack(
            [
                distance.new_tensor(distance.numel()),
                distance.sum(),
                *diff.abs().sum(dim=0).unbind(),
                distance.pow(2).sum(),
                angle.sum(),
                angle.pow(2).sum(),
            ]
        )
        within = torch.stack(
            [(distance < t).sum() for t in POINTMAP_THRESHOLDS] + [(angle < t).sum() for t in NORMAL_THRESHOLDS_DEG]
        )
        self._sums, self._within = _pooled(self._sums, sums), _pooled(self._within, within)

    def compute(self) -> dict[str, float]:
        """The pooled statistics (see the class docstring); NaN when no valid pixel was seen."""
        if self._sums is None:
            raise RuntimeError("PointmapMetrics.compute() called before any update(); feed at least one batch")
        count, dist, abs_x, abs_y, abs_z, dist_sq, angle, angle_sq = self._sums.tolist()
        count_or_nan = count if count > 0 else math.nan
        result = {
            "l2_mean": dist / count_or_nan,
            "x_mae": abs_x / count_or_nan,
            "y_mae": abs_y / count_or_nan,
            "z_mae": abs_z / count_or_nan,
            "rmse": math.sqrt(dist_sq / count_or_nan),
            "normal_mae": angle / count_or_nan,
            "normal_rmse": math.sqrt(angle_sq / count_or_nan),
        }
        names = [f"within_{round(t * 100):02d}_cm" for t in POINTMAP_THRESHOLDS]
        names += [_within_deg_name(t) for t in NORMAL_THRESHOLDS_DEG]
        for name, hits in zip(names, self._within.tolist(), strict=True):
            result[name] = hits / count_or_nan
        return result


DEPTH_RATIO_THRESHOLDS = (1.25, 1.25**2, 1.25**3)


class DepthMetrics:
    """Monocular-depth errors over all valid pixels of a dataset, without scale alignment (the usual definitions):

    ``abs_rel`` = mean |d - d*| / d*, ``sq_rel`` = mean (d - d*)² / d*, ``rmse`` = sqrt(mean (d - d*)²) (metres),
    ``log10`` = mean |log10 d - log10 d*|, and ``delta_1``/``delta_2``/``delta_3`` = **fraction** of pixels with
    max(d / d*, d* / d) < 1.25, 1.25², 1.25³. d is the prediction, d* the ground truth; pixels need d* > 0 (those
    outside are ignored) and a prediction d <= 0 counts as a miss for the δ terms and is floored at 1e-6 for log10.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every batch seen so far."""
        self._sums: Tensor | None = None  # float64: count, Σ|e|/d*, Σe²/d*, Σe², Σ|Δlog10|
        self._within: Tensor | None = None  # int64 per ratio threshold

    def update(self, pred: Tensor, target: Tensor, mask: Tensor) -> None:
        """Add one batch: pred ``(B, 1, h, w)`` and target ``(B, 1, H, W)`` depth (one unit), mask ``(B, 1, H, W)``."""
        pred, target, mask = _check_batch(pred, target, mask, 1, "DepthMetrics")
        mask = mask.to(pred.device) & (target[:, 0] > 0)
        predicted, truth = pred[:, 0][mask].double(), target[:, 0][mask].double()
        error = predicted - truth
        ratio = torch.maximum(predicted / truth, truth / predicted.clamp(min=1e-12))
        hits = predicted > 0
        log_error = (torch.log10(predicted.clamp(min=1e-6)) - torch.log10(truth)).abs()
        sums = torch.stack(
            [
                error.new_tensor(error.numel()),
                (error.abs() / truth).sum(),
                (error.pow(2) / truth).sum(),
                error.pow(2).sum(),
                log_error.sum(),
            ]
        )
        within = torch.stack([(hits & (ratio < t)).sum() for t in DEPTH_RATIO_THRESHOLDS])
        self._sums, self._within = _pooled(self._sums, sums), _pooled(self._within, within)

    def compute(self) -> dict[str, float]:
        """The pooled statistics (see the class docstring); NaN when no valid pixel was seen."""
        if self._sums is None:
            raise RuntimeError("DepthMetrics.compute() called before any update(); feed at least one batch")
        count, abs_rel, sq_rel, squared, log10 = self._sums.tolist()
        count = count if count > 0 else math.nan
        result = {"abs_rel": abs_rel / count, "sq_rel": sq_rel / count, "rmse": math.sqrt(squared / count)}
        result["log10"] = log10 / count
        for number, hits in enumerate(self._within.tolist(), start=1):
            result[f"delta_{number}"] = hits / count
        return result


def _gaussian_window(size: int, sigma: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Normalised ``(1, 1, size, size)`` Gaussian window."""
    offsets = torch.arange(size, dtype=dtype, device=device) - (size - 1) / 2
    profile = torch.exp(-offsets.pow(2) / (2 * sigma**2))
    profile = profile / profile.sum()
    return torch.outer(profile, profile)[None, None]


def masked_ssim(
    pred: Tensor, target: Tensor, mask: Tensor, data_range: float, window_size: int = 11, sigma: float = 1.5
) -> tuple[Tensor, Tensor]:
    """Mask-weighted SSIM map (DENSE.md §5.4): local statistics ``conv(x·m)/conv(m)`` with a Gaussian window and
    zero padding, averaged over channels.

    Args:
        pred, target: ``(B, C, H, W)``.
        mask: ``(B, 1, H, W)`` float or bool.
        data_range: R in ``C1 = (0.01 R)²``, ``C2 = (0.03 R)²``.

    Returns:
        ``(ssim (B, H, W), weight (B, H, W) = conv(m))``; the reference averages SSIM where ``weight > 0.5``, which
        can include pixels just outside the mask.
    """
    channels = pred.shape[1]
    window = _gaussian_window(window_size, sigma, pred.dtype, pred.device)
    pad = window_size // 2
    mask = mask.to(pred.dtype)

    def blur(x: Tensor) -> Tensor:
        return F.conv2d(x, window.expand(x.shape[1], 1, -1, -1), padding=pad, groups=x.shape[1])

    weight = blur(mask)  # (B, 1, H, W)
    norm = weight.clamp(min=1e-8)
    mu_x, mu_y = blur(pred * mask) / norm, blur(target * mask) / norm
    var_x = blur(pred.pow(2) * mask) / norm - mu_x.pow(2)
    var_y = blur(target.pow(2) * mask) / norm - mu_y.pow(2)
    cov = blur(pred * target * mask) / norm - mu_x * mu_y
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    ssim = (2 * mu_x * mu_y + c1) * (2 * cov + c2) / ((mu_x.pow(2) + mu_y.pow(2) + c1) * (var_x + var_y + c2) + 1e-8)
    return ssim.sum(dim=1) / channels, weight[:, 0]


class AlbedoMetrics:
    """mae / rmse / psnr / ssim / grad_l1 of albedo over all valid pixels of a dataset (DENSE.md §5.4).

    The data range R is fixed on the first batch: 255 if the GT maximum exceeds 1.5, else 1. PSNR is computed once
    from the pooled MSE (``10·log10(R² / max(MSE, 1e-12))``), not averaged per image. Predictions are not clamped.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every batch seen so far (including the data range)."""
        self.data_range: float | None = None
        self._sums: Tensor | None = None  # float64: count, Σ|e|, Σe², grad pairs, Σ|Δe|, ssim count, Σssim

    def update(self, pred: Tensor, target: Tensor, mask: Tensor) -> None:
        """Add one batch: pred ``(B, 3, h, w)`` RGB, target ``(B, 3, H, W)`` RGB in [0, 1], mask ``(B, 1, H, W)``."""
        pred, target, mask = _check_batch(pred, target, mask, 3, "AlbedoMetrics")
        mask = mask.to(pred.device)
        if self.data_range is None:
            self.data_range = 255.0 if float(target.max()) > 1.5 else 1.0
        error = pred - target
        valid_error = error.permute(0, 2, 3, 1)[mask].double()  # (N, 3)
        # Forward-difference pairs whose two pixels are both valid; both directions pooled together.
        pair_x = mask[:, :, 1:] & mask[:, :, :-1]
        pair_y = mask[:, 1:, :] & mask[:, :-1, :]
        grad_x = (error[..., :, 1:] - error[..., :, :-1]).abs().mean(dim=1)[pair_x]
        grad_y = (error[..., 1:, :] - error[..., :-1, :]).abs().mean(dim=1)[pair_y]
        ssim, weight = masked_ssim(pred, target, mask[:, None], self.data_range)
        ssim = ssim[weight > 0.5].double()
        sums = torch.stack(
            [
                valid_error.new_tensor(valid_error.shape[0]),
                valid_error.abs().mean(dim=1).sum(),
                valid_error.pow(2).mean(dim=1).sum(),
                valid_error.new_tensor(grad_x.numel() + grad_y.numel()),
                grad_x.double().sum() + grad_y.double().sum(),
                valid_error.new_tensor(ssim.numel()),
                ssim.sum(),
            ]
        )
        self._sums = sums if self._sums is None else self._sums + sums

    def compute(self) -> dict[str, float]:
        """``mae``, ``rmse``, ``psnr`` (dB), ``ssim``, ``grad_l1`` pooled over every batch; NaN where undefined."""
        if self._sums is None:
            raise RuntimeError("AlbedoMetrics.compute() called before any update(); feed at least one batch")
        count, abs_sum, sq_sum, pairs, grad_sum, ssim_count, ssim_sum = self._sums.tolist()
        mse = sq_sum / count if count > 0 else math.nan
        return {
            "mae": abs_sum / count if count > 0 else math.nan,
            "rmse": math.sqrt(mse),
            "psnr": 10 * math.log10(self.data_range**2 / max(mse, 1e-12)) if count > 0 else math.nan,
            "ssim": ssim_sum / ssim_count if ssim_count > 0 else math.nan,
            "grad_l1": grad_sum / pairs if pairs > 0 else math.nan,
        }


DENSE_METRICS: dict[str, type] = {
    "seg": SegMetrics,
    "normal": NormalMetrics,
    "pointmap": PointmapMetrics,
    "albedo": AlbedoMetrics,
}
