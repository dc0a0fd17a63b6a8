"""Blender (``bpy`` in its own venv, headless) reads our EXR as a multilayer image with the same passes, and its own
Cryptomatte compositor node picks body parts equal to our seg labels."""

from __future__ import annotations

import json
import subprocess
import textwrap

import numpy as np
import pytest
from conftest import blender_python, require_module
from test_exr import NAMES, synthetic_results

from sapiens2.predict.exr import write_exr

pytestmark = pytest.mark.slow

oiio = require_module("OpenImageIO")
require_module("OpenEXR")

PICKED = ["Left_Hand", "Face_Neck", "Torso", "Background"]

# Run inside Blender: open the file, list the Image node's passes, then render the compositor once per output:
# each picked body part's Cryptomatte matte, and the Depth and N passes, each to a float EXR.
BLENDER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import bpy

    source, folder, picked, size = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    image = bpy.data.images.load(source)
    scene = bpy.context.scene
    scene.render.engine = "BLENDER_WORKBENCH"
    scene.render.resolution_percentage = 100
    scene.render.image_settings.file_format = "OPEN_EXR"
    scene.render.image_settings.color_depth = "32"
    tree = bpy.data.node_groups.new("sapiens2", "CompositorNodeTree")
    scene.compositing_node_group = tree
    tree.interface.new_socket("Image", in_out="OUTPUT", socket_type="NodeSocketColor")
    output = tree.nodes.new("NodeGroupOutput")
    passes = tree.nodes.new("CompositorNodeImage")
    passes.image = image
    scene.render.resolution_x, scene.render.resolution_y = size  # the file's (W, H): the compositor's canvas
    crypto = tree.nodes.new("CompositorNodeCryptomatteV2")
    crypto.source = "IMAGE"
    crypto.image = image
    report = {"type": image.type, "passes": [o.name for o in passes.outputs], "layer": crypto.layer_name}

    def render(socket, name):
        tree.links.clear()
        tree.links.new(socket, output.inputs[0])
        scene.render.filepath = f"{folder}/{name}.exr"
        bpy.ops.render.render(write_still=True)

    for part in picked:
        crypto.matte_id = part
        render(crypto.outputs["Matte"], part)
    render(passes.outputs["Depth"], "depth")
    render(passes.outputs["N"], "normal")
    print("REPORT " + json.dumps(report))
    """
)


def read_rgba(path) -> np.ndarray:
    image = oiio.ImageInput.open(str(path))
    assert image is not None, oiio.geterror()
    spec = image.spec()
    pixels = np.asarray(image.read_image(0, 0, 0, spec.nchannels, oiio.FLOAT))
    image.close()
    return pixels


def test_blender_reads_the_passes_and_its_cryptomatte_node_picks_our_body_parts(tmp_path):
    python = blender_python()
    results = synthetic_results(seed=7)
    image = np.random.default_rng(2).integers(0, 256, (*results["seg"].size, 3), dtype=np.uint8)
    path = write_exr(tmp_path / "shot.0001.exr", results, image)
    script = tmp_path / "blender_check.py"
    script.write_text(BLENDER_SCRIPT)
    renders = tmp_path / "renders"
    height, width = results["seg"].size
    argv = [python, str(script), str(path), str(renders), json.dumps(PICKED), json.dumps([width, height])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("REPORT "))[7:])
    assert report["type"] == "MULTILAYER"
    # Blender's names for our channels: R G B A -> Combined (+ Alpha), Z -> Depth, N.*, P.*, albedo.*, Cryptomatte
    assert set(report["passes"]) == {"Combined", "Alpha", "Depth", "N", "P", "albedo", "CryptoBodyPart00"}
    assert report["layer"] == "CryptoBodyPart"  # found from the header's cryptomatte/<key>/name
    labels = results["seg"].labels
    for part in PICKED:
        matte = read_rgba(renders / f"{part}.exr")[..., 0]
        assert np.array_equal(matte, (labels == NAMES.index(part)).astype(np.float32)), part
    depth = read_rgba(renders / "depth.exr")[..., 0]
    np.testing.assert_array_equal(depth, results["pointmap"].depth)
    normal = read_rgba(renders / "normal.exr")[..., :3]
    np.testing.assert_allclose(normal, results["normal"].normals, atol=1e-3)  # stored as half
