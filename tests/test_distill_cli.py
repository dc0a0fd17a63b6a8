"""``sapiens2 distill`` as a new user meets it: a short trial run needs no warm-up setting, every problem of the
inputs is named in one run (one line each, in the flags the user typed) before any model loads, a run folder of
another run is refused or resumed with a reason, and Ctrl-C says where the run stopped and how to go on."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from distill_synth import write_images

from sapiens2.cli import main
from sapiens2.distill import load_distill_config
from sapiens2.train.config import save_config
from sapiens2.train.trainer import find_checkpoints

REPO = Path(__file__).resolve().parents[1]
STUDENT = "{embed_dims: 16, num_layers: 2, num_heads: 2, feedforward_channels: 32, num_tokenizer_layers: 0}"
HEAD = "{deconv_out_channels: [8, 8, 8, 8], deconv_kernel_sizes: [4, 4, 4, 4], conv_out_channels: [8], " \
       "conv_kernel_sizes: [1]}"  # fmt: skip
# A tiny seg student on the CPU, without a bar or workers; no warm-up is set.
FAST = ["--set", f"model.arch={STUDENT}", "--set", f"model.head={HEAD}", "--input-size", "64", "48", "--device", "cpu",
        "--set", "data.num_workers=0", "--set", "precision=fp32", "--set", "progress_bar=false"]  # fmt: skip


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return write_images(tmp_path_factory.mktemp("trial") / "photos", 6, seed=5)


def seg_run(images: Path, teacher: Path, out: Path, *extra: str) -> list[str]:
    return ["distill", str(images), "--task", "seg", "--teacher", str(teacher), *FAST, "-o", str(out), *extra]


def error_lines(err: str) -> list[str]:
    lines = err.strip().splitlines()
    assert "Traceback" not in err and all(line.startswith("sapiens2 distill: error: ") for line in lines), err
    return [line.removeprefix("sapiens2 distill: error: ") for line in lines]


def test_a_trial_run_needs_no_warmup_and_a_warmup_too_long_names_the_flags(images, tiny_checkpoints, tmp_path, capsys):
    """--steps 100 alone passes the checks (the warm-up defaults to a tenth of the steps; it was 500, refused): the
    teacher's pass runs. A warm-up set as long as the run is one line in the flags typed; nothing is written."""
    out = tmp_path / "trial"
    assert main(seg_run(images, tiny_checkpoints["seg"], out, "--steps", "100", "--teacher-only")) == 0, (
        capsys.readouterr().err
    )
    assert len(list((out / "teacher").glob("*.teacher.safetensors"))) == 6
    capsys.readouterr()
    # The stored outputs serve the next run; a batch bigger than the images to train on is named by its flag.
    assert main(seg_run(images, tiny_checkpoints["seg"], out, "--steps", "100", "--batch-size", "8")) == 2
    assert error_lines(capsys.readouterr().err) == [
        "5 images to train on (1 of 6 held out), fewer than one batch of --batch-size 8: lower it to 5 or fewer, or "
        "add images"
    ]
    other = tmp_path / "other"
    argv = seg_run(images, tiny_checkpoints["seg"], other, "--steps", "100", "--set", "schedule.warmup_steps=100")
    assert main(argv) == 2
    assert error_lines(capsys.readouterr().err) == [
        "--set schedule.warmup_steps=100 must be smaller than the run's 100 steps (--steps 100): lower it, train "
        "longer, or leave the warm-up out (default: a tenth of the steps, at most 500)"
    ]
    assert not other.exists()


@pytest.mark.slow
def test_a_trial_distillation_warms_up_over_a_tenth_of_its_steps(images, tiny_checkpoints, tmp_path):
    out = tmp_path / "trial"
    assert main(seg_run(images, tiny_checkpoints["seg"], out, "--steps", "10", "--batch-size", "2")) == 0
    rates = [float(line.split(",")[2]) for line in (out / "metrics.csv").read_text().splitlines()[1:]]
    assert rates[:2] == pytest.approx([5e-4 * 1e-3, 5e-4])  # step 1 warms up, step 2 has the full LR
    assert all(later < earlier for earlier, later in zip(rates[1:], rates[2:], strict=False))


