"""The model flags every command shares (``cli.predict.add_model_flags``) and the first offline run: every model and
detector file a command lacks is named at once, one error line each with its remedy (``--model TASK=PATH``,
``--detector PATH`` or ``--detector none``), before any input is read or any model loaded.

Each command runs through the real entry point (``python -m sapiens2``) with ``HF_HUB_OFFLINE=1`` and an empty
Hugging Face cache, so the released files are neither here nor downloadable.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import cv2
import numpy as np
import pytest
from conftest import DATA

from sapiens2.cli import build_parser, main

PHOTO = DATA / "astronaut.png"
DETECTOR_LINE = ["rtmdet_m.pth", "--detector /path/to/rtmdet_m.pth", "--detector none"]


def offline_env(tmp_path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty_hf_home"), "OMP_NUM_THREADS": "1"}


def sapiens2(tmp_path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sapiens2", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, env=offline_env(tmp_path), cwd=tmp_path)  # fmt: skip


def error_lines(command: str, err: str) -> list[str]:
    """The run's error lines; every line of stderr is one of the command's own (error, warning or note)."""
    lines = err.strip().splitlines()
    for line in lines:
        assert re.match(rf"sapiens2 {command}: (error|warning|note): \S", line), err
    return [line for line in lines if line.startswith(f"sapiens2 {command}: error: ")]


def assert_names_each_file(lines: list[str], wanted: dict[str, list[str]]) -> None:
    """One line per wanted file, in order, holding its name and its remedy."""
    assert len(lines) == len(wanted), "\n".join(lines)
    for line, (name, words) in zip(lines, wanted.items(), strict=True):
        assert name in line and all(word in line for word in words), (name, line)


def model_line(task: str, size: str = "1b") -> tuple[str, list[str]]:
    name = f"sapiens2_{size}_{task}.safetensors"
    return name, ["HF_HUB_OFFLINE", f"--model {task}=/path/to/{name}"]


def test_predict_names_every_missing_file_in_the_first_run(tmp_path):
    done = sapiens2(tmp_path, "predict", "--task", "pose,seg", "--sample", "-o", tmp_path / "out")
    assert done.returncode == 2, done.stderr
    assert_names_each_file(error_lines("predict", done.stderr),
                           dict([model_line("pose"), model_line("seg"), ("rtmdet_m.pth", DETECTOR_LINE)]))  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_a_local_file_removes_its_line_and_none_the_detectors(tiny_checkpoints, tmp_path):
    done = sapiens2(tmp_path, "predict", "--task", "pose,seg", "--sample", "-o", tmp_path / "out",
                    "--model", f"pose={tiny_checkpoints['pose']}", "--detector", "none")  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert_names_each_file(error_lines("predict", done.stderr), dict([model_line("seg")]))


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (
            ["mocap", PHOTO, "-o", "out"],
            [model_line("pose"), model_line("pointmap"), model_line("seg"), ("rtmdet_m.pth", DETECTOR_LINE)],
        ),  # fmt: skip
        (["mocap", PHOTO, "-o", "out", "--no-seg", "--detector", "none"], [model_line("pose"), model_line("pointmap")]),
        # albedo has no released 1b file: named too, with the option to give one
        (
            ["relight", "--sample", "--env", "neon", "-o", "out"],
            [
                model_line("normal"),
                ("albedo", ["--model albedo=1b", "No released 'albedo'", "--model albedo=/path/to/"]),
                model_line("matting"),
            ],
        ),  # fmt: skip
        (
            ["eval", "--task", "seg", "--data", "DEMO", "--compare", "0.4b", "1b"],
            [model_line("seg", "0.4b"), model_line("seg")],
        ),  # fmt: skip
        (
            ["eval", "--task", "pose", "--data", "DEMO_POSE", "--boxes", "detector"],
            [model_line("pose"), ("rtmdet_m.pth", DETECTOR_LINE)],
        ),  # fmt: skip
    ],
    ids=["mocap", "mocap-no-seg", "relight", "eval-compare", "eval-pose-detector"],
)
def test_every_command_names_every_missing_file_at_once(argv, wanted, tmp_path):
    from sapiens2.train.demo_data import make_demo_dataset

    data = {"DEMO": lambda: make_demo_dataset("seg", tmp_path / "seg", 2),
            "DEMO_POSE": lambda: make_demo_dataset("pose", tmp_path / "pose", 2)}  # fmt: skip
    argv = [data[a]() if a in data else a for a in argv]
    done = sapiens2(tmp_path, *argv)
    assert done.returncode == 2, done.stderr
    assert_names_each_file(error_lines(argv[0], done.stderr), dict(wanted))
    assert not (tmp_path / "out").exists()


def test_serve_names_every_missing_file_before_ray_starts(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = sapiens2(tmp_path, "serve", "--task", "pose,seg", "--port", port)
    assert done.returncode == 2, done.stderr
    assert_names_each_file(error_lines("serve", done.stderr),
                           dict([model_line("pose"), model_line("seg"), ("rtmdet_m.pth", DETECTOR_LINE)]))  # fmt: skip
    assert "Ray" not in done.stderr + done.stdout


def test_demo_warns_of_every_missing_file_and_still_starts(tmp_path):
    pytest.importorskip("gradio")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "sapiens2", "demo", "--task", "seg,normal", "--port", str(port)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                               env=offline_env(tmp_path), cwd=tmp_path)  # fmt: skip
    lines = []
    try:
        for line in process.stderr:  # up to the line that says the page starts anyway
            lines.append(line.rstrip("\n"))
            if "the page starts" in line or len(lines) > 20:
                break
    finally:
        process.terminate()
        process.wait(timeout=60)
    warnings = [line for line in lines if line.startswith("sapiens2 demo: warning: ")]
    assert_names_each_file(warnings[:-1], dict([model_line("seg"), model_line("normal")]))
    assert "the page starts" in warnings[-1]


# --------------------------------------------------------------------------------------- the same flags everywhere

# The offline line the README gives, with every other shared model flag: every command that loads models takes it.
SHARED_FLAGS = ["--model", "pose=p.safetensors", "--model", "seg=s.safetensors", "--detector", "none", "--device",
                "cpu", "--dtype", "fp32", "--batch-size", "2", "--input-size", "64", "48", "--mode", "reference",
                "--threads", "1", "--no-flip-test"]  # fmt: skip
COMMANDS = {
    "predict": (["--task", "seg", "x.jpg", "-o", "out"], "the --task tasks"),
    "mocap": (["x.mp4", "-o", "out"], "pose, pointmap, seg"),
    "relight": (
        ["x.jpg", "--env", "neon", "-o", "out"],
        "normal, albedo (no weights are released: --model albedo=PATH), and matting or seg",
    ),
    "serve": (["--task", "seg"], "the --task tasks"),
    "demo": ([], "each task on first use"),
    "eval": (["--task", "seg", "--data", "d"], "the --task model"),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_model_command_takes_the_same_model_flags_and_lists_what_it_loads(command, capsys):
    argv, loads = COMMANDS[command]
    args = build_parser().parse_args([command, *argv, *SHARED_FLAGS])
    assert (args.model, args.detector, args.no_flip_test, args.threads) == (
        ["pose=p.safetensors", "seg=s.safetensors"], "none", True, 1
    )  # fmt: skip
    with pytest.raises(SystemExit):
        main([command, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"model (loads {loads}" in help_text and "--model TASK=PATH, and --detector PATH or none" in help_text
    for flag in ("--model [TASK=]SOURCE", "--detector DETECTOR", "--no-flip-test", "--threads N", "--quantize"):
        assert flag in help_text, (command, flag)


def test_a_flag_a_command_does_not_need_is_a_note_not_an_error(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["predict", "--task", "seg", str(PHOTO), "-o", str(out), "--device", "cpu", "--input-size", "64", "48",
            "--model", f"seg={tiny_checkpoints['seg']}", "--model", "pose=unused.safetensors", "--detector", "none",
            "--no-flip-test"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if line.startswith("sapiens2 predict: note: ")]
    assert len(notes) == 3 and all("is ignored" in note and "(it loads seg)" in note or "loads seg" in note
                                   for note in notes), err  # fmt: skip
    assert "--model pose=unused.safetensors is ignored" in notes[0] and "--detector none" in notes[1], notes
    assert (out / "astronaut_seg.png").exists()


# ------------------------------------------------------------------------------------- relight: the seg matte


def test_relight_takes_detector_and_uses_segs_foreground_when_no_matting_model_is_given(tiny_checkpoints, tmp_path,
                                                                                       capsys):  # fmt: skip
    """The README's offline line passes --detector: relight takes it (a note: it runs no pose model). Given a seg model
    and no matting model, the matte is seg's foreground (a note says so), exactly what --matte seg writes."""
    flags = [f"--model=normal={tiny_checkpoints['normal']}", f"--model=albedo={tiny_checkpoints['albedo']}",
             f"--model=seg={tiny_checkpoints['seg']}", "--device", "cpu", "--input-size", "64", "48",
             "--light", "dir:az=30,el=20"]  # fmt: skip
    auto, explicit = tmp_path / "auto", tmp_path / "explicit"
    assert main(["relight", str(PHOTO), "-o", str(auto), "--detector", "none", *flags]) == 0
    notes = capsys.readouterr().err.strip().splitlines()
    assert len(notes) == 2 and "the matte is the seg model's foreground" in notes[0], notes
    assert notes[1].startswith("sapiens2 relight: note: --detector none is ignored: it runs no pose model"), notes
    assert main(["relight", str(PHOTO), "-o", str(explicit), "--matte", "seg", *flags]) == 0
    assert capsys.readouterr().err == ""
    relit = cv2.imread(str(auto / "astronaut_relit.png"))
    assert np.array_equal(relit, cv2.imread(str(explicit / "astronaut_relit.png")))
    # The matting model is asked for explicitly: offline, with none given, its line says how to give one.
    done = sapiens2(tmp_path, "relight", PHOTO, "-o", tmp_path / "matting", "--matte", "matting", *flags)
    assert done.returncode == 2, done.stderr
    assert_names_each_file(error_lines("relight", done.stderr), dict([model_line("matting")]))


def test_eval_takes_its_tasks_model_from_model_task_equals_source():
    from sapiens2.cli.eval import options_from_args

    args = build_parser().parse_args(["eval", "--task", "seg", "--data", "d", "--model", "0.4b", *SHARED_FLAGS])
    options = options_from_args(args)
    assert (options.model, options.detector, options.flip_test, options.threads) == ("s.safetensors", "none", False, 1)
    args = build_parser().parse_args(["eval", "--task", "normal", "--data", "d", "--model", "0.4b", *SHARED_FLAGS])
    assert options_from_args(args).model == "0.4b"  # no normal=...: the plain source
