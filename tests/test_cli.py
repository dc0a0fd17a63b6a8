"""The ``sapiens2`` console script through its real entry point."""

from __future__ import annotations

import shutil
import subprocess
import sys

from sapiens2.cli import main
from sapiens2.models.zoo import ARCHS


def test_info_lists_every_arch_with_params_flops_repos_and_tasks(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for arch in ARCHS.values():
        line = next(line for line in out.splitlines() if line.startswith(arch.name + " "))
        assert f"{arch.num_parameters():,}" in line
        assert arch.repo_id() in line
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
