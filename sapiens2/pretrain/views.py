"""Multi-crop views by the Sapiens2 rules (PRETRAIN.md §3): colour-free global views (random resized crop + flip),
local crops with DINOv3's as-run colour pipeline. Images are RGB uint8 (H, W, 3) arrays; every random draw comes from
the generator passed in, so a sample's views are a pure function of (seed, epoch, index).
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import torch

from ..data.transforms import IMAGE_MEAN_RGB, IMAGE_STD_RGB
from .config import ViewsConfig

__all__ = ["color_augment", "make_views", "normalize", "random_resized_crop", "views_rng"]


def views_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, index, 0x76696577])


def random_resized_crop(
    image: np.ndarray,
    size: tuple[int, int],
    scale: tuple[float, float],
    aspect_range: tuple[float, float],
    rng: np.random.Generator,
) -> np.ndarray:
    """torchvision's RandomResizedCrop rule (10 attempts, then a centre crop), bicubic resize to ``size`` (H, W).

    The crop's w/h is drawn log-uniformly in ``target_w/h * aspect_range`` (PRETRAIN.md §3.2: the default range
    squeezed to the view's aspect), so the distortion stays within the range.
    """
    height, width = image.shape[:2]
    area = height * width
    target = size[1] / size[0]
    log_ratio = (math.log(target * aspect_range[0]), math.log(target * aspect_range[1]))
    for _ in range(10):
        crop_area = area * rng.uniform(*scale)
        ratio = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(crop_area * ratio))
        h = round(math.sqrt(crop_area / ratio))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            break
    else:  # the largest centred crop of the target aspect
        if width / height > target:
            h, w = height, round(height * target)
        else:
            w, h = width, round(width / target)
        top, left = (height - h) // 2, (width - w) // 2
    crop = image[top : top + h, left : left + w]
    interpolation = cv2.INTER_CUBIC if h < size[0] or w < size[1] else cv2.INTER_AREA
    return cv2.resize(crop, (size[1], size[0]), interpolation=interpolation)


def _grey(image: np.ndarray) -> np.ndarray:
    return image @ np.array([0.299, 0.587, 0.114], dtype=np.float32)


def color_augment(image: np.ndarray, config: ViewsConfig, rng: np.random.Generator) -> np.ndarray:
    """DINOv3's local-crop colour pipeline, as run (PRETRAIN.md §3.1): jitter (random order) with p, grayscale with
    p, Gaussian blur (kernel 9) with p. uint8 RGB in and out."""
    x = image.astype(np.float32) / 255.0
    if rng.random() < config.color_jitter_prob:
        brightness, contrast, saturation, hue = config.color_jitter
        for op in rng.permutation(4):
            if op == 0 and brightness > 0:
                x = x * rng.uniform(max(0.0, 1 - brightness), 1 + brightness)
            elif op == 1 and contrast > 0:
                mean = _grey(x).mean()
                x = (x - mean) * rng.uniform(max(0.0, 1 - contrast), 1 + contrast) + mean
            elif op == 2 and saturation > 0:
                grey = _grey(x)[..., None]
                x = (x - grey) * rng.uniform(max(0.0, 1 - saturation), 1 + saturation) + grey
            elif op == 3 and hue > 0:
                hsv = cv2.cvtColor(np.clip(x, 0, 1), cv2.COLOR_RGB2HSV)  # hue in degrees [0, 360)
                hsv[..., 0] = (hsv[..., 0] + 360.0 * rng.uniform(-hue, hue)) % 360.0
                x = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
            x = np.clip(x, 0, 1)
    if rng.random() < config.grayscale_prob:
        x = np.repeat(_grey(x)[..., None], 3, axis=2)
    if rng.random() < config.blur_prob:
        x = cv2.GaussianBlur(x, (9, 9), rng.uniform(*config.blur_sigma))
    return np.clip(np.round(x * 255.0), 0, 255).astype(np.uint8)


def normalize(image: np.ndarray) -> torch.Tensor:
    """uint8 RGB (H, W, 3) -> (3, H, W) float32 with the Sapiens2 mean/std (MODEL.md §2.8)."""
    mean = np.asarray(IMAGE_MEAN_RGB, dtype=np.float32)
    std = np.asarray(IMAGE_STD_RGB, dtype=np.float32)
    return torch.from_numpy(np.ascontiguousarray(((image.astype(np.float32) - mean) / std).transpose(2, 0, 1)))


def _maybe_flip(image: np.ndarray, config: ViewsConfig, rng: np.random.Generator) -> np.ndarray:
    return np.ascontiguousarray(image[:, ::-1]) if rng.random() < config.flip_prob else image


def make_views(
    image: np.ndarray, config: ViewsConfig, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The views of one image.

    Returns:
        (globals, locals): (2, 3, H, W) colour-free global views (view 0 and 1; the student takes the first
        ``n_global_student``, the teacher the last ``n_global_teacher``) and (n_local, 3, h, w) local crops.
    """
    views = []
    for _ in range(2):
        crop = random_resized_crop(image, config.global_size, config.global_scale, config.aspect_range, rng)
        views.append(normalize(_maybe_flip(crop, config, rng)))
    local = []
    for _ in range(config.n_local):
        crop = random_resized_crop(image, config.local_size, config.local_scale, config.aspect_range, rng)
        local.append(normalize(color_augment(_maybe_flip(crop, config, rng), config, rng)))
    empty = torch.zeros(0, 3, *config.local_size)
    return torch.stack(views), torch.stack(local) if local else empty
