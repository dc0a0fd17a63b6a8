"""Relighting (``sapiens2.vfx``) against analytic renders of a synthetic scene, and ``sapiens2 relight`` through its
real entry point with tiny random models on a photo and a real encoded video."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
from conftest import DATA
from videoclips import moving_crops, write_clip

from sapiens2.cli import main
from sapiens2.dense.matting import MattingResult
from sapiens2.dense.seg import SegResult
from sapiens2.vfx import DirectionalLight, EnvironmentMap, Lighting, PointLight, load_environment, parse_light, relight

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
    ("dir:az=1,el=2,intensity=-1", "intensity must be >= 0"), ("dir:az=1,az=2,el=3", "az given twice"),
])  # fmt: skip
def test_bad_light_specs_are_one_line_on_the_cli(spec, problem, tmp_path, capsys):
    photo = DATA / "astronaut.png"
    assert main(["relight", str(photo), "--light", spec, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and problem in err and spec in err and err.startswith("error: --light")
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