def test_every_input_problem_is_named_in_one_run_before_any_model_loads(tmp_path, capsys):
    """A missing and an empty images folder, a missing teacher and student weights, a misspelt student, a bad
    --holdout and a GPU the machine lacks: one line each, all in one run (it used to stop at the first), each naming
    the flag or input; exit 2, nothing written."""
    (tmp_path / "empty").mkdir()
    missing, empty, teacher = tmp_path / "photos", tmp_path / "empty", tmp_path / "sapiens2_1b_seg.safetensors"
    out = tmp_path / "run"
    argv = ["distill", str(missing), str(empty), "--task", "seg", "--teacher", str(teacher), "--student",
            "sapiens2_student_5mm", "--steps", "100", "--holdout", "2", "--devices", "cuda:99",
            "--set", f"model.init_from={tmp_path / 'init.pt'}", "-o", str(out)]  # fmt: skip
    assert main(argv) == 2
    lines = error_lines(capsys.readouterr().err)
    expected = [
        "--student: unknown arch 'sapiens2_student_5mm'; did you mean sapiens2_student_5m",
        "--holdout must lie in (0, 1), got 2.0",
        f"--set model.init_from={tmp_path / 'init.pt'}: Checkpoint '{tmp_path / 'init.pt'}' not found",
        f"--teacher {teacher}: Checkpoint '{teacher}' not found",
        "--devices 'cuda:99': this machine has ",
        f"input '{missing}' does not exist (no such file or folder)",
        f"folder '{empty}' contains no image files (.avif, .bmp",
    ]
    assert len(lines) == len(expected) and all(
        line.startswith(start) for line, start in zip(lines, expected, strict=False)
    ), lines
    assert not out.exists()


def test_a_teacher_that_cannot_work_is_named_with_the_other_problems(tiny_checkpoints, tmp_path, capsys):
    """An unreadable teacher file (it was a safetensors traceback) or a pose teacher for --task seg is one line,
    beside the images' problems, before anything is computed."""
    (tmp_path / "empty").mkdir()
    broken, pose = tmp_path / "teacher.safetensors", tiny_checkpoints["pose"]
    broken.write_bytes(b"")
    cases = [
        (broken, [f"Cannot read checkpoint {broken}: the file is empty (0 bytes)"]),
        (pose, [f"teacher {pose} is a pose model but the student learns seg: a teacher and its student must share "
                "the task (--task pose, or a seg teacher)"]),
    ]  # fmt: skip
    for teacher, expected in cases:
        argv = ["distill", str(tmp_path / "empty"), "--task", "seg", "--teacher", str(teacher), *FAST, "--steps", "9",
                "-o", str(tmp_path / "run")]  # fmt: skip
        assert main(argv) == 2
        lines = error_lines(capsys.readouterr().err)
        assert len(lines) == 2 and lines[0].startswith(expected[0]), lines
        assert lines[1].startswith(f"folder '{tmp_path / 'empty'}' contains no image files"), lines
    assert not (tmp_path / "run").exists()


def test_a_student_given_as_a_file_or_left_out_is_told_where_it_goes(tmp_path, capsys):
    """--student takes an arch: a weight file there is pointed to model.init_from; no --task, --teacher, --student
    or --steps: each is named as a flag, with an example."""
    student = tmp_path / "my_student.safetensors"
    student.write_bytes(b"")
    assert main(["distill", str(tmp_path), "--task", "seg", "--teacher", "x", "--student", str(student),
                 "--steps", "10", "-o", str(tmp_path / "run")]) == 2  # fmt: skip
    lines = error_lines(capsys.readouterr().err)
    assert lines[0].startswith(f"--student: unknown arch '{student}'") and lines[0].endswith(
        f"; weights go in --set model.init_from={student} (the arch is read off them)"
    ), lines
    assert main(["distill", str(tmp_path)]) == 2
    assert error_lines(capsys.readouterr().err)[:4] == [
        "--task is required; choose one of pose, seg, normal, pointmap, albedo, matting",
        "set exactly one of --steps and --set epochs",
        "--student is needed when --set model.init_from is not set (e.g. --student sapiens2_student_5m)",
        "--teacher is required (a size such as 5b, a repo id or a task model file)",
    ]


