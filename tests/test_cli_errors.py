"""One error language for every command: ``sapiens2 COMMAND: error: PROBLEM; REMEDY`` on stderr, one line, no
traceback; exit status 2 for a usage error (nothing was run), 1 for a run whose items failed.

Every command is run through the real entry point with a bad path, a bad flag value and a misspelt flag. None of
them may load a model first: the bad path is found before anything heavy (these tests run offline with the default
models, which are not on disk: each model file the run lacks is one more error line, named before the inputs are
read; the cases that read an input give local model files, w.safetensors, never read).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import zeros_png

from sapiens2.cli import main

# command -> case -> (argv, exit status, words the error line must hold). "missing*" paths do not exist; cfg.yaml
# is a config file that does, w.safetensors a weight file and photos/ a folder of one image (written by the
# fixture, never read), x.jpg an input that is never reached.
CASES = {
    "info": {
        "path": (["missing.txt"], 2, ["unrecognized arguments: missing.txt"]),  # info takes no path
        "flag": (["--verbos"], 2, ["--verbos"]),
    },
    "predict": {
        "path": (["--task", "seg", "missing.jpg", "-o", "out"], 1, ["'missing.jpg' does not exist"]),
        "value": (["--task", "seg", "x.jpg", "-o", "out", "--batch-size", "0"], 2, ["--batch-size", ">= 1"]),
        "flag": (["--task", "seg", "x.jpg", "-o", "out", "--batch-sise", "2"], 2, ["did you mean --batch-size?"]),
    },
    "train": {
        "path": (["missing.yaml"], 2, ["missing.yaml", "not found"]),
        "value": (["cfg.yaml", "--set", "steps"], 2, ["'steps' has no '='", "optimizer.lr=1e-4"]),
        "flag": (["cfg.yaml", "--sett", "steps=2"], 2, ["did you mean --set?"]),
    },
    "pretrain": {
        "path": (["missing.yaml"], 2, ["missing.yaml", "not found"]),
        "value": (["cfg.yaml", "--set", "steps"], 2, ["'steps' has no '='"]),
        "flag": (["cfg.yaml", "--resmue"], 2, ["did you mean --resume?"]),
    },
    "eval": {
        "path": (
            ["--task", "seg", "--data", "missing", "--model", "w.safetensors"],
            2,
            ["'missing'", "neither a folder nor a manifest"],
        ),
        "value": (["--task", "seg", "--data", ".", "--batch-size", "0"], 2, ["--batch-size must be >= 1"]),
        "flag": (["--task", "seg", "--data", ".", "--batch-sise", "2"], 2, ["did you mean --batch-size?"]),
    },
    "export": {
        "path": (["missing.safetensors", "-o", "x.onnx"], 2, ["'missing.safetensors' not found"]),
        "value": (["missing.safetensors", "-o", "x.onnx", "--format", "aoti"], 2, ["--format is aoti", "x.pt2"]),
        "flag": (["missing.safetensors", "-o", "x.onnx", "--fromat", "onnx"], 2, ["did you mean --format?"]),
    },
    "benchmark": {
        "path": (["--model", "missing.safetensors"], 2, ["'missing.safetensors' not found"]),
        "value": (["--model", "0.1b", "--batch-size", "0"], 2, ["--batch-size 0: must be >= 1"]),
        "flag": (["--model", "0.1b", "--batch-sise", "2"], 2, ["did you mean --batch-size?"]),
    },
    "curate": {
        "path": (["missing.yaml"], 2, ["missing.yaml", "not found"]),
        "value": (["cfg.yaml", "--engine", "spark"], 2, ["--engine: invalid choice: 'spark'"]),
        "flag": (["cfg.yaml", "--enigne", "local"], 2, ["did you mean --engine?"]),
    },
    "demo": {
        "path": (["--model", "seg=missing.safetensors"], 2, ["--model seg=missing.safetensors", "not found"]),
        "value": (["--port", "70000"], 2, ["--port 70000", "1 to 65535"]),
        "flag": (["--prot", "8000"], 2, ["did you mean --port?"]),
    },
    "relight": {
        "path": (
            ["missing.jpg", "--env", "studio", "-o", "out", "--model", "w.safetensors"],
            1,
            ["'missing.jpg' does not exist"],
        ),
        "value": (["x.jpg", "--env", "studio", "-o", "out", "--exposure", "nan"], 2, ["--exposure", "'nan'"]),
        "flag": (["x.jpg", "--env", "studio", "-o", "out", "--exposre", "1"], 2, ["did you mean --exposure?"]),
    },
    "mocap": {
        "path": (
            ["missing.mp4", "-o", "out", "--model", "w.safetensors", "--detector", "none"],
            1,
            ["missing.mp4", "no such file"],
        ),
        "value": (["missing.mp4", "-o", "out", "--stride", "0"], 2, ["--stride must be >= 1"]),
        "flag": (["missing.mp4", "-o", "out", "--strdie", "2"], 2, ["did you mean --stride?"]),
    },
    "biomech": {
        "path": (["missing_mocap", "-o", "out"], 1, ["missing_mocap", "no such file"]),
        "value": (["clip_mocap", "-o", "out", "--mass", "0"], 2, ["--mass must be > 0"]),
        "flag": (["clip_mocap", "-o", "out", "--mss", "70"], 2, ["did you mean --mass?"]),
    },
    "distill": {
        "path": (["photos", "-o", "out", "--task", "seg", "--teacher", "missing.safetensors", "--student", "student_5m",
                  "--steps", "1000"], 2, ["'missing.safetensors' not found"]),
        "value": (["photos", "-o", "out", "--task", "seg", "--teacher", "w.safetensors", "--student", "student_5m",
                   "--steps", "1000", "--holdout", "half"], 2, ["--holdout", "'half'"]),
        "flag": (["photos", "-o", "out", "--stpes", "1000"], 2, ["did you mean --steps?"]),
    },
    "labels": {
        "path": (["import", "missing.xml", "-o", "out"], 1, ["missing.xml: no such file or folder"]),
        "value": (["import", "cfg.yaml", "-o", "out"], 1, ["cfg.yaml: not valid JSON"]),
        "flag": (["import", "missing.xml", "-o", "out", "--skeletn", "a"], 2, ["did you mean --skeleton?"]),
    },
    "serve": {
        "path": (["--task", "seg", "--model", "seg=missing.safetensors"], 2, ["'missing.safetensors' not found"]),
        "value": (["--task", "seg", "--max-queue", "0"], 2, ["--max-queue 0", ">= 1"]),
        "flag": (["--task", "seg", "--max-queeu", "3"], 2, ["did you mean --max-queue?"]),
    },
}


def problem_lines(command: str, err: str) -> list[str]:
    """stderr without argparse's usage block, each remaining line checked against the one form (an error or a
    warning of ``command``)."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    if lines and lines[0].startswith(f"usage: sapiens2 {command}"):
        lines = lines[1:]
        while lines and lines[0].startswith(" "):  # the usage's continuation lines
            lines = lines[1:]
    for line in lines:
        assert re.match(rf"sapiens2 {command}: (error|warning|note): \S", line), (command, err)
    return lines


