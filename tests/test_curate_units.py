"""Curation building blocks on synthetic data (CURATION.md §11): pHash near-duplicates (T2), feature kNN through the
plug-in path (T4), union-find and representatives (T5), the person rule (T6), head-pose geometry (T7), balanced
sampling of a skewed mixture (T8) and water-filling, and the config's defaults and errors."""

from __future__ import annotations

import itertools

import cv2
import numpy as np
import pytest
from conftest import DATA, require_module
from hypothesis import given, settings
from hypothesis import strategies as st

from sapiens2.curate.cluster import balanced_sample, hierarchical_kmeans, normalized_entropy, water_fill
from sapiens2.curate.config import CurateConfig, PersonConfig, curate_config_from_dict, load_curate_config
from sapiens2.curate.dedup import components, pick_representatives, preference_rank
from sapiens2.curate.headpose import head_pose, project_face
from sapiens2.curate.stages import person_columns

faiss = require_module("faiss")


# ---------------------------------------------------------------------------------------------------------------------
# Synthetic images (§11 fixtures), shared with test_curate_run.py


def make_synthetic_image(seed: int, size: tuple[int, int] = (480, 640)) -> np.ndarray:
    """RGB (H, W) = ``size``: a 3-colour linear gradient along a random direction, 14 random ellipses, rectangles or
    thick lines, then Gaussian noise σ = 4 (CURATION.md §11 fixtures)."""
    rng = np.random.default_rng(seed)
    height, width = size
    angle = rng.uniform(0, 2 * np.pi)
    rows, cols = np.mgrid[0:height, 0:width]
    along = ((cols - width / 2) * np.cos(angle) + (rows - height / 2) * np.sin(angle)) / np.hypot(width, height) + 0.5
    along = along[..., None]  # 0..1 across the image
    stops = rng.uniform(0, 255, (3, 3))
    image = np.where(along < 0.5, stops[0] + (stops[1] - stops[0]) * 2 * along,
                     stops[1] + (stops[2] - stops[1]) * (2 * along - 1))  # fmt: skip
    image = np.clip(image, 0, 255).astype(np.uint8).copy()
    for _ in range(14):
        kind, colour = rng.integers(3), tuple(int(c) for c in rng.integers(0, 256, 3))
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        if kind == 0:
            axes = (int(rng.integers(10, 120)), int(rng.integers(10, 120)))
            cv2.ellipse(image, (x, y), axes, float(rng.uniform(0, 180)), 0, 360, colour, -1)
        elif kind == 1:
            cv2.rectangle(image, (x, y), (x + int(rng.integers(10, 200)), y + int(rng.integers(10, 200))), colour, -1)
        else:
            end = (int(rng.integers(0, width)), int(rng.integers(0, height)))
            cv2.line(image, (x, y), end, colour, int(rng.integers(3, 15)))
    return np.clip(image.astype(np.float32) + rng.normal(0, 4, image.shape), 0, 255).astype(np.uint8)


def photos() -> list[np.ndarray]:
    return [cv2.imread(str(DATA / name))[..., ::-1].copy() for name in ("astronaut.png", "camera.png")]


