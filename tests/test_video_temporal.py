"""The flow-guided temporal filter of dense video outputs (``sapiens2.video.temporal``): synthetic clips with a
static textured background and a textured object moving by a fraction of a pixel per frame, per-frame noise on
the dense field; flicker on the static region must halve while the moving object's edges stay within 1 px of
the truth; then each task's domain (unit normals, canonical pointmaps under a changing scale, mattes, albedo, seg
probabilities), a scene cut, and `sapiens2 predict clip.mp4 --task normal --smooth-dense` with a tiny model."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from conftest import require_module
from videoclips import static_noisy, write_clip

from sapiens2.cli import main
from sapiens2.dense.albedo import AlbedoResult
from sapiens2.dense.matting import MattingResult
from sapiens2.dense.normal import NormalResult
from sapiens2.dense.pointmap import PointmapResult
from sapiens2.dense.seg import SegResult
from sapiens2.video import VideoOptions
from sapiens2.video.temporal import FixedLagTemporalFilter, TemporalFilter, flicker, flow_warps

HEIGHT, WIDTH, SIDE = 120, 160, 40  # frame size, side of the moving square
BACKGROUND, OBJECT = np.array([0, 0, 1], np.float32), np.array([0.6, 0, 0.8], np.float32)


def texture(rng, shape, mean):
    noise = cv2.GaussianBlur(rng.uniform(0, 255, shape).astype(np.float32), (0, 0), 1.5)
    return (noise - noise.mean()) * 4 + mean


def moving_square(count=24, speed=2.5, sigma=0.1, seed=0):
    """Frames (RGB uint8), clean normals, noisy normals and the square's left x per frame. The square (its own
    texture, brighter) moves right by ``speed`` px per frame over a static textured background; the camera adds
    grey noise (sigma 2) and the "network" per-pixel normal noise (``sigma``) to every frame."""
    rng = np.random.default_rng(seed)
    background, square = texture(rng, (HEIGHT, WIDTH), 70), texture(rng, (SIDE, SIDE), 180)
    frames, clean, noisy, left = [], [], [], []
    for t in range(count):
        x = 20 + speed * t
        move = np.array([[1, 0, x], [0, 1, (HEIGHT - SIDE) / 2]], np.float32)
        cover = cv2.warpAffine(np.ones((SIDE, SIDE), np.float32), move, (WIDTH, HEIGHT))  # antialiased edges
        grey = background * (1 - cover) + cv2.warpAffine(square, move, (WIDTH, HEIGHT))
        grey = np.clip(grey + rng.normal(0, 2, grey.shape), 0, 255).astype(np.uint8)
        frames.append(np.repeat(grey[..., None], 3, axis=2))
        normals = BACKGROUND * (1 - cover[..., None]) + OBJECT * cover[..., None]
        normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
        clean.append(normals)
        shaken = normals + rng.normal(0, sigma, normals.shape).astype(np.float32)
        noisy.append(shaken / np.linalg.norm(shaken, axis=-1, keepdims=True))
        left.append(x)
    return frames, clean, noisy, left


def static_region():
    """Pixels the square never comes near."""
    mask = np.ones((HEIGHT, WIDTH), bool)
    mask[(HEIGHT - SIDE) // 2 - 6 : (HEIGHT + SIDE) // 2 + 6, 10:] = False
    return mask


def edges(values, left):
    """Sub-pixel columns where x rises through 0.3 (the square's left edge) and falls through it (its right edge),
    averaged over the square's inner rows."""
    found = []
    for row in values[(HEIGHT - SIDE) // 2 + 4 : (HEIGHT + SIDE) // 2 - 4]:
        above = np.flatnonzero(row >= 0.3)
        above = above[(above > int(left) - 8) & (above < int(left) + SIDE + 8)]
        i, j = above[0], above[-1]
        found.append((i - 1 + (0.3 - row[i - 1]) / (row[i] - row[i - 1]), j + (row[j] - 0.3) / (row[j] - row[j + 1])))
    return np.mean(found, axis=0)


def edge_lag(filtered, clean, left, start=4):
    """How far (px) the filtered square's edges trail the clean ones, mean over frames, worse of the two edges."""
    offsets = [edges(c[..., 0], x) - edges(f[..., 0], x) for f, c, x in zip(filtered, clean, left, strict=True)]
    return float(np.abs(np.mean(offsets[start:], axis=0)).max())


def run_online(frames, results, **options):
    smooth = TemporalFilter(**options)
    return [smooth(image, result) for image, result in zip(frames, results, strict=True)]


def run_offline(frames, results, **options):
    smooth = FixedLagTemporalFilter(**options)
    released = []
    for index, (image, result) in enumerate(zip(frames, results, strict=True)):
        released += smooth.push(image, result, payload=index)
    released += smooth.flush()
    assert [index for index, _ in released] == list(range(len(frames)))  # every frame, once, in order
    return [result for _, result in released]


@pytest.mark.parametrize("run", [run_online, run_offline], ids=["online", "offline"])
def test_flicker_on_static_regions_halves_and_a_moving_edge_lags_under_a_pixel(run):
    frames, clean, noisy, left = moving_square()
    results = [{"normal": NormalResult(n, None, (HEIGHT, WIDTH))} for n in noisy]
    filtered = [r["normal"].normals for r in run(frames, results)]
    still = static_region()
    assert flicker(np.array(filtered[4:]), still) <= 0.5 * flicker(np.array(noisy[4:]), still)
    assert edge_lag(filtered, clean, left) <= 1.0
    np.testing.assert_allclose(np.linalg.norm(np.array(filtered), axis=-1), 1.0, atol=1e-5)  # renormalised


def test_the_lag_measure_catches_a_filter_that_ignores_motion():
    """The same exponential filter without flow halves the flicker too, but drags the edges behind."""
    frames, clean, noisy, left = moving_square()
    ema = [noisy[0]]
    for normals in noisy[1:]:
        mixed = 0.2 * normals + 0.8 * ema[-1]
        ema.append(mixed / np.linalg.norm(mixed, axis=-1, keepdims=True))
    assert flicker(np.array(ema[4:]), static_region()) <= 0.5 * flicker(np.array(noisy[4:]), static_region())
    assert edge_lag(ema, clean, left) > 3.0


def test_flow_warps_follow_the_motion_and_distrust_what_was_hidden():
    frames, *_ = moving_square(count=2, speed=3.0)
    into_current, into_previous = flow_warps(frames[0], frames[1])
    inside = np.s_[(HEIGHT - SIDE) // 2 + 5 : (HEIGHT + SIDE) // 2 - 5, 20 + 3 + 5 : 20 + 3 + SIDE - 5]
    gx = np.arange(WIDTH, dtype=np.float32)[None].repeat(HEIGHT, 0)
    assert abs(np.median((gx - into_current.map_x)[inside]) - 3.0) < 0.3  # the square came from 3 px to the left
    assert np.median(into_current.confidence[inside]) > 0.5
    assert np.median(into_current.confidence[static_region()]) > 0.5
    uncovered = np.s_[(HEIGHT - SIDE) // 2 + 5 : (HEIGHT + SIDE) // 2 - 5, 20:22]  # background the square left
    assert np.median(into_current.confidence[uncovered]) < 0.2  # it was hidden in the previous frame


def test_a_scene_cut_keeps_each_frame_its_own():
    rng = np.random.default_rng(1)
    first, second = (texture(rng, (HEIGHT, WIDTH), m).clip(0, 255).astype(np.uint8) for m in (60, 190))
    frames = [np.repeat(g[..., None], 3, axis=2) for g in (first, first, second)]
    alphas = [np.full((HEIGHT, WIDTH), a, np.float32) for a in (0.0, 0.0, 1.0)]
    results = [{"matting": MattingResult(a, np.zeros((HEIGHT, WIDTH, 3), np.float32), None, (HEIGHT, WIDTH))}
               for a in alphas]  # fmt: skip
    out = run_online(frames, results)
    assert np.mean(out[2]["matting"].alpha) > 0.9  # nothing of the old shot carried over


def test_pointmaps_are_filtered_in_canonical_space_under_the_stabilised_scale():
    """Canonical points stay put while the (stabilised) scale changes per frame: the filter must not mix metric
    points of two scales, only the canonical shape; each frame keeps its own scale, depth is the points' Z."""
    frames, *_ = moving_square(count=12, speed=0.0)
    rng = np.random.default_rng(2)
    gx, gy = np.meshgrid(np.linspace(-1, 1, WIDTH), np.linspace(-1, 1, HEIGHT))
    canonical = np.dstack([gx, gy, 3.0 + 0.5 * gx]).astype(np.float32)  # a slanted plane
    scales = [1.0, 1.5, 0.8] * 4
    results = []
    for s in scales:
        noisy = canonical + rng.normal(0, 0.05, canonical.shape).astype(np.float32)
        points = noisy / np.float32(s)
        if len(results) == 5:
            points[10:20, 10:30] = np.nan  # a hole (no valid point) in one frame
        results.append({"pointmap": PointmapResult(points, points[..., 2].copy(), 500.0 / s, s, None, (HEIGHT, WIDTH))})
    for run in (run_online, run_offline):
        out = [r["pointmap"] for r in run(frames, results)]
        assert [p.scale for p in out] == scales and [p.focal for p in out] == [500.0 / s for s in scales]
        for p in out:
            np.testing.assert_array_equal(p.depth, p.points[..., 2])
        hole = np.isnan(out[5].points).any(axis=-1)
        assert hole[10:20, 10:30].all() and hole.sum() == 200  # the hole stays a hole, and is not spread
        assert all(np.isfinite(p.points).all() for i, p in enumerate(out) if i != 5)
        shapes = np.array([p.points * p.scale for i, p in enumerate(out) if i >= 6])  # canonical again
        assert np.abs(shapes - canonical).mean() < 0.5 * np.abs(
            np.array([r["pointmap"].points * r["pointmap"].scale for r in results[6:]]) - canonical).mean()


def test_mattes_albedo_and_seg_probabilities_stay_in_their_domains_with_less_flicker():
    frames, *_ = moving_square(count=8, speed=1.0)
    rng = np.random.default_rng(3)
    size = (HEIGHT, WIDTH)
    results = []
    for _ in frames:
        alpha = np.clip(0.5 + rng.normal(0, 0.2, size), 0, 1).astype(np.float32)
        colour = rng.uniform(0, 1, (*size, 3)).astype(np.float32)
        albedo = np.clip(0.4 + rng.normal(0, 0.1, (*size, 3)), 0, 1).astype(np.float32)
        logits = rng.normal(0, 1, (4, *size)).astype(np.float32)
        probabilities = np.exp(logits) / np.exp(logits).sum(axis=0)
        results.append({
            "matting": MattingResult(alpha, colour * alpha[..., None], None, size),
            "albedo": AlbedoResult((albedo * 255).astype(np.uint8), albedo, None, size),
            "seg": SegResult(probabilities.argmax(0).astype(np.uint8), ("a", "b", "c", "d"), None, size, probabilities),
        })  # fmt: skip
    for out in (run_online(frames, results), run_offline(frames, results)):
        for r in out:
            matte, albedo, seg = r["matting"], r["albedo"], r["seg"]
            assert 0 <= matte.alpha.min() and matte.alpha.max() <= 1
            assert (matte.foreground <= matte.alpha[..., None] + 1e-6).all() and matte.foreground.min() >= 0
            np.testing.assert_array_equal(albedo.albedo, (albedo.albedo_float * np.float32(255)).astype(np.uint8))
            np.testing.assert_allclose(seg.probabilities.sum(axis=0), 1.0, atol=1e-5)
            np.testing.assert_array_equal(seg.labels, seg.probabilities.argmax(axis=0))
        still = static_region()
        for read in (lambda r: r["matting"].alpha, lambda r: r["albedo"].albedo_float):
            assert flicker(np.array([read(r) for r in out[4:]]), still) <= 0.5 * flicker(
                np.array([read(r) for r in results[4:]]), still)


def test_options_refuse_what_cannot_work(capsys, tmp_path):
    with pytest.raises(ValueError, match="strength"):
        TemporalFilter(strength=1.0)
    with pytest.raises(ValueError, match="lag"):
        FixedLagTemporalFilter(lag=0)
    with pytest.raises(ValueError, match="smooth_dense needs smooth"):
        VideoOptions(smooth="none", smooth_dense=True)
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"")
    argv = ["predict", "--task", "normal", str(clip), "-o", str(tmp_path / "out"), "--smooth", "none",
            "--smooth-dense"]  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == ("sapiens2 predict: error: --smooth-dense needs smooth auto, online or "
                                                "offline (the filter's mode), got 'none'")  # fmt: skip


def read_normals(out, stem):
    summary = json.loads((out / f"{stem}_video.json").read_text())
    members = {}
    for chunk in summary["dense"]["normal"]:
        with np.load(out / chunk) as archive:
            members.update({name: archive[name].astype(np.float32) for name in archive.files})
    return summary, np.array([members[name] for name in sorted(members)])


def test_cli_smooth_dense_on_an_encoded_clip(tiny_checkpoints, tmp_path, capsys):
    require_module("av")
    clip = write_clip(tmp_path / "still.avi", static_noisy(12, sigma=6.0), codec="mjpeg")  # intra: fresh noise
    base = ["predict", "--task", "normal", str(clip), "--device", "cpu", "--input-size", "64", "48", "--model",
            str(tiny_checkpoints["normal"])]  # fmt: skip
    assert main([*base, "-o", str(tmp_path / "raw")]) == 0, capsys.readouterr().err
    assert main([*base, "-o", str(tmp_path / "offline"), "--smooth-dense"]) == 0, capsys.readouterr().err
    assert main([*base, "-o", str(tmp_path / "online"), "--smooth-dense", "--smooth", "online"]) == 0
    raw_summary, raw = read_normals(tmp_path / "raw", "still")
    assert raw_summary["smooth_dense"] is False
    for mode in ("offline", "online"):
        summary, smoothed = read_normals(tmp_path / mode, "still")
        assert summary["smooth_dense"] is True and summary["smooth"] == mode and summary["frames"] == 12
        assert smoothed.shape == raw.shape == (12, 96, 128, 3)
        np.testing.assert_allclose(np.linalg.norm(smoothed, axis=-1), 1.0, atol=2e-3)  # float16 archives
        assert flicker(smoothed) <= 0.5 * flicker(raw), mode  # measured: 0.41 both ways
