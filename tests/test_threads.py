"""``--threads`` / ``threads=``: one flag meaning one thing in ``predict``, ``eval``, ``demo`` and ``benchmark``, and
the OpenMP wait policy ``import sapiens2`` sets (``sapiens2.models.threads``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import DATA

from sapiens2 import Predictor
from sapiens2.cli import build_parser, main
from sapiens2.models.threads import set_threads, wait_policy


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _policies_after_import(*cases: tuple[str, str | None]) -> list[str]:
    """OMP_WAIT_POLICY after running ``code`` in a fresh interpreter started with ``value`` (None: unset), per case;
    the interpreters run side by side."""
    runs = []
    for code, value in cases:
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        env |= {} if value is None else {"OMP_WAIT_POLICY": value}
        script = code + "; import os; print(os.environ.get('OMP_WAIT_POLICY'))"
        runs.append(subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True))
    return [run.communicate(timeout=300)[0].strip().splitlines()[-1] for run in runs]


def test_import_sets_a_passive_wait_only_where_it_can_take_effect():
    unset, users, torch_first = _policies_after_import(
        ("import sapiens2", None), ("import sapiens2", "active"), ("import torch, sapiens2", None)
    )
    assert unset == "PASSIVE" and users == "active"  # a value the user set wins
    # torch (and its OpenMP) loaded first: the variable would be read no more, so it is not set to pretend otherwise.
    assert torch_first == "None"


def test_a_wait_policy_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    assert wait_policy() == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert wait_policy() == "default"


def test_predict_threads_sets_torchs_count_for_a_plain_run(tiny_checkpoints, tmp_path, restore_threads, capsys):
    torch.set_num_threads(2)
    argv = ["predict", "--task", "seg", str(DATA / "astronaut.png"), "-o", str(tmp_path), "--device", "cpu",
            "--input-size", "64", "48", f"--model=seg={tiny_checkpoints['seg']}", "--threads", "1"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert torch.get_num_threads() == 1 and (tmp_path / "astronaut_seg.png").is_file()


@pytest.mark.parametrize("command", ["predict --task seg x -o out", "eval --task seg --data d", "demo", "benchmark"])
@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_bad_threads_are_an_argparse_error_naming_the_flag(command, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([*command.split(), "--threads", value])
    assert exit_info.value.code == 2 and "--threads" in capsys.readouterr().err


def test_eval_demo_and_benchmark_take_the_flag_into_their_options():
    from sapiens2.cli import benchmark, demo
    from sapiens2.cli import eval as eval_cli

    parse = build_parser().parse_args
    assert eval_cli.options_from_args(parse(["eval", "--task", "seg", "--data", "d", "--threads", "3"])).threads == 3
    assert demo.options_from_args(parse(["demo", "--threads", "2"])).threads == 2
    assert demo.options_from_args(parse(["demo"])).threads is None
    assert benchmark.options_from_args(parse(["benchmark", "--threads", "1"])).threads == 1


def test_predictor_threads_and_its_refusal(tiny_checkpoints, restore_threads):
    torch.set_num_threads(2)
    predictor = Predictor("seg", model=tiny_checkpoints["seg"], device="cpu", input_size=(64, 48), threads=1)
    assert torch.get_num_threads() == 1 and predictor.input_size == (64, 48)
    Predictor("seg", model=tiny_checkpoints["seg"], device="cpu", input_size=(64, 48))  # None leaves it
    assert torch.get_num_threads() == 1
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="threads must be an integer >= 1"):
            set_threads(bad)
