"""OpenEXR render passes and 16-bit data images (``--format exr|png16|tiff16``), read back by real readers:
OpenImageIO for every channel and header attribute, a Cryptomatte decoder written here from the specification."""

from __future__ import annotations

import json
import struct

import cv2
import numpy as np
import pytest
from conftest import TINY_INPUT, require_module

from sapiens2.cli import main
from sapiens2.dense.albedo import AlbedoResult
from sapiens2.dense.matting import MattingResult
from sapiens2.dense.normal import NormalResult
from sapiens2.dense.pointmap import PointmapResult
from sapiens2.dense.seg import SegResult
from sapiens2.metadata import seg_metadata
from sapiens2.predict.exr import cryptomatte_float, murmurhash3_32, write_exr
from sapiens2.predict.writers import WriteOptions, write_exr_result, write_result

oiio = require_module("OpenImageIO")
require_module("OpenEXR")

H, W = 24, 32
NAMES = seg_metadata().class_names


def synthetic_results(seed: int = 0, probabilities: bool = False) -> dict:
    """Every dense task's result for an H x W image: random but plausible (unit normals, points in front)."""
    rng = np.random.default_rng(seed)
    normals = rng.normal(size=(H, W, 3)).astype(np.float32)
    normals /= np.linalg.norm(normals, axis=2, keepdims=True)
    depth = rng.uniform(1.0, 5.0, (H, W)).astype(np.float32)
    v, u = np.mgrid[0:H, 0:W].astype(np.float32)
    focal = 40.0
    points = np.stack([(u - W / 2) * depth / focal, (v - H / 2) * depth / focal, depth], axis=2).astype(np.float32)
    albedo = rng.uniform(0, 1, (H, W, 3)).astype(np.float32)
    alpha = rng.uniform(0, 1, (H, W)).astype(np.float32)
    labels = rng.integers(0, len(NAMES), (H, W)).astype(np.uint8)
    probs = None
    if probabilities:
        logits = rng.normal(size=(len(NAMES), H, W)).astype(np.float32)
        logits[labels, np.arange(H)[:, None], np.arange(W)] += 8.0  # the label is the most likely class
        probs = np.exp(logits) / np.exp(logits).sum(axis=0, keepdims=True)
    return {
        "normal": NormalResult(normals, None, (H, W)),
        "pointmap": PointmapResult(points, depth, focal, 1.0, None, (H, W)),
        "albedo": AlbedoResult((albedo * 255).astype(np.uint8), albedo, None, (H, W)),
        "matting": MattingResult(alpha, np.zeros((H, W, 3), np.float32), None, (H, W)),
        "seg": SegResult(labels, NAMES, None, (H, W), probs),
    }


def read_exr(path) -> tuple[dict[str, np.ndarray], dict[str, str], dict]:
    """channel -> (H, W) array in its file type, channel -> 'half'/'float', and the header attributes (OIIO)."""
    image = oiio.ImageInput.open(str(path))
    assert image is not None, oiio.geterror()
    spec = image.spec()
    pixels = image.read_image(0, 0, 0, spec.nchannels, oiio.UNKNOWN)  # the file's own types (mixed -> float)
    image.close()
    names = list(spec.channelnames)
    types = {name: str(spec.channelformat(i)) for i, name in enumerate(names)}
    channels = {name: np.asarray(pixels)[..., i] for i, name in enumerate(names)}
    attributes = {attribute.name: attribute.value for attribute in spec.extra_attribs}
    return channels, types, attributes


def srgb_to_linear(values):  # the standard's curve, written out here independently of the package
    values = np.asarray(values, np.float64)
    return np.where(values <= 0.04045, values / 12.92, ((values + 0.055) / 1.055) ** 2.4)


def decode_cryptomatte(channels: dict, attributes: dict, layer_name: str) -> dict[str, np.ndarray]:
    """The specification's decoding: find the layer's metadata key by its name, read the manifest, and per name sum
    the coverage of every rank whose id (the manifest's hex as float32 bits) matches. Returns name -> coverage."""
    keys = [k.split("/")[1] for k, v in attributes.items() if k.startswith("cryptomatte/") and k.endswith("/name")
            and v == layer_name]  # fmt: skip
    assert len(keys) == 1, keys
    key = keys[0]
    assert attributes[f"cryptomatte/{key}/hash"] == "MurmurHash3_32"
    assert attributes[f"cryptomatte/{key}/conversion"] == "uint32_to_float32"
    manifest = json.loads(attributes[f"cryptomatte/{key}/manifest"])
    layers = sorted({name.split(".")[0] for name in channels if name.startswith(layer_name)})
    assert layers and all(layer[len(layer_name) :].isdigit() for layer in layers)
    ranks = []
    for layer in layers:
        ranks += [(channels[f"{layer}.R"], channels[f"{layer}.G"]), (channels[f"{layer}.B"], channels[f"{layer}.A"])]
    mattes = {}
    for name, hex_id in manifest.items():
        target = np.float32(struct.unpack(">f", bytes.fromhex(hex_id))[0])
        mattes[name] = sum(np.where(ids == target, coverage, 0.0) for ids, coverage in ranks)
    return mattes


