"""The examples of README.md and docs/*.md: every Python block stands on its own (its imports, no name from nowhere),
every ``sapiens2 ...`` command line parses, and the runnable blocks run as written (slow: tiny local models stand in
for the downloads through ``sapiens2.checkpoints.download``, the one place that downloads, and
``checkpoints.find_download``, which a run asks first whether each file is cached)."""

from __future__ import annotations

import ast
import builtins
import re
import shlex
from pathlib import Path

import pytest
import torch
from conftest import REPO, SHARED, TINY_ARCH, TINY_HEADS, TINY_UPSAMPLE, require

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# Names an example leaves to the reader on purpose (their own model loader and resize function).
READERS_OWN = {"load_my_model", "resize"}


def blocks(language: str) -> list[tuple[str, str]]:
    """(``file:line``, code) of every fenced block in ``language`` ('' for unlabelled blocks)."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                found.append((f"{path.relative_to(REPO)}:{text[: match.start()].count(chr(10)) + 1}", match.group(2)))
    return found


def python_block(where: str) -> str:
    return next(code for place, code in blocks("python") if place == where)


def undefined_names(code: str) -> set[str]:
    """Names an example reads but never imports, assigns or defines (scopes flattened: enough for examples)."""
    tree = ast.parse(code)
    defined, loaded = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else defined).add(node.id)
    return loaded - defined


def test_every_python_example_stands_on_its_own():
    examples = blocks("python")
    assert len(examples) >= 15
    problems = []
    for where, code in examples:
        try:
            missing = undefined_names(code) - READERS_OWN
        except SyntaxError as error:
            problems.append(f"{where}: {error}")
            continue
        if missing:
            problems.append(f"{where}: {', '.join(sorted(missing))} used without an import or definition")
    assert not problems, "\n".join(problems)


def test_the_checker_finds_a_missing_import():
    assert undefined_names('model = sapiens2.load_model("seg", "1b")') == {"sapiens2"}
    assert undefined_names('import sapiens2\nmodel = sapiens2.load_model("seg", "1b")') == set()


def cli_examples() -> list[tuple[str, list[str]]]:
    """(``file:line: command``, argv after ``sapiens2``) of every ``sapiens2``/``-m sapiens2`` line in a shell block."""
    found = []
    for language in ("bash", "sh", ""):
        for where, code in blocks(language):
            for line in code.replace("\\\n", " ").splitlines():
                if not re.match(r"\s*(sapiens2|python3? -m sapiens2|torchrun) ", line):
                    continue
                words = shlex.split(line, comments=True)
                starts = [i for i, word in enumerate(words) if word == "sapiens2" and (i == 0 or words[i - 1] == "-m")]
                if starts and "..." not in words:  # "..." elides flags on purpose
                    found.append((f"{where}: {line.strip()}", words[starts[0] + 1 :]))
    return found


def test_every_cli_example_parses():
    from sapiens2.cli import build_parser

    examples = cli_examples()
    assert len(examples) >= 30 and {argv[0] for _, argv in examples} >= {"predict", "train", "export", "benchmark"}
    problems = []
    for where, argv in examples:
        parser = build_parser()
        try:
            args, unknown = parser.parse_known_args(argv)
        except SystemExit:
            problems.append(f"{where}: does not parse")
            continue
        if unknown:
            problems.append(f"{where}: unknown {' '.join(unknown)}")
        elif not getattr(args, "func", None) and "--version" not in argv:
            problems.append(f"{where}: no command")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------ run as written


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """Tiny random models in place of every download, in a folder with the examples' photo."""
    import shutil

    from safetensors.torch import save_file

    from sapiens2 import Sapiens2, build_model, checkpoints
    from sapiens2.metadata import SAMPLE_IMAGE

    models = tmp_path / "models"
    models.mkdir()
    torch.manual_seed(0)
    tiny = {
        "seg": build_model("seg", TINY_ARCH, **TINY_HEADS["seg"]),
        "pose": build_model("pose", TINY_ARCH, **TINY_HEADS["pose"]),
        "normal": build_model("normal", TINY_ARCH, **TINY_UPSAMPLE),
        # a pointmap scale MLP for 1024x768, as the released models
        "pointmap": build_model("pointmap", TINY_ARCH, **TINY_UPSAMPLE, scale_conv_out_channels=(16, 8, 4),
                                scale_final_layer=(4 * 8 * 6, 8, 1)),
        "pretrain": Sapiens2(TINY_ARCH),
    }
    for name, model in tiny.items():
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(models / f"{name}.safetensors"))

    def download(repo_id: str, filename: str, *, local_hint: str | None = None) -> Path:
        if filename == "rtmdet_m.pth":  # the person detector: the random RTMDet-m of the fixtures
            return require(SHARED / "fixtures" / "detector" / "rtmdet_m_random_mmengine.pth")
        task = next((name for name in tiny if f"_{name}" in filename), None)
        assert task is not None, f"no stand-in for {repo_id}/{filename}"
        return models / f"{task}.safetensors"

    monkeypatch.setattr(checkpoints, "download", download)
    monkeypatch.setattr(checkpoints, "find_download", download)  # the stand-ins are "in the cache"
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(SAMPLE_IMAGE, work / "photo.jpg")
    monkeypatch.chdir(work)
    return work


@pytest.mark.slow
def test_the_export_section_runs_as_written(stand_ins, capsys):
    """README "Export and deployment": the commands write seg.onnx (checked on photo.jpg), pointmap.pt2, seg.xml
    and seg_int8.xml (OpenVINO), pose.pte (ExecuTorch) and seg.mlpackage (Core ML) at the sizes the models take,
    then the Python block runs them."""
    pytest.importorskip("onnxruntime")
    from sapiens2.cli import main

    commands = [argv for where, argv in cli_examples() if where.startswith("README.md") and argv[0] == "export"]
    # Not here: a training run's export (tests/test_export_cli.py), AOTInductor (it compiles C++ for minutes) and
    # LiteRT (litert-torch lives in a venv of its own: tests/test_export_litert.py runs its export --check there).
    commands = [argv for argv in commands if "aoti" not in argv and not argv[1].startswith("runs/")]
    commands = [argv for argv in commands if not any(word.endswith(".tflite") for word in argv)]
    assert len(commands) == 6
    for argv in commands:
        assert main(argv) == 0, capsys.readouterr().err
    assert "passed" in capsys.readouterr().out
    code = python_block(next(w for w, c in blocks("python") if "seg.onnx" in c and w.startswith("README")))
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["labels"].shape == (512, 512) and namespace["points"].shape[1] == 3


@pytest.mark.slow
def test_the_pretraining_example_runs_from_any_folder(stand_ins):
    """README's pretraining block (the packaged template, its paths relative to it) in an empty working folder."""
    where = next(w for w, c in blocks("python") if "pretrain_tiny" in c and w.startswith("README"))
    namespace: dict = {}
    exec(compile(python_block(where), where, "exec"), namespace)
    assert namespace["summary"]["steps"] == 100 and (stand_ins / "runs" / "pretrain_tiny").is_dir()
    assert namespace["backbone"].arch.embed_dims == 64  # the template's tiny arch, read back from the export