def check_error(command: str, err: str, words: list[str]) -> None:
    """One error line, in the form, holding ``words``."""
    errors = [line for line in problem_lines(command, err) if line.startswith(f"sapiens2 {command}: error: ")]
    assert len(errors) == 1, (command, err)
    assert all(word in errors[0] for word in words), (command, words, errors[0])


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh folder as the working directory, with a config file (cfg.yaml), a weight file (w.safetensors), a
    folder of one image (photos/) and nothing else."""
    (tmp_path / "cfg.yaml").write_text("steps: 1\n")
    (tmp_path / "w.safetensors").write_bytes(b"")
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.png").write_bytes(zeros_png(8, 8))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_command_is_covered():
    import argparse

    from sapiens2.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(CASES) == set(commands)


@pytest.mark.parametrize(("command", "case"), [(c, k) for c, cases in CASES.items() for k in cases])
def test_a_bad_path_value_or_flag_is_one_line_in_the_one_form_with_its_exit_status(command, case, workdir, capsys):
    argv, status, words = CASES[command][case]
    try:
        code = main([command, *argv])
    except SystemExit as exit_info:  # argparse's own errors
        code = exit_info.code
    out, err = capsys.readouterr()
    assert code == status, (command, case, err)
    check_error(command, err, words)
    assert not (workdir / "out").exists()  # nothing written for a run that could not start


def _sapiens2(cwd, *argv: str) -> subprocess.CompletedProcess:
    """``python -m sapiens2 ARGV``: the console script's path (its own process, logging configured by ``main``)."""
    return subprocess.run([sys.executable, "-m", "sapiens2", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_the_console_entry_prints_the_same_form(workdir):
    """A failed item exits 1 with its one line; a demo given a missing model file refuses it before serving (it
    used to start the server and fail on the first request)."""
    for command, case in (("mocap", "path"), ("demo", "path")):
        argv, status, words = CASES[command][case]
        done = _sapiens2(workdir, command, *argv)
        assert done.returncode == status, done.stderr
        check_error(command, done.stderr, words)


def test_a_logging_warning_reads_as_the_commands_warning(workdir):
    """The log's warnings (here: two inputs that want the same output name) take the form too, beside the error."""
    import cv2
    import numpy as np

    for name in ("a.jpg", "a.png"):
        cv2.imwrite(name, np.zeros((8, 8, 3), np.uint8))
    done = _sapiens2(workdir, "predict", "--task", "seg", "a.jpg", "a.png", "--model", "seg=missing.safetensors",
                     "-o", "out")  # fmt: skip
    assert done.returncode == 2, done.stderr
    warning = "sapiens2 predict: warning: output name 'a' is used by an earlier input"
    assert any(line.startswith(warning) for line in problem_lines("predict", done.stderr)), done.stderr
    check_error("predict", done.stderr, ["'missing.safetensors' not found"])