def test_murmurhash3_matches_published_vectors_and_the_cryptomatte_spec_ids():
    # MurmurHash3_x86_32 test vectors published with the algorithm's ports (SMHasher's verification strings).
    assert murmurhash3_32(b"", 0) == 0
    assert murmurhash3_32(b"", 1) == 0x514E28B7
    assert murmurhash3_32(b"hello", 0) == 0x248BFA47
    assert murmurhash3_32(b"Hello, world!", 1234) == 0xFAF6CDB3
    assert murmurhash3_32(b"The quick brown fox jumps over the lazy dog", 0) == 0x2E4FF723
    assert murmurhash3_32("\u00e9") == murmurhash3_32("\u00e9".encode())  # str -> UTF-8
    # The manifest examples of the Cryptomatte specification 1.1.0 (name -> hex of the float32 id).
    for name, hex_id in {"bunny": "13851a76", "default": "42c9679f", "bunny_porcelain_mat": "b24b26d4"}.items():
        assert f"{int(np.float32(cryptomatte_float(name)).view(np.uint32)):08x}" == hex_id
    ids = np.array([cryptomatte_float(name) for name in NAMES], np.float32)
    assert np.isfinite(ids).all() and (np.abs(ids) >= np.finfo(np.float32).tiny).all()  # never NaN, inf, denormal


def test_every_channel_reads_back_in_openimageio_equal_to_our_arrays(tmp_path):
    results = synthetic_results()
    image = np.random.default_rng(1).integers(0, 256, (H, W, 3), dtype=np.uint8)
    path = write_exr(tmp_path / "frame.exr", results, image, models={"normal": "sapiens2_1b (x.safetensors)"})
    channels, types, attributes = read_exr(path)
    expected_types = {
        **dict.fromkeys(["R", "G", "B", "A", "N.X", "N.Y", "N.Z", "albedo.R", "albedo.G", "albedo.B"], "half"),
        **dict.fromkeys(["P.X", "P.Y", "P.Z", "Z"], "float"),
        **{f"CryptoBodyPart00.{c}": "float" for c in "RGBA"},
    }
    assert types == expected_types
    half = lambda a: np.asarray(a, np.float32).astype(np.float16)  # noqa: E731
    for i, axis in enumerate("XYZ"):
        assert np.array_equal(channels[f"N.{axis}"], half(results["normal"].normals[..., i]))
        assert np.array_equal(channels[f"P.{axis}"], results["pointmap"].points[..., i])
    assert np.array_equal(channels["Z"], results["pointmap"].depth)  # camera z, metres, float32 exactly
    linear_plate, linear_albedo = srgb_to_linear(image / 255.0), srgb_to_linear(results["albedo"].albedo_float)
    for i, colour in enumerate("RGB"):
        np.testing.assert_allclose(channels[colour], linear_plate[..., i], atol=1e-3, rtol=1e-3)  # half precision
        np.testing.assert_allclose(channels[f"albedo.{colour}"], linear_albedo[..., i], atol=1e-3, rtol=1e-3)
    assert np.array_equal(channels["A"], half(results["matting"].alpha))
    assert attributes["compression"] == "zip"  # lossless
    assert attributes["sapiens2/model/normal"] == "sapiens2_1b (x.safetensors)"
    assert attributes["sapiens2/focalLengthPx"] == pytest.approx(40.0)
    assert attributes["pinholeFocalLength"] == pytest.approx(40.0 * 36.0 / W)  # mm at a 36 mm sensor width
    assert attributes["sapiens2/sensorWidthMm"] == pytest.approx(36.0)
    assert attributes["sapiens2/normalConvention"] == "opencv"