def jpeg(image: np.ndarray, quality: int) -> np.ndarray:
    _, data = cv2.imencode(".jpg", image[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
    return cv2.imdecode(data, cv2.IMREAD_COLOR)[..., ::-1].copy()


def crop(image: np.ndarray, fraction: float, top_left_only: bool = False) -> np.ndarray:
    height, width = image.shape[:2]
    dy, dx = int(height * fraction), int(width * fraction)
    return image[dy:, dx:] if top_left_only else image[dy : height - dy, dx : width - dx]


VARIANTS = {
    "jpeg_q30": lambda im: jpeg(im, 30),
    "jpeg_q75": lambda im: jpeg(im, 75),
    "resize_jpeg": lambda im: jpeg(cv2.resize(im, None, fx=0.5, fy=0.5, interpolation=cv2.INTER_LINEAR), 75),
    "crop2": lambda im: crop(im, 0.02),
    "crop5": lambda im: crop(im, 0.05),
    "crop10": lambda im: crop(im, 0.10),
    "top_left_crop10": lambda im: crop(im, 0.10, top_left_only=True),
    "hflip": lambda im: im[:, ::-1].copy(),
    "brightness": lambda im: np.clip(im.astype(np.float32) * 1.2, 0, 255).astype(np.uint8),
}


# ---------------------------------------------------------------------------------------------------------------------
# T2 pHash


def _grouped(hashes: list[int], max_distance: int) -> np.ndarray:
    from sapiens2.curate.dedup import hamming_edges

    return components(len(hashes), hamming_edges(np.asarray(hashes, np.int64), max_distance))


def test_phash_groups_reencodes_resizes_small_crops_and_brightness_but_never_two_bases():
    from sapiens2.curate.dedup import perceptual_hash

    bases = [make_synthetic_image(seed) for seed in range(30)] + photos()
    base_hashes = [perceptual_hash(b)[0] for b in bases]
    assert len(set(_grouped(base_hashes, 10))) == len(bases)  # no two distinct images merged
    for name in ("jpeg_q30", "jpeg_q75", "resize_jpeg", "crop2", "brightness"):
        variant_hashes = [perceptual_hash(VARIANTS[name](b))[0] for b in bases]
        labels = _grouped(base_hashes + variant_hashes, 10)
        assert np.array_equal(labels[: len(bases)], labels[len(bases) :]), f"{name} not grouped with its base"
        assert len(set(labels)) == len(bases), name
    # pHash cannot see flips and hardly sees 10 % crops: the reason for the feature kNN pass (D2).
    flips = _grouped(base_hashes + [perceptual_hash(VARIANTS["hflip"](b))[0] for b in bases], 10)
    assert len(set(flips)) == 2 * len(bases)
    crops = _grouped(base_hashes + [perceptual_hash(VARIANTS["crop10"](b))[0] for b in bases], 10)
    assert len(set(crops)) >= 2 * len(bases) - len(bases) // 10


def test_flat_images_are_marked_low_texture():
    from sapiens2.curate.dedup import perceptual_hash

    _, texture = perceptual_hash(np.full((400, 500, 3), 90, np.uint8))
    assert texture < 2.0 <= perceptual_hash(make_synthetic_image(0))[1]


def test_hamming_range_search_includes_the_limit_distance():
    from sapiens2.curate.dedup import hamming_edges

    base = 0x0F0F_0F0F_0F0F_0F0F
    at_ten, at_eleven = base ^ 0x3FF, base ^ 0x7FF  # 10 and 11 bits flipped
    edges = hamming_edges(np.array([base, at_ten, at_eleven], np.uint64).view(np.int64), 10)
    assert edges.tolist() == [[0, 1], [1, 2]]  # 0-2 differ in 11 bits; 1-2 in one


# ---------------------------------------------------------------------------------------------------------------------
# T4 feature kNN through the plug-in path (a thumbnail embedder)


class ThumbnailEmbedder:
    """A test embedder: 12×9 grey thumbnail, mean removed (L2-normalised by the embed stage)."""

    def __call__(self, images):
        vectors = []
        for image in images:
            grey = cv2.resize(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY), (12, 9), interpolation=cv2.INTER_AREA)
            vector = grey.astype(np.float32).reshape(-1)
            vectors.append(vector - vector.mean())
        return np.stack(vectors)


def test_feature_knn_groups_small_crops_and_keeps_distinct_images(tmp_path):
    from sapiens2.curate.dedup import knn_edges
    from sapiens2.curate.stages import EmbedStage

    config = curate_config_from_dict({"embed": {"plugin": "test_curate_units:ThumbnailEmbedder"}})
    stage = EmbedStage(config, "cpu")
    bases = [make_synthetic_image(seed) for seed in range(30)] + photos()
    images = bases + [VARIANTS["crop2"](b) for b in bases] + [crop(b, 0.05) for b in bases]
    vectors = np.stack(stage({"images": images})["embedding"])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    labels = components(len(images), knn_edges(vectors, 8, 0.75)[0])
    n = len(bases)
    assert len(set(labels[:n])) == n  # no two bases merged
    assert np.array_equal(labels[:n], labels[n : 2 * n]) and np.array_equal(labels[:n], labels[2 * n :])


# ---------------------------------------------------------------------------------------------------------------------
# T5 union-find and representatives


def test_chained_neighbours_form_one_component_with_the_preferred_representative():
    # a~b, b~c, a≁c: one component; c has the largest person box, so it is kept whatever the order.
    edges = np.array([[0, 1], [1, 2]])
    labels = components(4, edges)
    assert labels.tolist() == [0, 0, 0, 3]
    rank = preference_rank([400.0, 450.0, 500.0, None], [None] * 4, [1, 1, 1, 1], ["a", "b", "c", "d"], list("wxyz"))
    assert pick_representatives(labels, rank).tolist() == [2, 2, 2, 3]
    order = [3, 2, 0, 1]  # shuffle the rows and the edges: same groups, same survivor
    position = {old: new for new, old in enumerate(order)}
    shuffled_edges = np.array([[position[a], position[b]] for a, b in edges[::-1]])
    shuffled_labels = components(4, shuffled_edges)
    shuffled_rank = preference_rank([[400.0, 450.0, 500.0, None][i] for i in order], [None] * 4, [1] * 4,
                                    [list("abcd")[i] for i in order], [list("wxyz")[i] for i in order])  # fmt: skip
    survivors = pick_representatives(shuffled_labels, shuffled_rank)
    assert [order[s] for s in survivors] == [[2, 2, 2, 3][i] for i in order]


def test_representative_ties_break_on_aesthetic_then_pixels_then_image_id():
    labels = np.zeros(4, np.int64)
    rank = preference_rank([500.0] * 4, [5.0, 6.0, 6.0, 6.0], [100, 200, 200, 200], ["d", "c", "b", "zz"], list("abcd"))
    assert pick_representatives(labels, rank)[0] == 2  # aesthetic 6, 200 px, then the smallest image_id "b"


# ---------------------------------------------------------------------------------------------------------------------
# T6 person rule


def test_person_rule_clips_boxes_and_needs_score_and_short_side():
    config = PersonConfig()
    image_size = (1000, 800)
    two_people = np.array([[10, 10, 410, 900, 0.9], [420, 50, 800, 990, 0.8]], np.float32)
    row = person_columns(two_people, image_size, config)
    assert row["n_person"] == 2 and row["best_box_short_side"] == 400 and row["best_box"] == [10, 10, 410, 900]
    clipped = person_columns(np.array([[-100, 0, 383, 990, 0.9]], np.float32), image_size, config)
    assert clipped["best_box_short_side"] == 383  # 483 wide before clipping to the image
    low_score = person_columns(np.array([[0, 0, 600, 900, 0.49]], np.float32), image_size, config)
    assert low_score["n_person"] == 0 and low_score["best_box"] is None
    at_threshold = person_columns(np.array([[0, 0, 384, 900, 0.5]], np.float32), image_size, config)
    assert at_threshold["best_box_short_side"] == 384 and at_threshold["best_box_area_frac"] == pytest.approx(
        384 * 900 / 800_000
    )


# ---------------------------------------------------------------------------------------------------------------------
# T7 head-pose geometry


def test_head_pose_round_trip_over_the_grid_with_and_without_noise():
    rng = np.random.default_rng(0)
    image_size = (480, 640)
    translation = np.array([0.0, 0.0, 2000.0])  # eye corners ~145 px apart, a prominent face
    worst_clean = worst_noisy = 0.0
    for yaw, pitch, roll in itertools.product(range(-60, 61, 15), range(-30, 31, 15), range(-30, 31, 15)):
        points = project_face(yaw, pitch, roll, translation, image_size)
        truth = np.array([yaw, pitch, roll], np.float64)
        clean = head_pose(points, np.ones(6), image_size)
        worst_clean = max(worst_clean, np.abs([clean["yaw"], clean["pitch"], clean["roll"]] - truth).max())
        noisy = head_pose(points + rng.normal(0, 0.5, points.shape), np.ones(6), image_size)
        assert noisy["head_pose_valid"], (yaw, pitch, roll)
        worst_noisy = max(worst_noisy, np.abs([noisy["yaw"], noisy["pitch"], noisy["roll"]] - truth).max())
    assert worst_clean < 0.1 and worst_noisy < 2.0


def test_head_pose_sign_convention_and_low_scores():
    image_size = (480, 640)
    turned = project_face(30, 0, 0, np.array([0.0, 0.0, 2000.0]), image_size)
    assert turned[0, 0] > turned[2:4, 0].mean()  # yaw > 0: the nose moves toward image right
    up = project_face(0, 20, 0, np.array([0.0, 0.0, 2000.0]), image_size)
    frontal = project_face(0, 0, 0, np.array([0.0, 0.0, 2000.0]), image_size)
    assert (up[0, 1] - up[2:4, 1].mean()) < (frontal[0, 1] - frontal[2:4, 1].mean())  # pitch > 0: nose rises
    scores = np.ones(6)
    scores[3] = 0.29
    result = head_pose(frontal, scores, image_size)
    assert not result["head_pose_valid"] and result["yaw"] is None and result["face_kpt_min_score"] == 0.29


# ---------------------------------------------------------------------------------------------------------------------
# T8 balanced sampling


def skewed_mixture(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """20 Gaussian components in 32-d (centres ~ N(0, 4²), unit noise), Zipf sizes ∝ i^-1.5 scaled to 20 000."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 4, (20, 32))
    weights = np.arange(1, 21) ** -1.5
    sizes = np.floor(weights / weights.sum() * 20_000).astype(int)  # 9213 ... 103
    labels = np.repeat(np.arange(20), sizes)
    return (centres[labels] + rng.normal(0, 1, (len(labels), 32))).astype(np.float32), labels


def test_balanced_sampling_flattens_a_zipf_skew():
    points, truth = skewed_mixture()
    assert 19_990 <= len(points) <= 20_000 and np.bincount(truth)[0] == 9213 and np.bincount(truth)[-1] == 103
    clusters = hierarchical_kmeans(points, (1000, 200, 40), seed=0, resampling_steps=(0, 5, 5), sample_sizes=(1, 5, 5))
    chosen, copies = balanced_sample(clusters, 2000, seed=0, strategy="r")
    assert len(chosen) == 2000 and len(np.unique(chosen)) == 2000 and (copies == 1).all()
    assert chosen.min() >= 0 and chosen.max() < len(points)
    balanced = normalized_entropy(truth[chosen], 20)
    random = normalized_entropy(truth[np.random.default_rng(0).choice(len(points), 2000, replace=False)], 20)
    assert balanced >= 0.85 and balanced >= random + 0.15, (balanced, random)
    counts = np.bincount(truth[chosen], minlength=20)
    assert counts.max() / counts.min() < np.bincount(truth).max() / np.bincount(truth).min()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=30), st.integers(0, 800), st.integers(0, 5))
def test_water_filling_sums_to_the_target_and_stays_even(sizes, target, seed):
    sizes = np.array(sizes)
    quotas = water_fill(sizes, target, np.random.default_rng(seed))
    assert quotas.sum() == min(target, sizes.sum()) and (quotas <= sizes).all() and (quotas >= 0).all()
    unsaturated = quotas[quotas < sizes]
    if len(unsaturated):
        assert unsaturated.max() - unsaturated.min() <= 1
        assert (quotas[quotas == sizes] <= unsaturated.max() + 1).all()  # a full cluster got at most the +1


def test_multiplier_repeats_small_clusters():
    points, _ = skewed_mixture()
    clusters = hierarchical_kmeans(points[:600], (20, 4), seed=0)
    chosen, copies = balanced_sample(clusters, 900, seed=0, multiplier=2)
    assert copies.sum() == 900 and copies.max() == 2


# ---------------------------------------------------------------------------------------------------------------------
# Config


def test_config_defaults_are_the_documented_ones():
    config = CurateConfig()
    assert (config.ingest.min_short_side, config.ingest.max_aspect) == (384, 3.0)
    assert (config.person.det_score_min, config.person.min_box_short_side, config.person.max_boxes) == (0.5, 384, 20)
    assert (config.head_pose.min_keypoint_score, config.head_pose.max_rmse_iod, config.head_pose.max_abs_yaw) == (
        0.3, 0.15, None)  # fmt: skip
    assert (config.clip.min_aesthetic, config.clip.min_realism, config.clip.max_clip_text_prob) == (4.5, 0.5, 0.8)
    assert config.text.max_area_frac == 0.05
    assert (config.dedup.phash_max_distance, config.dedup.knn_k, config.dedup.knn_threshold) == (10, 64, 0.95)
    assert (config.embed.pooling, config.embed.input_size) == ("cls", (512, 384))
    assert (config.balance.strategy, config.balance.multiplier, config.seed, config.shard_size) == ("r", 1, 0, 10000)
    assert config.cluster.niter == 50 and not config.allow_download


def test_config_rejects_unknown_keys_with_a_did_you_mean(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("inputs: [x]\ndedup:\n  phash_max_distnce: 8\n")
    with pytest.raises(ValueError, match="phash_max_distance"):
        load_curate_config(path)
    with pytest.raises(ValueError, match="target_size or balance.target_fraction, not both"):
        curate_config_from_dict({"balance": {"target_size": 5, "target_fraction": 0.5}})


def test_example_config_parses():
    from conftest import REPO

    config = load_curate_config(REPO / "configs" / "curate_example.yaml")
    assert config.person.detector == "rtmdet" and config.balance.target_fraction is not None
