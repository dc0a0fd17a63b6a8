"""The ``sapiens2`` console script through its real entry point."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sapiens2.cli import main
from sapiens2.models.zoo import ARCHS


def test_info_lists_every_arch_with_params_flops_repos_and_tasks(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for arch in ARCHS.values():
        line = next(line for line in out.splitlines() if line.startswith(arch.name + " "))
        assert f"{arch.num_parameters():,}" in line
        assert (arch.repo_id() if arch.released else "student arch") in line
    assert "1,455,474,176" in out and "11.296T" in out and "pose, seg, normal, pointmap, matting" in out


def test_console_script_and_module_entry_point_run():
    exe = shutil.which("sapiens2")
    commands = [[sys.executable, "-m", "sapiens2", "info"]] + ([[exe, "info"]] if exe else [])
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "sapiens2_5b" in result.stdout


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "info" in capsys.readouterr().out


def test_train_flags_parse_into_train_options():
    from sapiens2.cli import build_parser
    from sapiens2.cli.train import train_options_from_args
    from sapiens2.train import TrainOptions

    def parse(*argv: str) -> TrainOptions:
        return train_options_from_args(build_parser().parse_args(["train", "seg.yaml", *argv]))

    assert parse() == TrainOptions("seg.yaml")
    assert parse("--set", "steps=3", "--set", "optimizer.lr=1e-4", "--resume") == TrainOptions(
        "seg.yaml", overrides=["steps=3", "optimizer.lr=1e-4"], resume=True
    )
    assert parse("--resume", "run/checkpoints/step_4.pt").resume == "run/checkpoints/step_4.pt"


# Every command with a misspelt flag (and what it should have been): the command's own usage, a did-you-mean, exit 2.
MISSPELT = {
    "info": (["--verbos"], None),
    "predict": (["--task", "seg", "-o", "out", "x.jpg", "--batchsize", "4"], "--batch-size"),
    "train": (["seg.yaml", "--sett", "steps=2"], "--set"),
    "export": (["1b", "-o", "x.onnx", "--fromat", "onnx"], "--format"),
    "eval": (["--task", "seg", "--data", "d", "--input-sise", "64", "48"], "--input-size"),
    "benchmark": (["--resolutoin", "64x48"], "--input-size"),
    "demo": (["--prot", "8000"], "--port"),
    "pretrain": (["cfg.yaml", "--overide", "x=1"], None),
    "distill": (["photos/", "--task", "seg", "--techer", "1b"], "--teacher"),
    "curate": (["cfg.yaml", "--stirct"], "--strict"),
    "relight": (["x.jpg", "-o", "out", "--env", "neon", "--keep-shadnig"], "--keep-shading"),
    "mocap": (["clip.mp4", "-o", "out", "--detect-evry", "5"], "--detect-every"),
    "biomech": (["clip_mocap", "--stattic", "0", "1"], "--static"),
    "serve": (["--task", "seg", "--max-bacth", "4"], "--max-batch"),
    "labels": (["import", "task.zip", "-o", "out", "--skeletn", "person"], "--skeleton"),
}


def _commands() -> dict:
    import argparse

    from sapiens2.cli import build_parser

    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


def _sapiens2(*argv: str) -> subprocess.Popen:
    exe = shutil.which("sapiens2")
    command = [exe] if exe else [sys.executable, "-m", "sapiens2"]
    return subprocess.Popen([*command, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _check_misspelt(name: str, status: int, out: str, err: str) -> None:
    hint = MISSPELT[name][1]
    assert status == 2, (name, err)
    assert err.startswith(f"usage: sapiens2 {name} "), (name, err)
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"sapiens2 {name}: error: unrecognized arguments: "), (name, last)
    assert (f"did you mean {hint}?" in last) if hint else ("did you mean" not in last), (name, last)
    assert "Traceback" not in err and not out


def test_a_misspelt_flag_prints_the_commands_usage_with_a_did_you_mean_and_exits_2(capsys):
    assert set(MISSPELT) == set(_commands())  # every command
    for name, (argv, _) in MISSPELT.items():
        with pytest.raises(SystemExit) as exit_info:
            main([name, *argv])
        _check_misspelt(name, exit_info.value.code, *capsys.readouterr())


def test_a_misspelt_flag_is_named_before_a_missing_required_one(capsys):
    """argparse reports a missing ``-o`` before an unknown flag; the misspelling is the user's real problem."""
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--task", "pose", "--smaple", "x.jpg"])  # no -o either
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("usage: sapiens2 predict") and "did you mean --sample?" in err and "-o/--output" not in err
    with pytest.raises(SystemExit):  # an abbreviation argparse accepts is not called unknown
        main(["predict", "--task", "pose", "--samp"])
    assert "the following arguments are required: -o/--output" in capsys.readouterr().err


@pytest.mark.slow
def test_a_misspelt_flag_through_the_console_script_of_every_command():
    running = {name: _sapiens2(name, *argv) for name, (argv, _) in MISSPELT.items()}  # in parallel: ~1 import each
    for name, process in running.items():
        out, err = process.communicate(timeout=300)
        _check_misspelt(name, process.returncode, out, err)


BOGUS = "error: --model bogus=x: unknown task 'bogus'; choose one of pose, seg, normal, pointmap, albedo, matting."