@pytest.mark.parametrize("probabilities", [False, True], ids=["labels", "probabilities"])
def test_cryptomatte_decoded_from_the_file_recovers_every_body_part(tmp_path, probabilities):
    results = synthetic_results(seed=3, probabilities=probabilities)
    labels = results["seg"].labels
    channels, _, attributes = read_exr(write_exr(tmp_path / "seg.exr", {"seg": results["seg"]}))
    mattes = decode_cryptomatte(channels, attributes, "CryptoBodyPart")
    assert list(mattes) == list(NAMES)
    for class_id, name in enumerate(NAMES):
        if probabilities:  # coverage = the class probability where the class is among the ranks written
            ranked = np.argsort(-results["seg"].probabilities, axis=0, kind="stable")[:6]
            expected = np.where((ranked == class_id).any(axis=0), results["seg"].probabilities[class_id], 0)
            np.testing.assert_allclose(mattes[name], expected, rtol=0, atol=0)
        else:
            assert np.array_equal(mattes[name], (labels == class_id).astype(np.float32)), name
    assert np.array_equal(np.argmax(np.stack([mattes[name] for name in NAMES]), axis=0), labels)  # picks = labels
    assert len([c for c in channels if c.startswith("CryptoBodyPart")]) == (12 if probabilities else 4)


