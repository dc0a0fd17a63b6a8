"""Relighting (``sapiens2.vfx``) against analytic renders of a synthetic scene, and ``sapiens2 relight`` through its
real entry point with tiny random models on a photo and a real encoded video."""

from __future__ import annotations

import math
import os
import re
import struct
import subprocess
import sys
import tracemalloc

import cv2
import numpy as np
import pytest
from conftest import DATA
from videoclips import moving_crops, write_clip

from sapiens2.cli import main
from sapiens2.dense.matting import MattingResult
from sapiens2.dense.seg import SegResult
from sapiens2.vfx import DirectionalLight, EnvironmentMap, Lighting, PointLight, load_environment, parse_light, relight
from sapiens2.vfx.run import RelightOptions

ERROR = re.compile(r"^sapiens2( relight)?: error: ")
"""The start of an error line (``messages.report_error``; the command's name once the CLI has set it)."""

# ----------------------------------------------------------------------------------------- the synthetic scene
# A pinhole camera (OpenCV axes: x right, y down, z forward) sees a unit sphere 3 m ahead in front of a wall 5 m
# ahead. Normals point out of the surfaces, toward the camera; albedo: a red-orange sphere, a grey checker wall.

H, W, FOCAL = 96, 128, 110.0
SPHERE, RADIUS, WALL = np.array([0.0, 0.0, 3.0]), 1.0, 5.0


def srgb_encode(linear):
    v = np.clip(linear, 0, 1)
    return np.where(v <= 0.0031308, 12.92 * v, 1.055 * v ** (1 / 2.4) - 0.055)


def srgb_decode(encoded):
    v = np.clip(encoded, 0, 1)
    return np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)


def scene():
    """(points, normals, albedo (sRGB-encoded float), sphere mask) of every pixel, float64."""
    u, v = np.meshgrid(np.arange(W) + 0.5 - W / 2, np.arange(H) + 0.5 - H / 2)
    rays = np.stack([u / FOCAL, v / FOCAL, np.ones_like(u)], -1)
    rays /= np.linalg.norm(rays, axis=-1, keepdims=True)
    b = rays @ SPHERE  # |t d - c|^2 = r^2 -> t^2 - 2 b t + |c|^2 - r^2 = 0
    disc = b * b - (SPHERE @ SPHERE - RADIUS**2)
    hit = disc > 0
    t_sphere = b - np.sqrt(np.where(hit, disc, 0))
    t_wall = WALL / rays[..., 2]
    t = np.where(hit, t_sphere, t_wall)[..., None]
    points = rays * t
    normals = np.where(hit[..., None], (points - SPHERE) / RADIUS, np.array([0.0, 0.0, -1.0]))
    checker = ((np.floor(points[..., 0] * 2) + np.floor(points[..., 1] * 2)) % 2)[..., None]
    wall = np.where(checker > 0, 0.7, 0.45) * np.ones(3)
    albedo = np.where(hit[..., None], np.array([0.85, 0.45, 0.3]), wall)
    return points, normals, albedo, hit


def expected_u8(linear):
    return np.round(srgb_encode(linear) * 255).astype(np.uint8)


def assert_within_one_level(image, expected_linear):
    difference = np.abs(image.astype(int) - expected_u8(expected_linear).astype(int))
    assert difference.max() <= 1, f"{(difference > 1).sum()} pixels off by more than 1/255 (max {difference.max()})"


# ------------------------------------------------------------------------------------------------- Lambert