def test_exit_status_is_2_for_a_bad_model_flag_in_every_command_that_takes_one(tmp_path, capsys):
    from sapiens2.metadata import SAMPLE_IMAGE

    predict = ["predict", "--task", "seg", str(SAMPLE_IMAGE), "-o", str(tmp_path / "p")]
    for argv in ([*predict, "--model", "bogus=x"], ["demo", "--model", "bogus=x"]):  # predict exited 1
        assert main(argv) == 2, argv
        assert capsys.readouterr().err.strip() == f"sapiens2 {argv[0]}: {BOGUS}"
    missing = str(tmp_path / "missing.safetensors")
    evaluate = ["eval", "--task", "seg", "--data", str(tmp_path)]
    for argv in ([*predict, "--model", missing], [*evaluate, "--model", missing]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "p").exists()


@pytest.mark.slow
def test_exit_status_through_the_console_script(tmp_path):
    from sapiens2.metadata import SAMPLE_IMAGE

    predict = ["predict", "--task", "seg", str(SAMPLE_IMAGE), "-o", str(tmp_path / "p"), "--model", "bogus=x"]
    runs = {"predict": _sapiens2(*predict), "demo": _sapiens2("demo", "--model", "bogus=x")}
    for name, process in runs.items():
        _, err = process.communicate(timeout=300)
        assert process.returncode == 2 and err.strip() == f"sapiens2 {name}: {BOGUS}", (name, err)


def test_benchmark_takes_the_common_spellings_and_the_old_ones_hidden():
    from sapiens2.cli import build_parser
    from sapiens2.cli.benchmark import options_from_args

    def parse(*argv: str):
        return options_from_args(build_parser().parse_args(["benchmark", *argv]))

    new = parse("--batch-size", "3", "--input-size", "64", "48")
    assert new == parse("--batch", "3", "--resolution", "64x48")  # deprecated aliases
    assert (new.batch_size, new.input_size) == (3, (64, 48)) and parse().input_size is None
    help_text = _commands()["benchmark"].format_help()
    assert "--batch-size" in help_text and "--input-size H W" in help_text
    assert "--batch N and --resolution HxW still work" in " ".join(help_text.split())


def test_predict_fps_flag_sets_the_frame_rate_of_a_frames_folder():
    from sapiens2.cli import build_parser

    args = build_parser().parse_args(["predict", "--task", "seg", "--frames", "--fps", "12.5", "f/", "-o", "o"])
    assert args.fps == 12.5
    with pytest.raises(SystemExit):
        build_parser().parse_args(["predict", "--task", "seg", "--fps", "0", "f/", "-o", "o"])


def test_paths_in_every_config_are_relative_to_its_folder_and_outputs_to_the_working_folder(tmp_path, monkeypatch):
    from sapiens2.curate.config import load_curate_config
    from sapiens2.pretrain.config import load_pretrain_config
    from sapiens2.train.config import load_config

    project = tmp_path / "project"
    (project / "data" / "seg").mkdir(parents=True)
    (project / "photos").mkdir()
    (project / "init.safetensors").write_bytes(b"")
    (project / "pretrain.yaml").write_text(
        "output_dir: runs/p\nsteps: 2\nmodel: {arch: sapiens2_0.1b, init: init.safetensors}\n"
        "data: {sources: [photos/, /abs/list.txt, 'https://host/x.tar']}\n"
    )
    (project / "train.yaml").write_text(
        "task: seg\nsteps: 2\nschedule: {warmup_steps: 1}\noutput_dir: runs/t\n"
        "model: {arch: sapiens2_0.1b, init_from: 0.1b}\ndata: {root: data/seg}\n"
    )
    (project / "curate.yaml").write_text("inputs: [photos/]\noutput: curated\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not the config's folder
    pretrain = load_pretrain_config(project / "pretrain.yaml", ["data.batch_size=2"])
    assert pretrain.data.sources == (str(project / "photos/"), "/abs/list.txt", "https://host/x.tar")
    assert pretrain.model.init == str(project / "init.safetensors") and pretrain.output_dir == "runs/p"
    train = load_config(project / "train.yaml")
    assert train.data.root == str(project / "data/seg") and train.model.init_from == "0.1b"  # a size stays a size
    assert train.output_dir == "runs/t"
    assert load_config(project / "train.yaml", ["data.root=mine"]).data.root == "mine"  # typed here: relative here
    curate = load_curate_config(project / "curate.yaml")
    assert curate.inputs == (str(project / "photos/"),) and curate.output == "curated"


def test_config_templates_ship_with_the_package_and_run_by_name_from_any_folder(tmp_path, monkeypatch):
    from sapiens2.pretrain.config import load_pretrain_config
    from sapiens2.yaml_config import TEMPLATES, templates

    assert set(templates()) >= {"pretrain_tiny.yaml", "pretrain_0.4b.yaml", "curate_example.yaml"}
    assert TEMPLATES.parent.name == "sapiens2"  # inside the package (package data), not beside it
    monkeypatch.chdir(tmp_path)
    for name in ("pretrain_tiny.yaml", "pretrain_tiny", "configs/pretrain_tiny.yaml"):  # as the docs write it
        config = load_pretrain_config(name)
        assert all(Path(source).is_file() for source in config.data.sources), config.data.sources
    with pytest.raises(FileNotFoundError, match="pretrain_tiny.yaml"):  # the message lists the templates
        load_pretrain_config("pretrain_tiyn.yaml")