def test_a_run_folder_of_another_run_is_refused_with_what_to_do(images, tiny_checkpoints, tmp_path, capsys):
    """-o holding a run: without --resume, say so and how to continue (it said 'set another output_dir', a key the
    command has no flag for); with --resume, refuse another teacher or input size (naming both values), or a folder
    with no checkpoint yet (run again without --resume); -o naming a file (it was a traceback). Every refusal comes
    before the teacher runs."""
    teacher, out, other = tiny_checkpoints["seg"], tmp_path / "run", tmp_path / "other_seg.safetensors"
    shutil.copy(teacher, other)  # another file: another teacher, as far as the run can tell
    values = {"task": "seg", "steps": 4, "output_dir": str(out), "data": {"input_size": [64, 48]},
              "model": {"arch": yaml.safe_load(STUDENT), "head": yaml.safe_load(HEAD)},
              "distill": {"teacher": str(teacher), "images": [str(images)]}}  # fmt: skip
    save_config(load_distill_config(None, values=values), tmp_path / "config.yaml")
    (out / "checkpoints").mkdir(parents=True)
    shutil.copy(tmp_path / "config.yaml", out / "config.yaml")
    (out / "checkpoints" / "step_00000002.pt").write_bytes(b"")  # never read: the refusals come first
    cases = [
        ([], [f"-o {out} already holds a run stopped at step 2: continue it with --resume, or choose another -o"]),
        (["--resume", "--teacher", str(other), "--input-size", "32", "32"], [
            f"--teacher {other}: the run in {out} was started with '{teacher}'; resume with the same value, or start "
            "a new run in another -o",
            f"--input-size 32 32: the run in {out} was started with [64, 48]; resume with the same value, or start a "
            "new run in another -o",
        ]),
    ]  # fmt: skip
    for extra, expected in cases:
        assert main(seg_run(images, teacher, out, "--steps", "4", *extra)) == 2
        assert error_lines(capsys.readouterr().err) == expected
    (out / "model.safetensors").write_bytes(b"")
    assert main(seg_run(images, teacher, out, "--steps", "4")) == 2
    assert error_lines(capsys.readouterr().err) == [
        f"-o {out} already holds a finished run (2 steps): continue it with --resume and more --steps, or choose "
        "another -o"
    ]
    assert main(seg_run(images, teacher, out / "config.yaml", "--steps", "4")) == 2
    assert error_lines(capsys.readouterr().err) == [f"-o {out / 'config.yaml'} is a file: the run needs a folder "
                                                    "(made when missing)"]  # fmt: skip
    shutil.rmtree(out / "checkpoints")
    assert main(seg_run(images, teacher, out, "--steps", "4", "--resume")) == 2
    assert error_lines(capsys.readouterr().err) == [
        f"--resume: {out} holds no checkpoint to continue from (the run stopped before its first): run the same "
        "command without --resume (the teacher's outputs stored so far are kept)"
    ]
    assert not (out / "teacher").exists()


@pytest.mark.slow
def test_ctrl_c_says_where_the_run_stopped_and_resume_finishes_it(images, tiny_checkpoints, tmp_path):
    """SIGINT mid-run: exit 130 and one line naming the step and the checkpoint to resume from (it was a
    KeyboardInterrupt traceback, exit 1); the same command with --resume then finishes the run."""
    out = tmp_path / "run"
    argv = seg_run(images, tiny_checkpoints["seg"], out, "--steps", "300", "--batch-size", "2",
                   "--set", "checkpoint_every=3")[1:]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "sapiens2", "distill", *argv]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not find_checkpoints(out) and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err[-3000:]
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    checkpoint = find_checkpoints(out)[-1]
    assert lines[0].startswith("sapiens2 distill: error: interrupted at step ") and lines[0].endswith(
        f"of 300; the newest checkpoint is {checkpoint} (step {int(checkpoint.stem.split('_')[-1])}): run the same "
        "command with --resume to continue from it"
    ), lines[0]
    resumed = subprocess.run([*command, "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {checkpoint}" in resumed.stderr
    assert (out / "model.safetensors").is_file()


@pytest.mark.slow
def test_an_image_that_does_not_decode_is_left_out_online_too(images, tiny_checkpoints, tmp_path, caplog):
    """--online has no teacher's pass to leave a bad image out: it is a warning line where the run meets it and the
    next image stands in (it stopped the run: an error, or a worker's traceback with data.num_workers > 0)."""
    folder = tmp_path / "photos"
    shutil.copytree(images, folder)
    (folder / "zz_broken.jpg").write_bytes(b"not a jpeg")
    argv = seg_run(folder, tiny_checkpoints["seg"], tmp_path / "run", "--steps", "6", "--batch-size", "2", "--online")
    assert main(argv) == 0
    warnings = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert warnings and all(
        line == f"cannot read image '{folder / 'zz_broken.jpg'}': not a decodable image (corrupt, truncated or not "
        "an image format); left out (the next image stands in)"
        for line in warnings
    ), warnings