def test_normal_conventions_flip_y_and_z_for_opengl_and_blender(tmp_path):
    facing = np.zeros((H, W, 3), np.float32)
    facing[..., 2] = -1.0  # OpenCV: a surface facing the camera points along -z (toward the viewer)
    facing[: H // 2, :, 1], facing[: H // 2, :, 2] = -0.6, -0.8  # the top half tilted up (OpenCV y is down)
    results = synthetic_results()
    results["normal"] = NormalResult(facing, None, (H, W))
    read = {}
    for convention in ("opencv", "opengl", "blender"):
        channels, _, attributes = read_exr(write_exr(tmp_path / f"{convention}.exr", results,
                                                     normal_convention=convention))  # fmt: skip
        assert attributes["sapiens2/normalConvention"] == convention
        read[convention] = channels
    gl, cv = read["opengl"], read["opencv"]
    assert (gl["N.Z"][H // 2 :] == 1.0).all()  # OpenGL/Blender camera: +z toward the viewer
    assert (gl["N.Y"][: H // 2] > 0).all()  # and +y up
    for axis, sign in zip("XYZ", (1, -1, -1), strict=True):
        assert np.array_equal(gl[f"N.{axis}"], sign * cv[f"N.{axis}"])
        assert np.array_equal(gl[f"P.{axis}"], sign * cv[f"P.{axis}"])
        assert np.array_equal(read["blender"][f"N.{axis}"], gl[f"N.{axis}"])
    assert np.array_equal(gl["Z"], cv["Z"]) and (gl["Z"] > 0).all()  # depth stays a positive distance
    assert (gl["P.Z"] < 0).all()  # points in front of an OpenGL camera have negative z


def test_mask_zeroes_the_background_and_write_result_refuses_a_lone_task(tmp_path):
    results = synthetic_results()
    mask = np.zeros((H, W), bool)
    mask[4:20, 8:24] = True
    written = write_exr_result(results, tmp_path / "img", None, WriteOptions(output_format="exr", mask=mask))
    assert written == [tmp_path / "img.exr"]
    channels, _, _ = read_exr(written[0])
    for name in ("N.X", "P.Z", "Z", "albedo.G"):
        assert (channels[name][~mask] == 0).all() and (channels[name][mask] != 0).all(), name
    assert "R" not in channels  # no image given: no plate
    with pytest.raises(ValueError, match="write_exr_result"):
        write_result("normal", results["normal"], tmp_path / "n", None, WriteOptions(output_format="exr"))


def test_missing_openexr_names_the_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "OpenEXR", None)
    with pytest.raises(ImportError, match=r"pip install 'sapiens2\[exr\]'"):
        write_exr(tmp_path / "x.exr", synthetic_results())


@pytest.mark.parametrize("output_format,extension", [("png16", "png"), ("tiff16", "tif")])
def test_sixteen_bit_png_and_tiff_round_trip(tmp_path, output_format, extension):
    results = synthetic_results(seed=5)
    options = WriteOptions(output_format=output_format, overlay=False, save_ply=False, normal_convention="opengl")
    for task in ("normal", "pointmap", "albedo", "matting"):
        write_result(task, results[task], tmp_path / "img", None, options)

    def read(suffix, channels):
        path = tmp_path / f"img{suffix}.{extension}"
        image = oiio.ImageInput.open(str(path))  # a reader other than the OpenCV that wrote it
        assert image is not None, oiio.geterror()
        spec = image.spec()
        assert (spec.nchannels, str(spec.format)) == (channels, "uint16"), path
        pixels = np.asarray(image.read_image(0, 0, 0, channels, oiio.UINT16)).reshape(H, W, channels)
        image.close()
        return pixels.astype(np.float64)

    normals = read("_normal", 3) / 65535 * 2 - 1
    expected = results["normal"].normals * np.array([1, -1, -1])  # opengl
    np.testing.assert_allclose(normals, expected, atol=1.01 / 65535)
    depth_mm = read("_depth", 1)[..., 0]
    np.testing.assert_allclose(depth_mm, results["pointmap"].depth * 1000, atol=0.5)
    np.testing.assert_allclose(read("_albedo", 3) / 65535, results["albedo"].albedo_float, atol=0.51 / 65535)
    np.testing.assert_allclose(read("_alpha", 1)[..., 0] / 65535, results["matting"].alpha, atol=0.51 / 65535)
    assert read("_cutout", 4).shape == (H, W, 4)
    assert not (tmp_path / "img_normal.npy").exists() and not (tmp_path / "img_depth.npy").exists()


# --------------------------------------------------------------------------------------------- the real entry point


PHOTO_TASKS = ["seg", "normal", "pointmap", "albedo", "matting", "pose"]


def predict(tiny_checkpoints, tasks, inputs, out, *extra):
    argv = ["predict", "--task", ",".join(tasks), *map(str, inputs), "-o", str(out), "--device", "cpu",
            "--input-size", *map(str, TINY_INPUT["pointmap"]), "--detector", "none",
            *[f"--model={task}={tiny_checkpoints[task]}" for task in tasks], *extra]  # fmt: skip
    return main(argv)


def test_cli_format_exr_writes_one_file_per_image_with_every_task(tiny_checkpoints, tmp_path, capsys):
    from conftest import DATA

    photo = DATA / "astronaut.png"
    plain, exr = tmp_path / "plain", tmp_path / "exr"
    assert predict(tiny_checkpoints, ["seg", "pointmap"], [photo], plain) == 0
    code = predict(tiny_checkpoints, PHOTO_TASKS, [photo], exr, "--format", "exr", "--normal-convention", "blender")
    assert code == 0, capsys.readouterr().err
    outputs = sorted(p.name for p in exr.iterdir() if p.name != "_bulk")  # _bulk: the run's record of its inputs
    assert outputs == ["astronaut.exr", "astronaut_pose.jpg", "astronaut_pose.json"]
    channels, _, attributes = read_exr(exr / "astronaut.exr")
    assert {"R", "G", "B", "A", "N.X", "N.Y", "N.Z", "P.X", "P.Y", "P.Z", "Z", "albedo.R", "CryptoBodyPart00.R"} <= set(
        channels
    )
    assert attributes["sapiens2/tasks"] == "seg,normal,pointmap,albedo,matting"
    assert attributes["sapiens2/model/seg"].endswith(f"({tiny_checkpoints['seg'].name})")
    assert attributes["sapiens2/normalConvention"] == "blender"
    labels = cv2.imread(str(plain / "astronaut_seg.png"), cv2.IMREAD_UNCHANGED)  # the same model's default output
    mattes = decode_cryptomatte(channels, attributes, "CryptoBodyPart")
    for class_id, name in enumerate(NAMES):
        assert np.array_equal(mattes[name] == 1, labels == class_id), name
    np.testing.assert_array_equal(channels["Z"], np.load(plain / "astronaut_depth.npy"))
    np.testing.assert_array_equal(channels["P.Y"], -np.load(plain / "astronaut_pointmap.npy")[..., 1])
    focal = json.loads((plain / "astronaut_focal.json").read_text())["focal_length_px"]
    assert attributes["sapiens2/focalLengthPx"] == pytest.approx(focal, rel=1e-6)
    # resumable: the EXR is each dense task's last-written file
    capsys.readouterr()
    assert predict(tiny_checkpoints, PHOTO_TASKS, [photo], exr, "--format", "exr", "--skip-existing") == 0
    assert "1 images skipped" in capsys.readouterr().out


def test_cli_tiff16_and_bad_format_values(tiny_checkpoints, tmp_path, capsys):
    from conftest import DATA

    out = tmp_path / "out"
    assert predict(tiny_checkpoints, ["normal"], [DATA / "astronaut.png"], out, "--format", "tiff16") == 0
    normals = cv2.imread(str(out / "astronaut_normal.tif"), cv2.IMREAD_UNCHANGED)
    assert normals.dtype == np.uint16 and normals.shape == (512, 512, 3)
    with pytest.raises(SystemExit) as stop:
        predict(tiny_checkpoints, ["normal"], [DATA / "astronaut.png"], out, "--normal-convention", "directx")
    assert stop.value.code == 2 and "--normal-convention" in capsys.readouterr().err
    code = predict(tiny_checkpoints, ["normal"], ["x.parquet"], out, "--format", "exr", "--sink", "parquet")
    assert code == 2 and "--format exr writes files: use --sink files" in capsys.readouterr().err


def test_video_becomes_an_exr_sequence_in_place_of_the_npz_chunks(tiny_checkpoints, tmp_path, capsys):
    from videoclips import static_noisy, write_clip

    require_module("av")
    clip = write_clip(tmp_path / "clip.mp4", list(static_noisy(5, size=(48, 64))), fps=10)
    out = tmp_path / "out"
    tasks = ["seg", "normal"]
    argv = ["predict", "--task", ",".join(tasks), str(clip), "-o", str(out), "--device", "cpu", "--input-size", "64",
            "48", *[f"--model={task}={tiny_checkpoints[task]}" for task in tasks], "--format", "exr"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    frames = sorted(p.name for p in (out / "clip_exr").iterdir())
    assert frames == [f"clip.{i:04d}.exr" for i in range(5)]
    assert not (out / "clip_seg").exists() and not (out / "clip.parts").exists()  # EXR in place of the npz
    summary = json.loads((out / "clip_video.json").read_text())
    assert summary["exr"] == "clip_exr/clip.####.exr" and summary["frames"] == 5
    channels, _, attributes = read_exr(out / "clip_exr" / "clip.0003.exr")
    assert {"R", "N.X", "CryptoBodyPart00.R"} <= set(channels) and channels["R"].shape == (48, 64)
    mattes = decode_cryptomatte(channels, attributes, "CryptoBodyPart")
    assert np.array_equal(sum(mattes.values()), np.ones((48, 64)))  # every pixel has exactly one body part


def test_bulk_mode_writes_the_same_exr_files(tiny_checkpoints, tmp_path, capsys):
    from conftest import DATA

    out = tmp_path / "bulk"
    argv = ["predict", "--task", "seg,normal", str(DATA / "astronaut.png"), "-o", str(out), "--devices", "cpu:1",
            "--input-size", "64", "48", "--format", "exr",
            *[f"--model={task}={tiny_checkpoints[task]}" for task in ("seg", "normal")]]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    channels, _, attributes = read_exr(out / "astronaut.exr")
    assert {"R", "N.X", "N.Y", "N.Z", "CryptoBodyPart00.R"} <= set(channels)
    assert sum(decode_cryptomatte(channels, attributes, "CryptoBodyPart").values()).min() == 1  # a part per pixel


def test_video_exr_frames_appear_only_with_their_sealed_chunk(tmp_path):
    from fractions import Fraction

    from sapiens2.video.write import ChunkWriter, ExrFrames, read_markers

    results = synthetic_results()
    image = np.zeros((H, W, 3), np.uint8)
    stem = tmp_path / "clip"

    def frame(writer, index):
        writer.add_exr(index, {"normal": results["normal"], "pose": object()}, image)  # pose is not EXR's
        writer.add(index, index, {"frame": index, "time": index / 10}, None, {})

    first = ChunkWriter(stem, 10.0, Fraction(1, 10), (), overlay=False, exr=ExrFrames("opengl"))
    for index in (0, 1):
        frame(first, index)
    first.seal()
    frame(first, 2)  # then the process is killed: frame 2's chunk is never sealed
    folder = ExrFrames.folder(stem)
    assert sorted(p.name for p in folder.iterdir()) == ["clip.0000.exr", "clip.0001.exr"]
    assert [m["last"] for m in read_markers(first.parts)] == [1]
    resumed = ChunkWriter(stem, 10.0, Fraction(1, 10), (), overlay=False, exr=ExrFrames("opengl"), chunk=1)
    for index in (2, 3, 4):
        frame(resumed, index)
    resumed.seal()
    assert sorted(p.name for p in folder.iterdir()) == [f"clip.{i:04d}.exr" for i in range(5)]
    channels, _, attributes = read_exr(folder / "clip.0004.exr")
    assert attributes["sapiens2/normalConvention"] == "opengl" and set(channels) == {"R", "G", "B", "N.X", "N.Y", "N.Z"}
