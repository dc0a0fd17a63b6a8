"""Shared test helpers: where the fixtures live, and the CI rule for missing ones.

Fixtures are read from ``../shared`` (or ``$SAPIENS2_SHARED``). Outside CI a missing fixture skips with a
reason; under ``CI=true`` it is a failure, never a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

try:  # before anything loads faiss: both are SWIG bindings, and the first loaded owns the shared std::vector<string>
    import ezc3d  # noqa: F401  (type; ezc3d's C3D string parameters fail after faiss: sapiens2.mocap.c3d says so)
except ImportError:
    pass


def _own_temporary_folders() -> Path:
    """Give this test run temporary folders of its own, so that two runs at once (two checkouts, a helper's suite
    beside CI) never share one: Gradio's ``/tmp/gradio`` (a run removing its files there made the other's uploads
    answer 403), Ray's ``/tmp/ray`` (its sessions and ``session_latest``), and whatever the processes the tests
    start put under ``$TMPDIR``. Set here, before any test module imports Gradio (which reads
    ``GRADIO_TEMP_DIR`` at import) or starts Ray or a subprocess, which inherit the variables. This process's own
    ``tempfile`` keeps the folder it had (pytest's ``tmp_path`` folders stay where pytest keeps them); removed when
    the run ends (``pytest_unconfigure``). A process the tests start that imports this module again (a driver
    script importing a test module) keeps its run's folders: None then (nesting a folder per import made the paths
    of Ray's sockets too long for Unix sockets, and nobody removed them)."""
    if os.environ.get("SAPIENS2_TESTS_TEMPORARY"):
        return None
    tempfile.gettempdir()  # computed (and cached) from the old TMPDIR before it changes
    root = Path(tempfile.mkdtemp(prefix="sapiens2-tests-"))
    for variable, name in (("GRADIO_TEMP_DIR", "gradio"), ("RAY_TMPDIR", "ray"), ("TMPDIR", "tmp")):
        (root / name).mkdir()
        os.environ[variable] = str(root / name)
    os.environ["SAPIENS2_TESTS_TEMPORARY"] = str(root)
    return root


RUN_TEMPORARY = _own_temporary_folders()


def pytest_unconfigure(config):
    if RUN_TEMPORARY is not None:
        shutil.rmtree(RUN_TEMPORARY, ignore_errors=True)


REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SAPIENS2_SHARED", REPO.parent / "shared"))
PARITY = SHARED / "fixtures" / "parity"
KEYS = SHARED / "fixtures" / "keys"
DATA = Path(__file__).resolve().parent / "data"


def require(path: Path, missing: str | None = None) -> Path:
    """Return ``path`` if it exists; otherwise skip (locally) or fail (under CI=true) with ``missing`` (default: a
    shared fixture is missing, set SAPIENS2_SHARED)."""
    if not path.exists():
        message = missing or f"fixture missing: {path} (set SAPIENS2_SHARED to the shared/ folder)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def require_module(name: str, minversion: str | None = None):
    """Import an optional test dependency (a dev extra); like ``require``: skip locally, fail under CI=true."""
    if os.environ.get("CI", "").lower() != "true":
        return pytest.importorskip(name, minversion=minversion)
    import importlib

    module = importlib.import_module(name)
    if minversion is not None:
        from packaging.version import Version

        assert Version(module.__version__) >= Version(minversion), f"{name} {module.__version__} < {minversion}"
    return module


def load_case(name: str) -> tuple[dict, Path]:
    """Read ``parity/<name>/case.json``; returns (case dict, case folder)."""
    folder = require(PARITY / name)
    return json.loads((folder / "case.json").read_text()), folder


def assert_rel_close(got: torch.Tensor, expected: torch.Tensor, max_rel: float, rms_rel: float, name: str = "") -> None:
    """The fixtures' tensor rule: max|d| <= max_rel*max|e| and rms(d) <= rms_rel*rms(e)."""
    assert got.shape == expected.shape, f"{name}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
    got = got.detach().double()
    expected = expected.detach().double()
    diff = got - expected
    max_abs = diff.abs().max().item()
    scale = expected.abs().max().item()
    rms = diff.pow(2).mean().sqrt().item()
    rms_scale = expected.pow(2).mean().sqrt().item()
    assert max_abs <= max_rel * scale, f"{name}: max|diff| {max_abs:.3e} > {max_rel:.1e} * {scale:.3e}"
    assert rms <= rms_rel * rms_scale, f"{name}: rms(diff) {rms:.3e} > {rms_rel:.1e} * {rms_scale:.3e}"


def pytest_terminal_summary(terminalreporter):
    """How the fixture comparisons went on this CPU (tests/parity.py): bit-exact to a stored platform or widened."""
    from parity import OUTCOMES

    if OUTCOMES:
        counts = ", ".join(f"{outcome} {count}" for outcome, count in sorted(OUTCOMES.items()))
        capability = torch.backends.cpu.get_cpu_capability()
        terminalreporter.write_line(f"parity against official outputs (CPU capability {capability}): {counts}")


@pytest.fixture(autouse=True)
def _deterministic_threads():
    """One thread for bitwise-equality checks (the fixtures were made with one thread)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# Tiny task models written as official-layout checkpoints, for CLI and Predictor tests (random weights).
TINY_ARCH = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}
TINY_UPSAMPLE = {"upsample_channels": (16, 8, 8, 8), "conv_out_channels": (8,), "conv_kernel_sizes": (3,)}
TINY_HEADS = {
    "pose": {"deconv_out_channels": (16, 16), "deconv_kernel_sizes": (4, 4), "conv_out_channels": (16,),
             "conv_kernel_sizes": (1,)},
    "seg": {"deconv_out_channels": (16, 8, 8, 8), "deconv_kernel_sizes": (4, 4, 4, 4), "conv_out_channels": (8,),
            "conv_kernel_sizes": (1,)},
    "normal": TINY_UPSAMPLE,
    "albedo": TINY_UPSAMPLE,
    "matting": TINY_UPSAMPLE,
    "pointmap": TINY_UPSAMPLE | {"scale_conv_out_channels": (16, 8, 4), "scale_final_layer": (16, 8, 1)},
}  # fmt: skip
TINY_INPUT = {"pointmap": (256, 192)}  # the scale MLP needs a grid that survives three stride-2 convolutions


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """task -> path of a tiny random checkpoint (official key layout) for every task."""
    from safetensors.torch import save_file

    from sapiens2 import build_model

    folder = tmp_path_factory.mktemp("tiny_models")
    paths = {}
    for task, head in TINY_HEADS.items():
        torch.manual_seed(0)
        model = build_model(task, TINY_ARCH, input_size=TINY_INPUT.get(task, (64, 48)), **head)
        paths[task] = folder / f"tiny_{task}.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(paths[task]))
    return paths


def zeros_png(width: int, height: int, channels: int = 1) -> bytes:
    """A valid 8-bit PNG of ``width`` x ``height`` black pixels (grey or RGB), built without holding its pixels: a
    "pixel bomb" (32768x32000 RGB is 3 MB). The zlib stream repeats one raw-deflate segment of 4 MiB of zeros
    (each ends in a full flush, so the copies are independent); the Adler-32 of n zero bytes is (n mod 65521)<<16|1.
    """
    import struct
    import zlib

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    def segment(size: int, mode: int) -> bytes:
        compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
        return compressor.compress(bytes(size)) + compressor.flush(mode)

    length = height * (1 + width * channels)  # a filter byte (0) per row, then the row
    full, rest = divmod(length, 1 << 22)
    stream = segment(1 << 22, zlib.Z_FULL_FLUSH) * full + segment(rest, zlib.Z_FINISH)
    idat = b"\x78\xda" + stream + struct.pack(">I", ((length % 65521) << 16) | 1)
    header = struct.pack(">IIBBBBB", width, height, 8, {1: 0, 3: 2}[channels], 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def blender_python() -> str:
    """The Python that has Blender's ``bpy`` (a venv of its own: bpy pins numpy<2, which our stack cannot use):
    ``$SAPIENS2_BPY_PYTHON``, else ``.venv-bpy/bin/python`` (made by ``.ci/run``). Skips locally, fails under CI."""
    candidate = os.environ.get("SAPIENS2_BPY_PYTHON") or str(REPO / ".venv-bpy" / "bin" / "python")
    require(Path(candidate), f"Blender's bpy is missing: {candidate} (python3 -m venv .venv-bpy && "
            ".venv-bpy/bin/pip install bpy==5.0.1, or set SAPIENS2_BPY_PYTHON)")  # fmt: skip
    return candidate


def label_studio_python() -> str:
    """The Python that has ``label-studio-sdk`` (a venv of its own: the SDK pins numpy and OpenCV below ours):
    ``$SAPIENS2_LABEL_STUDIO_PYTHON``, else ``.venv-labelstudio/bin/python`` (made by ``.ci/run``). Skips locally,
    fails under CI."""
    candidate = os.environ.get("SAPIENS2_LABEL_STUDIO_PYTHON") or str(REPO / ".venv-labelstudio" / "bin" / "python")
    require(Path(candidate), f"label-studio-sdk is missing: {candidate} (python3 -m venv .venv-labelstudio && .venv-"
            "labelstudio/bin/pip install label-studio-sdk==2.1.2, or set SAPIENS2_LABEL_STUDIO_PYTHON)")  # fmt: skip
    return candidate


def litert_python() -> str:
    """The Python that has litert-torch, for LiteRT conversion (a venv of its own: litert-torch pins pydantic and
    anyio below what the demo and serving extras need, and brings JAX): ``$SAPIENS2_LITERT_PYTHON``, else
    ``.venv-litert/bin/python`` (made by ``.ci/run``). Skips locally, fails under CI."""
    candidate = os.environ.get("SAPIENS2_LITERT_PYTHON") or str(REPO / ".venv-litert" / "bin" / "python")
    require(Path(candidate), f"litert-torch's Python is missing: {candidate} (python3 -m venv .venv-litert && "
            ".venv-litert/bin/pip install torch==2.13.0 -e '.[litert]', or set SAPIENS2_LITERT_PYTHON)")  # fmt: skip
    return candidate


def run_blender(script: str, *args: str, folder: Path) -> dict:
    """Run ``script`` (Python for Blender's ``bpy``) with ``args`` and the path of a JSON file it must write (its
    last argument), in ``folder``; returns what it wrote. A failed run fails with Blender's last output."""
    import subprocess

    (folder / "blender_script.py").write_text(script)
    output = folder / "blender_output.json"
    done = subprocess.run([blender_python(), str(folder / "blender_script.py"), *map(str, args), str(output)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(output.read_text())


def gltf_validator() -> Path:
    """The Khronos glTF validator's npm package (``.ci-node/node_modules/gltf-validator``, made by ``.ci/run``; or
    ``$SAPIENS2_GLTF_VALIDATOR``), run through ``node``. Skips locally, fails under CI."""
    folder = Path(os.environ.get("SAPIENS2_GLTF_VALIDATOR") or REPO / ".ci-node" / "node_modules" / "gltf-validator")
    return require(folder, f"the Khronos glTF validator is missing: {folder} (npm install --prefix .ci-node "
                   "gltf-validator, or set SAPIENS2_GLTF_VALIDATOR)")  # fmt: skip


def khronos_issues(path: Path, folder: Path) -> dict:
    """The ``issues`` of the Khronos glTF validator's report on ``path`` (its script written into ``folder``)."""
    script = folder / "validate.js"
    script.write_text(
        "const fs = require('fs'); const validator = require(process.argv[2]);\n"
        "validator.validateBytes(new Uint8Array(fs.readFileSync(process.argv[3])), {maxIssues: 1000})\n"
        "  .then((report) => console.log(JSON.stringify(report)))\n"
        "  .catch((error) => { console.error(error); process.exit(2); });\n"
    )
    done = subprocess.run(["node", str(script), str(gltf_validator()), str(path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["issues"]


def assimp_command() -> str:
    """The Open Asset Import Library's command-line tool (Debian ``assimp-utils``, installed by ``.ci/run``; or
    ``$SAPIENS2_ASSIMP``). Skips locally, fails under CI."""
    found = os.environ.get("SAPIENS2_ASSIMP") or shutil.which("assimp") or "/usr/bin/assimp"
    require(Path(found), f"assimp is missing: {found} (apt-get install assimp-utils, or set SAPIENS2_ASSIMP)")
    return found