def test_directional_lights_match_lambert_on_the_sphere_and_wall():
    _, normals, albedo, _ = scene()
    plate = np.zeros((H, W, 3), np.uint8)
    # From above (el 90: toward -y) in warm white, and from the image's right (az 90: toward +x) in blue.
    lights = [parse_light("dir:az=0,el=90,color=1,0.9,0.8,intensity=1.5"),
              parse_light("dir:az=90,el=0,color=#4080ff,intensity=0.8")]  # fmt: skip
    result = relight(plate, normals.astype(np.float32), albedo.astype(np.float32), Lighting(lights))
    up, right = np.array([0.0, -1.0, 0.0]), np.array([1.0, 0.0, 0.0])
    blue = np.array([0x40, 0x80, 0xFF]) / 255
    shading = (1.5 * np.array([1, 0.9, 0.8]) * np.maximum(normals @ up, 0)[..., None]
               + 0.8 * blue * np.maximum(normals @ right, 0)[..., None])  # fmt: skip
    assert_within_one_level(result.image, srgb_decode(albedo) * shading)
    # The wall faces the camera, at right angles to both lights: black. The sphere's top is lit, its bottom not.
    assert result.image[2, 2].max() == 0 and result.image[20, W // 2, 0] > 100
    assert result.image[75, W // 2 - 10].max() == 0


def test_a_light_from_the_camera_gives_back_the_albedo_where_surfaces_face_it():
    _, normals, albedo, _ = scene()
    result = relight(np.zeros((H, W, 3), np.uint8), normals, albedo, Lighting([DirectionalLight.from_angles(0, 0)]))
    np.testing.assert_array_equal(result.image[5, 5], np.round(albedo[5, 5] * 255).astype(np.uint8))


def test_point_light_falls_off_with_the_square_of_the_distance():
    points, normals, albedo, _ = scene()
    position = np.array([1.5, -2.0, 1.0])
    light = parse_light("point:x=1.5,y=-2,z=1,color=1,0.5,0.25,intensity=9")
    assert isinstance(light, PointLight)
    result = relight(np.zeros((H, W, 3), np.uint8), normals, albedo, Lighting([light]), positions=points)
    offset = position - points
    distance = np.linalg.norm(offset, axis=-1, keepdims=True)
    cosine = np.maximum(np.sum(normals * offset / distance, -1, keepdims=True), 0)
    shading = 9 * np.array([1, 0.5, 0.25]) * cosine / distance**2
    assert_within_one_level(result.image, srgb_decode(albedo) * shading)


def test_specular_adds_a_blinn_phong_highlight_at_the_mirror_direction():
    points, normals, albedo, hit = scene()
    lighting = Lighting([DirectionalLight.from_angles(0, 0)], specular=0.5, shininess=50)
    result = relight(np.zeros((H, W, 3), np.uint8), normals, albedo, lighting, positions=points)
    view = -points / np.linalg.norm(points, axis=-1, keepdims=True)
    half = view + np.array([0.0, 0.0, -1.0])
    half /= np.linalg.norm(half, axis=-1, keepdims=True)
    highlight = 0.5 * np.maximum(np.sum(normals * half, -1), 0) ** 50
    lambert = np.maximum(-normals[..., 2], 0)
    assert_within_one_level(result.image, srgb_decode(albedo) * lambert[..., None] + highlight[..., None])
    # The brightest sphere pixel is where the normal bisects the camera ray and the light: the sphere's centre.
    brightest = np.unravel_index(np.argmax(np.where(hit, result.image.sum(-1), 0)), hit.shape)
    assert abs(brightest[0] - H / 2) <= 1.5 and abs(brightest[1] - W / 2) <= 1.5


# ---------------------------------------------------------------------------------------- environment maps
# Radiance L(d) = a + b (u.d) + c (u.d)^2 with u straight up: irradiance / pi at a normal n is
# a + 2/3 b (u.n) + c (1/3 + 1/6 P2(u.n)), P2(t) = (3t^2 - 1)/2 (the clamped-cosine integrals of bands 0-2).

A, B, C = np.array([0.6, 0.5, 0.4]), np.array([0.5, 0.4, 0.2]), np.array([0.3, 0.2, 0.6])


def sky_panorama(height=128):
    lat = (0.5 - (np.arange(height) + 0.5) / height) * math.pi  # top row: straight up
    up = np.repeat(np.sin(lat)[:, None], 2 * height, axis=1)[..., None]  # u.d does not depend on the longitude
    return (A + B * up + C * up**2).astype(np.float32)


def sky_shading(normals):
    t = (normals @ np.array([0.0, -1.0, 0.0]))[..., None]
    return A + 2 / 3 * B * t + C * (1 / 3 + 1 / 6 * (3 * t * t - 1) / 2)


def test_environment_map_of_known_harmonics_matches_the_analytic_irradiance():
    _, normals, albedo, _ = scene()
    lighting = Lighting((), EnvironmentMap.from_equirect(sky_panorama()))
    result = relight(np.zeros((H, W, 3), np.uint8), normals, albedo, lighting)
    assert_within_one_level(result.image, srgb_decode(albedo) * sky_shading(normals))
    np.testing.assert_allclose(result.shading, sky_shading(normals), atol=2e-3)


def test_environment_read_from_hdr_and_exr_files(tmp_path):
    _, normals, albedo, _ = scene()
    panorama = sky_panorama()
    hdr = tmp_path / "sky.hdr"
    assert cv2.imwrite(str(hdr), panorama[..., ::-1])
    from_hdr = relight(np.zeros((H, W, 3), np.uint8), normals, albedo, load_environment(hdr))
    expected = srgb_decode(albedo) * sky_shading(normals)
    # Radiance RGBE keeps an 8-bit mantissa: the file's light is within ~0.5 % of the panorama's.
    assert np.abs(from_hdr.image.astype(int) - expected_u8(expected).astype(int)).max() <= 2
    png = tmp_path / "sky.png"  # an 8-bit sRGB panorama (no light above white: the sky at half strength)
    assert cv2.imwrite(str(png), np.round(srgb_encode(panorama[..., ::-1] / 2) * 255).astype(np.uint8))
    from_png = relight(np.zeros((H, W, 3), np.uint8), normals, albedo, load_environment(png))
    np.testing.assert_allclose(from_png.shading, sky_shading(normals) / 2, atol=0.01)
    openexr = pytest.importorskip("OpenEXR")
    exr = tmp_path / "sky.exr"
    header = {"compression": openexr.ZIP_COMPRESSION, "type": openexr.scanlineimage}
    with openexr.File(header, {"RGB": panorama}) as file:
        file.write(str(exr))
    # Turned by 90 degrees: a sky that depends only on "up" looks the same.
    from_exr = relight(np.zeros((H, W, 3), np.uint8), normals, albedo, load_environment(exr, rotate=90))
    assert_within_one_level(from_exr.image, expected)


def test_environment_rotation_moves_the_light_to_the_right():
    _, normals, albedo, hit = scene()
    panorama = np.zeros((64, 128, 3), np.float32)
    panorama[28:36, 60:68] = 50.0  # a bright patch at the centre: where the camera looks, behind the sphere
    behind = relight(np.zeros((H, W, 3), np.uint8), normals, albedo, Lighting((), EnvironmentMap.from_equirect(
        panorama, rotate=180)))  # fmt: skip
    turned = relight(np.zeros((H, W, 3), np.uint8), normals, albedo, Lighting((), EnvironmentMap.from_equirect(
        panorama, rotate=90)))  # fmt: skip
    left, right = turned.shading[H // 2, W // 2 - 20].sum(), turned.shading[H // 2, W // 2 + 20].sum()
    assert right > 2 * left  # the patch turned from straight ahead to the right: the sphere's right is lit
    assert behind.shading[H // 2, W // 2].sum() > 5 * turned.shading[H // 2, W // 2 - 20].sum()


def test_presets_light_a_face_on_surface():
    for name in ("studio", "overcast", "neon", "sunset"):
        lighting = load_environment(name)
        _, normals, albedo, _ = scene()
        result = relight(np.zeros((H, W, 3), np.uint8), normals, albedo, lighting)
        assert result.image[H // 2, W // 2].max() > 20, name
    with pytest.raises(ValueError, match="neither a lighting preset"):
        load_environment("disco")


# ----------------------------------------------------------------------------------- matte and residual


def test_compositing_through_the_matte_keeps_the_plate_outside():
    _, normals, albedo, hit = scene()
    plate = np.random.default_rng(0).integers(0, 256, (H, W, 3), dtype=np.uint8)
    alpha = hit.astype(np.float32)
    alpha[H // 2, :] *= 0.5  # a soft row
    matting = MattingResult(alpha, np.zeros((H, W, 3), np.float32), None, (H, W))
    lighting = Lighting([DirectionalLight.from_angles(0, 0, intensity=0.8)])
    result = relight(plate, normals, albedo, lighting, matte=matting)
    np.testing.assert_array_equal(result.image[~hit], plate[~hit])
    lit = srgb_decode(albedo) * 0.8 * np.maximum(-normals[..., 2], 0)[..., None]
    inside = hit.copy()
    inside[H // 2, :] = False
    assert np.abs(result.image[inside].astype(int) - expected_u8(lit)[inside].astype(int)).max() <= 1
    mixed = 0.5 * lit + 0.5 * srgb_decode(plate / 255.0)
    row = hit[H // 2]
    assert np.abs(result.image[H // 2][row].astype(int) - expected_u8(mixed)[H // 2][row].astype(int)).max() <= 1
    # A SegResult's foreground, a boolean mask and a uint8 alpha do what the float alpha does where it is 0 or 1.
    seg = SegResult(np.where(hit, 14, 0).astype(np.uint8), tuple(f"class{i}" for i in range(29)), None, (H, W))
    for matte in (seg, hit, (hit * 255).astype(np.uint8)):
        by_mask = relight(plate, normals, albedo, lighting, matte=matte)
        np.testing.assert_array_equal(by_mask.image[~hit], plate[~hit])
        np.testing.assert_array_equal(by_mask.image[inside], result.image[inside])


def test_keep_shading_carries_the_original_shadows_into_the_new_light():
    _, normals, albedo, hit = scene()
    original = Lighting((), EnvironmentMap.from_equirect(sky_panorama()))
    shadow = np.ones((H, W, 1))
    shadow[40:56, 50:62] = 0.35  # a contact shadow the normals do not explain
    plate = srgb_encode(srgb_decode(albedo) * sky_shading(normals) * shadow)  # float sRGB: no 8-bit rounding
    new = Lighting([DirectionalLight.from_angles(-45, 30, (1.0, 0.8, 0.6), 1.2)])
    kept = relight(plate, normals, albedo, new, matte=hit, keep_shading=True)
    lambert = np.maximum(normals @ DirectionalLight.from_angles(-45, 30).direction, 0)[..., None]
    expected = srgb_decode(albedo) * 1.2 * np.array([1.0, 0.8, 0.6]) * lambert * shadow
    assert np.abs(kept.image[hit].astype(int) - expected_u8(expected)[hit].astype(int)).max() <= 1
    np.testing.assert_allclose(kept.residual[hit][..., 0], shadow[hit][..., 0], atol=0.01)
    plain = relight(plate, normals, albedo, new, matte=hit)
    assert plain.image[48, 56].sum() > kept.image[48, 56].sum() + 30  # without it the shadow is gone
    # The estimate is the original sky's harmonics; given (or passed through a function, as a video smooths it
    # over frames), the same coefficients give the same picture.
    np.testing.assert_allclose(kept.original, original.environment.coefficients, atol=0.01)
    seen = []
    through = relight(plate, normals, albedo, new, matte=hit, keep_shading=lambda e: seen.append(e) or e)
    given = relight(plate, normals, albedo, new, matte=hit, keep_shading=kept.original)
    assert len(seen) == 1
    np.testing.assert_array_equal(through.image, kept.image)
    np.testing.assert_array_equal(given.image, kept.image)
    empty = relight(plate, normals, albedo, new, matte=np.zeros((H, W)), keep_shading=True)  # nobody: the plate
    np.testing.assert_array_equal(empty.image, np.round(plate * 255).astype(np.uint8))
    doubled = relight(plate, normals, albedo, new, matte=hit, keep_shading=2 * kept.original)
    np.testing.assert_allclose(doubled.residual[hit], kept.residual[hit] / 2, rtol=1e-4)


# ------------------------------------------------------------------------------------------------ light syntax


@pytest.mark.parametrize("spec, problem", [
    ("dir:az=30", "missing el"), ("spot:az=1,el=2", "start with dir: or point:"),
    ("dir:az=1,el=2,size=3", "unknown key"),
    ("dir:az=north,el=2", "az must be a number"), ("point:x=1,y=2,z=3,color=1,2", "color must be 3 numbers"),
    ("dir:az=1,el=2,intensity=-1", "intensity must be a finite number >= 0"), ("dir:az=1,az=2,el=3", "az given twice"),
])  # fmt: skip
def test_bad_light_specs_are_one_line_on_the_cli(spec, problem, tmp_path, capsys):
    photo = DATA / "astronaut.png"
    assert main(["relight", str(photo), "--light", spec, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and problem in err and spec in err and ERROR.match(err)
    assert err.split("error: ", 1)[1].startswith("--light")
    assert not (tmp_path / "out").exists()


def test_az_el_directions():
    np.testing.assert_allclose(parse_light("dir:az=0,el=0").direction, [0, 0, -1], atol=1e-12)  # from the camera
    np.testing.assert_allclose(parse_light("dir:az=90,el=0").direction, [1, 0, 0], atol=1e-12)  # image right
    np.testing.assert_allclose(parse_light("dir:az=180,el=0").direction, [0, 0, 1], atol=1e-12)  # from behind
    np.testing.assert_allclose(parse_light("dir:az=0,el=90").direction, [0, -1, 0], atol=1e-12)  # from above


# ------------------------------------------------------------------------------------ the CLI, tiny models


def relight_cli(tiny_checkpoints, inputs, out, *extra, tasks=("normal", "albedo", "matting")):
    flags = [f"--model={task}={tiny_checkpoints[task]}" for task in tasks]
    return main(["relight", *map(str, inputs), "-o", str(out), "--device", "cpu", "--input-size", "64", "48",
                 *flags, *extra])  # fmt: skip


def test_cli_relights_a_photo_and_reports_a_bad_input(tiny_checkpoints, tmp_path, capsys):
    photo = DATA / "astronaut.png"
    out = tmp_path / "out"
    code = relight_cli(tiny_checkpoints, [photo, tmp_path / "missing.jpg"], out, "--env", "neon",
                       "--light", "dir:az=-40,el=30,intensity=0.5", "--keep-shading")  # fmt: skip
    captured = capsys.readouterr()
    assert code == 1
    assert len(captured.err.strip().splitlines()) == 1 and "missing.jpg" in captured.err
    relit = cv2.imread(str(out / "astronaut_relit.png"))
    plate = cv2.imread(str(photo))
    assert relit.shape == plate.shape and np.abs(relit.astype(int) - plate.astype(int)).mean() > 1
    # --matte seg with a seg model: the background keeps the plate exactly where the seg says background.
    code = relight_cli(tiny_checkpoints, [photo], tmp_path / "seg", "--light", "dir:az=0,el=0", "--matte", "seg",
                       tasks=("normal", "albedo", "seg"))  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert cv2.imread(str(tmp_path / "seg" / "astronaut_relit.png")).shape == plate.shape


def test_cli_relights_a_real_encoded_video_and_a_frame_folder(tiny_checkpoints, tmp_path, capsys):
    import av

    crops = list(moving_crops(6, (64, 80)))
    clip = write_clip(tmp_path / "clip.mp4", crops, fps=12)
    out = tmp_path / "out"
    code = relight_cli(tiny_checkpoints, [clip], out, "--env", "studio", "--stride", "2", "--keep-shading")
    assert code == 0, capsys.readouterr().err
    with av.open(str(out / "clip_relit.mp4")) as container:
        frames = [(f.to_ndarray(format="rgb24"), float(f.time)) for f in container.decode(video=0)]
    assert len(frames) == 3 and frames[0][0].shape == (64, 80, 3)
    np.testing.assert_allclose([t for _, t in frames], [0, 2 / 12, 4 / 12], atol=1e-3)  # the source's times
    assert np.abs(frames[1][0].astype(int) - crops[2].astype(int)).mean() > 2  # relit, not the plate
    assert [p.name for p in out.iterdir()] == ["clip_relit.mp4"]  # the work folder is gone
    sequence = tmp_path / "shot"
    sequence.mkdir()
    for i, crop in enumerate(crops[:3]):
        cv2.imwrite(str(sequence / f"shot.{i:04d}.png"), cv2.cvtColor(crop, cv2.COLOR_RGB2BGR))
    code = relight_cli(tiny_checkpoints, [sequence], out, "--frames", "--fps", "24", "--light", "dir:az=0,el=0",
                       "--matte", "none", tasks=("normal", "albedo"))  # fmt: skip
    assert code == 0, capsys.readouterr().err
    with av.open(str(out / "shot_relit.mp4")) as container:
        assert len(list(container.decode(video=0))) == 3
    # A file that is no video: one error line naming it, status 1.
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    assert relight_cli(tiny_checkpoints, [broken], out, "--env", "studio") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.mp4" in err[0] and not (out / "broken_relit.mp4").exists()


# ------------------------------------------------------------------------ bad numbers, bad environment maps


def write_radiance(path, resolution: bytes, data: bytes):
    """A Radiance .hdr of the given resolution line (b"-Y 64 +X 128") followed by ``data`` as its pixels."""
    path.write_bytes(b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n" + resolution + b"\n" + data)
    return path


def write_exr(path, panorama):
    openexr = pytest.importorskip("OpenEXR")
    header = {"compression": openexr.ZIP_COMPRESSION, "type": openexr.scanlineimage}
    with openexr.File(header, {"RGB": np.ascontiguousarray(panorama, np.float32)}) as file:
        file.write(str(path))
    return path


def relight_env_error(tmp_path, capsys, *flags):
    """``sapiens2 relight`` on the photo with these flags, refused before any model is read: the one error line."""
    assert main(["relight", str(DATA / "astronaut.png"), "-o", str(tmp_path / "refused"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ERROR.match(err[0]), err
    assert not (tmp_path / "refused").exists()
    return err[0]


def test_an_hdr_whose_header_declares_gigapixels_is_refused_from_the_header(tmp_path, capsys):
    huge = write_radiance(tmp_path / "huge.hdr", b"-Y 30000 +X 60000", b"\x02\x02\x75\x30" + bytes(12))
    err = relight_env_error(tmp_path, capsys, "--env", str(huge))
    assert f"--env {huge}: its header declares 60000x30000 pixels (1800.0 megapixels)" in err
    assert "over the limit of 200 megapixels" in err and "--max-megapixels" in err
    # The limit is --max-megapixels: a small real panorama over a lower limit is refused the same way ...
    sky = tmp_path / "sky.hdr"
    assert cv2.imwrite(str(sky), sky_panorama(64)[..., ::-1])
    err = relight_env_error(tmp_path, capsys, "--env", str(sky), "--max-megapixels", "0.005")
    assert "128x64 pixels" in err and "over the limit of 0.005 megapixels" in err
    # ... and with no limit of ours, OpenCV's own (CV_IO_MAX_IMAGE_PIXELS) is one line too, not a traceback.
    err = relight_env_error(tmp_path, capsys, "--env", str(huge), "--max-megapixels", "inf")
    assert f"--env {huge}: cannot read it as a Radiance .hdr image" in err and "CV_IO_MAX_IMAGE_PIXELS" in err


def test_an_exr_whose_data_window_is_huge_is_refused_from_the_header(tmp_path, capsys):
    exr = write_exr(tmp_path / "huge.exr", sky_panorama(8))
    data = bytearray(exr.read_bytes())
    at = data.find(b"dataWindow\x00box2i\x00") + len(b"dataWindow\x00box2i\x00") + 4  # after the attribute's size
    data[at : at + 16] = struct.pack("<4i", 0, 0, 15999, 13999)  # xMin, yMin, xMax, yMax: 16000 x 14000
    exr.write_bytes(bytes(data))
    err = relight_env_error(tmp_path, capsys, "--env", str(exr))
    assert f"--env {exr}: its header declares 16000x14000 pixels (224.0 megapixels)" in err
    # Pixel data cut short: one line saying so (the bindings themselves still print a warning of their own).
    cut = tmp_path / "cut.exr"
    cut.write_bytes(write_exr(tmp_path / "whole.exr", sky_panorama(64)).read_bytes()[:400])
    err = relight_env_error(tmp_path, capsys, "--env", str(cut))
    assert f"--env {cut}: cannot read it as an OpenEXR image (corrupt or truncated pixel data)" in err


def test_a_corrupt_hdr_costs_one_line_and_nothing_from_opencvs_log(tmp_path):
    corrupt = write_radiance(tmp_path / "corrupt.hdr", b"-Y 64 +X 128", b"\x01\x02\x03garbage")
    env = {k: v for k, v in os.environ.items() if k != "OPENCV_LOG_LEVEL"}  # OpenCV's default level: it would talk
    result = subprocess.run([sys.executable, "-m", "sapiens2", "relight", str(DATA / "astronaut.png"), "--env",
                             str(corrupt), "-o", str(tmp_path / "out")], capture_output=True, text=True, env=env,
                            timeout=300)  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and ERROR.match(lines[0]), result.stderr
    assert lines[0].endswith(f"--env {corrupt}: cannot read it as a Radiance .hdr image (corrupt, truncated or "
                             "not RGBE)")  # fmt: skip
    # OpenCV's level is silenced for the read only: a later problem elsewhere is logged as before.
    level = cv2.utils.logging.getLogLevel()
    with pytest.raises(ValueError, match="corrupt, truncated"):
        load_environment(corrupt)
    assert cv2.utils.logging.getLogLevel() == level


NUMERIC_FLAGS = ("--env-rotate", "--env-intensity", "--specular", "--shininess", "--exposure", "--distance", "--focal")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("flag", NUMERIC_FLAGS)
def test_a_non_finite_number_is_refused_naming_its_flag(flag, value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["relight", str(DATA / "astronaut.png"), "--env", "studio", f"{flag}={value}", "-o", str(tmp_path / "out"),
              "--model", f"normal={tmp_path / 'no_model.safetensors'}"])  # fmt: skip
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(rf"sapiens2 relight: error: argument {flag}: must be (a finite number|a number of stops "
                        rf"from -64 to 64)( [>=]+ 0)?, got '{re.escape(value)}'", err), err  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_exposure_beyond_64_stops_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["relight", str(DATA / "astronaut.png"), "--env", "studio", "--exposure", "200", "-o", str(tmp_path)])
    assert exit_.value.code == 2 and "argument --exposure: must be a number of stops from -64 to 64, got '200'" in (
        capsys.readouterr().err)  # fmt: skip
    _, normals, albedo, _ = scene()
    for exposure in (math.nan, math.inf, 200.0):  # 2**200 is inf in float32: the picture would be inf and NaN
        with pytest.raises(ValueError, match="exposure must be a finite number of stops from -64 to 64"):
            relight(np.zeros((H, W, 3), np.uint8), normals, albedo, load_environment("studio"), exposure=exposure)
        with pytest.raises(ValueError, match="exposure must be a finite number of stops"):
            RelightOptions(lighting=load_environment("studio"), exposure=exposure)


def test_the_library_names_the_non_finite_number_and_does_not_contradict_itself():
    with pytest.raises(ValueError, match=r"^rotate must be a finite number of degrees, got nan$"):
        load_environment("studio", rotate=math.nan)
    with pytest.raises(ValueError, match=r"^rotate must be a finite number of degrees, got inf$"):
        EnvironmentMap.from_equirect(sky_panorama(16), rotate=math.inf)
    with pytest.raises(ValueError, match=r"^intensity must be a finite number >= 0, got inf$"):
        load_environment("neon", intensity=math.inf)
    with pytest.raises(ValueError, match=r"^coefficients must be finite, got NaN or inf") as error:
        EnvironmentMap(np.full((9, 3), np.nan))
    assert "shape" not in str(error.value)
    with pytest.raises(ValueError, match=r"^coefficients must be a \(9, 3\) array, got shape \(4, 3\)$"):
        EnvironmentMap(np.zeros((4, 3)))
    for make, problem in [
        (lambda: DirectionalLight.from_angles(0, 0, intensity=math.inf), "intensity must be a finite number >= 0"),
        (lambda: PointLight((0, 0, 1), intensity=math.nan), "intensity must be a finite number >= 0"),
        (lambda: Lighting([parse_light("dir:az=0,el=0")], specular=math.inf), "specular must be a finite number"),
        (lambda: Lighting([parse_light("dir:az=0,el=0")], shininess=math.inf), "shininess must be a finite number"),
        (lambda: RelightOptions(lighting=load_environment("studio"), distance=math.inf), "distance must be a finite"),
        (lambda: RelightOptions(lighting=load_environment("studio"), focal=math.inf), "focal must be a finite"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=problem):
            make()


def test_negative_light_is_clamped_with_one_warning_and_a_mostly_negative_map_refused(
    tiny_checkpoints, tmp_path, capsys
):
    ringing = sky_panorama(64)
    ringing[30:32, 10:20] = -0.02  # the ringing a filtered HDR keeps around a bright light: 20 of 8192 pixels
    exr = write_exr(tmp_path / "ringing.exr", ringing)
    out = tmp_path / "out"
    code = relight_cli(tiny_checkpoints, [DATA / "astronaut.png"], out, "--env", str(exr), "--matte", "none",
                       tasks=("normal", "albedo"))  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 0 and (out / "astronaut_relit.png").exists()
    assert len(err) == 1 and re.fullmatch(rf"sapiens2( relight)?: warning: {re.escape(str(exr))}: 0.24 % of the "
                                          r"environment map's values are negative \(down to -0.02\); read as 0",
                                          err[0]), err  # fmt: skip
    # Read as 0: the light is the clamped panorama's, to the last bit.
    clamped = EnvironmentMap.from_equirect(np.maximum(ringing, 0))
    np.testing.assert_array_equal(load_environment(exr).environment.coefficients, clamped.coefficients)
    capsys.readouterr()
    negative = write_exr(tmp_path / "negative.exr", -ringing)  # mostly negative: not radiance
    err = relight_env_error(tmp_path, capsys, "--env", str(negative))
    assert f"--env {negative}: 100 % of its values are negative (down to -1.4): not linear radiance" in err


def test_a_large_panorama_is_projected_in_bands_of_bounded_memory():
    panorama = sky_panorama(1024)  # 1024 x 2048 x 3 float32: 25 MB; its (H, W, 9) float64 basis alone is 150 MB
    tracemalloc.start()
    try:
        environment = EnvironmentMap.from_equirect(panorama, rotate=90)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 120e6, f"{peak / 1e6:.0f} MB"  # the whole-panorama projection took 400 MB
    _, normals, _, _ = scene()
    np.testing.assert_allclose(environment.shading(normals), sky_shading(normals), atol=2e-3)
