"""``sapiens2 benchmark`` through the real entry point on tiny models (smoke only: no timing assertions)."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import TINY_ARCH
from safetensors.torch import save_file

from sapiens2 import Sapiens2
from sapiens2.benchmark import BenchmarkOptions, CpuInfo, cpu_info, device_peak_tflops, run_benchmark
from sapiens2.cli import main
from sapiens2.models.zoo import get_arch

FIELDS = ("images/s", "latency ms/batch", "peak memory", "FLOPs per image", "achieved", "MFU")


def _run(capsys, *flags: str) -> tuple[int, str, str]:
    status = main(["benchmark", "--device", "cpu", "--iters", "2", "--warmup", "1", *flags])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_benchmark_prints_every_figure_for_a_task_model(tiny_checkpoints, capsys, mode):
    status, out, _ = _run(
        capsys, "--task", "seg", "--model", str(tiny_checkpoints["seg"]), "--input-size", "64", "48", "--mode", mode,
        "--batch-size", "2", "--peak-tflops", "0.5",
    )  # fmt: skip
    assert status == 0
    assert all(field in out for field in FIELDS), out
    assert f"{mode} mode" in out and "batch 2, 64x48" in out
    mfu = float(re.search(r"MFU\s+([\d.]+) % of 0.5", out).group(1))
    achieved = float(re.search(r"achieved\s+([\d.]+) TFLOP/s", out).group(1))
    assert mfu == pytest.approx(100 * achieved / 0.5, abs=0.2)


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_benchmark_of_a_backbone_file_reports_the_cpu_and_its_peak(tmp_path, capsys, monkeypatch, restore_threads):
    path = tmp_path / "tiny_backbone.safetensors"
    save_file({k: v.contiguous() for k, v in Sapiens2(TINY_ARCH).state_dict().items()}, str(path))
    status, out, _ = _run(capsys, "--model", str(path), "--batch", "1", "--resolution", "64x48", "--threads", "1",
                          "--dtype", "fp32")  # fmt: skip
    assert status == 0 and "backbone custom" in out and "(1 threads, OpenMP wait policy" in out  # deprecated flags
    info = cpu_info()
    assert f"cpu               {info.model}, " in out and f"torch kernels {info.capability}" in out
    if info.ghz is not None:  # one core's fp32 peak: FLOP/cycle of the ISA x clock
        peak = float(re.search(r"MFU\s+[\d.]+ % of ([\d.]+) \(fp32 peak 1 cores x", out).group(1))
        assert peak == pytest.approx(info.flops_per_cycle("fp32") * info.ghz / 1000, rel=1e-3)
    monkeypatch.setattr("sapiens2.benchmark.cpu_info", lambda: CpuInfo(model="no clock known"))
    status, out, _ = _run(capsys, "--model", str(path), "--input-size", "64", "48")
    assert status == 0 and "n/a (give --peak-tflops)" in out and "no clock known" in out


def test_flops_are_the_arch_table_backbone_plus_the_counted_head(tiny_checkpoints):
    options = BenchmarkOptions(task="pose", model=str(tiny_checkpoints["pose"]), input_size=(64, 48), iters=1,
                               warmup=0, device="cpu")  # fmt: skip
    report = run_benchmark(options)
    # The tiny pose head: two 4x4 stride-2 deconvolutions, a 1x1 conv unit and the 308-channel output conv.
    grid = 4 * 3
    head = 2 * (32 * 16 * 16 * grid + 16 * 16 * 16 * 4 * grid) + 2 * 16 * 16 * 16 * grid + 2 * 16 * 308 * 16 * grid
    assert report.flops_per_image == get_arch(TINY_ARCH).flops((64, 48)) + head
    assert report.images_per_s > 0 and len(report.latencies_ms) == 1 and report.cpu is not None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--compile", "--mode", "reference"], "--compile needs --mode fast"),
        (["--batch-size", "0"], "--batch-size 0: must be >= 1"),
        (["--warmup", "-1"], "--warmup -1: must be >= 0"),
        (["--peak-tflops", "-1"], "--peak-tflops must be > 0"),
        (["--model", "no/such-model-anywhere"], "no/such-model-anywhere"),
    ],
)
def test_benchmark_refuses_bad_flags_in_one_line(capsys, flags, message):
    status, out, err = _run(capsys, "--model", "0.1b", *flags) if flags[0] != "--model" else _run(capsys, *flags)
    assert status == 2 and message in err and not out and len(err.strip().splitlines()) == 1


def test_bad_resolution_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["benchmark", "--resolution", "1024by768"])
    assert exit_info.value.code == 2 and "--resolution" in capsys.readouterr().err


def test_peak_table_knows_gpus_and_not_cpus():
    assert device_peak_tflops(torch.device("cpu"), torch.bfloat16) is None
