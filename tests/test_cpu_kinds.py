"""Fast mode on every CPU kind (issues #34, #38): bf16 where oneDNN cannot pack bf16 weights (AVX2 only, AMD Zen 3),
and the precision fast mode picks on each kind (``fast_precision``: bf16 only where the CPU computes it natively).

The emulation: ``ONEDNN_MAX_CPU_ISA=AVX2`` limits oneDNN to AVX2 kernels, and PyTorch asks oneDNN, not the CPU flags,
whether it packs bf16 (``torch.ops.mkldnn._is_mkldnn_bf16_supported``, and the check inside
``_reorder_linear_weight``), so packing a bf16 weight fails there exactly as on a Zen 3. ``ATEN_CPU_CAPABILITY=avx2``
limits ATen's own vectorised kernels and ``MKL_ENABLE_INSTRUCTIONS=AVX2`` MKL's: neither alone reproduces the crash
(checked on an AVX-512 BF16 machine), together they run the rest as an AVX2 CPU would. The first test is the negative
control: under the emulation the packing call that ``make_fast`` made unconditionally before the fix fails, so the
command tests below, run under it, would have caught the crash (they did: both exited with the traceback of the
issue before the fix). On a real AVX2-only CPU the same tests hold without the emulation.

``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` emulates an AVX-512 CPU without bf16 instructions (Intel Skylake/Cascade Lake):
oneDNN still packs bf16 there (the packing check asks for AVX-512 BW/VL/DQ only), but widens it to float32 to
multiply, so a choice made from packing alone would pick bf16 on such a CPU: the negative control of the precision
tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import DATA, TINY_ARCH

from sapiens2.models.fast import LINEAR_PATHS, choose_linear_path, fast_precision, onednn_linear_available, onednn_packs

AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
AVX512_WITHOUT_BF16 = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
PHOTO = DATA / "astronaut.png"

pytestmark = pytest.mark.skipif(not onednn_linear_available(), reason="a torch build without oneDNN packs nothing")


def _run(tmp_path, *args: str, emulate: bool | dict = True) -> subprocess.CompletedProcess:
    emulation = emulate if isinstance(emulate, dict) else AVX2_ONLY if emulate else {}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1",
           **emulation}  # fmt: skip
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env)


def _has_avx_ne_convert() -> bool:
    """AVX-NE-CONVERT lets PyTorch pack bf16 on an AVX2 CPU, and PyTorch reads that flag from the CPU itself, which
    no switch hides: on such a CPU (Intel's recent E-core and client parts) the emulation packs bf16 natively."""
    try:
        return "avx_ne_convert" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_the_avx2_emulation_refuses_bf16_packing_as_a_zen3_does(tmp_path):
    probe = ("import torch; from sapiens2.models.fast import choose_linear_path as c; print(c(torch.bfloat16)); "
             "torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=torch.bfloat16), 8)")  # fmt: skip
    result = _run(tmp_path, "-c", probe)
    if _has_avx_ne_convert():
        assert result.returncode == 0 and result.stdout.split() == ["onednn"], result.stderr[-2000:]
        return
    assert result.returncode != 0, "the emulation no longer reproduces the crash: the tests under it prove nothing"
    assert "bf16 path needs the cpu support" in result.stderr, result.stderr[-2000:]
    assert result.stdout.split() == ["onednn-fp32"]


def test_fast_bf16_predict_and_benchmark_run_on_an_avx2_only_cpu(tiny_checkpoints, tmp_path):
    seg = str(tiny_checkpoints["seg"])
    predict = _run(tmp_path, "-m", "sapiens2", "predict", "--task", "seg", "--model", f"seg={seg}", "--dtype", "bf16",
                   "--mode", "fast", "--device", "cpu", str(PHOTO), "-o", str(tmp_path / "out"))  # fmt: skip
    assert predict.returncode == 0, predict.stderr[-3000:]
    assert (tmp_path / "out" / "astronaut_seg.png").is_file()
    bench = _run(tmp_path, "-m", "sapiens2", "benchmark", "--task", "seg", "--model", seg, "--dtype", "bf16",
                 "--input-size", "64", "48", "--device", "cpu", "--iters", "1", "--warmup", "0")  # fmt: skip
    assert bench.returncode == 0, bench.stderr[-3000:]
    path = "onednn" if _has_avx_ne_convert() else "onednn-fp32"
    assert f"block linears     {path}: {LINEAR_PATHS[path]}" in bench.stdout, bench.stdout


def test_benchmark_names_the_path_this_cpu_takes(tiny_checkpoints, tmp_path):
    bench = _run(tmp_path, "-m", "sapiens2", "benchmark", "--task", "seg", "--model", str(tiny_checkpoints["seg"]),
                 "--dtype", "bf16", "--input-size", "64", "48", "--device", "cpu", "--iters", "1", "--warmup", "0",
                 emulate=False)  # fmt: skip
    assert bench.returncode == 0, bench.stderr[-3000:]
    path = choose_linear_path(torch.bfloat16)
    assert f"block linears     {path}: {LINEAR_PATHS[path]}" in bench.stdout, bench.stdout


def test_the_choice_takes_either_answer_of_the_probe():
    assert choose_linear_path(torch.float32) == "onednn"
    for dtype in (torch.bfloat16, torch.float16):
        assert choose_linear_path(dtype, native=True) == "onednn"
        assert choose_linear_path(dtype, native=False) == "onednn-fp32"
        assert choose_linear_path(dtype) == ("onednn" if onednn_packs(dtype) else "onednn-fp32")


def test_int8_activations_are_refused_where_their_sums_overflow(tmp_path):
    """Without VNNI, oneDNN's int8 GEMM sums in 16 bits that saturate: the probe sees it under the emulation (the
    parity seg model's logits moved 27 % there), and ``quantize`` refuses ``int8`` in one line."""
    probe = ("import sys; from sapiens2 import build_model; from sapiens2.models.lowp import int8_activations_exact, "
             f"quantize; print(int8_activations_exact()); quantize(build_model('seg', {TINY_ARCH}), 'int8')")
    result = _run(tmp_path, "-c", probe)
    assert result.stdout.split() == ["False"], result.stderr[-2000:]
    assert "ValueError: int8 on this CPU: its int8 kernels sum in 16 bits that overflow" in result.stderr


NATIVE_BF16 = [name for key, name in (("avx512_bf16", "AVX-512 BF16"), ("amx_bf16", "AMX-BF16"))
               if getattr(torch.cpu, "get_capabilities", dict)().get(key)]  # fmt: skip
PRECISION_PROBE = ("import torch; from sapiens2.models.fast import fast_precision, onednn_packs; "
                   "p = fast_precision('cpu'); print(p.dtype, onednn_packs(torch.bfloat16)); "
                   "print(p.reason)")  # fmt: skip


def _benchmark_precision(tmp_path, seg: str, emulate) -> str:
    bench = _run(tmp_path, "-m", "sapiens2", "benchmark", "--task", "seg", "--model", seg, "--input-size", "64", "48",
                 "--device", "cpu", "--iters", "1", "--warmup", "0", emulate=emulate)  # fmt: skip
    assert bench.returncode == 0, bench.stderr[-3000:]
    return bench.stdout


def test_fast_mode_picks_bf16_only_where_the_cpu_computes_it_natively(tiny_checkpoints, tmp_path):
    out = _benchmark_precision(tmp_path, str(tiny_checkpoints["seg"]), emulate=False)
    picked = fast_precision("cpu")
    assert f"precision         {picked.reason} (fast mode's pick; --dtype overrides)" in out, out
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()  # set when this suite runs under an emulation
    if NATIVE_BF16 and not limit:
        assert picked.dtype == torch.bfloat16 and ", bf16, batch 1" in out and NATIVE_BF16[0] in picked.reason
    elif NATIVE_BF16:  # .ci/run's AVX2-only emulation
        assert picked.dtype == torch.float32 and f"oneDNN is limited to {limit}" in picked.reason
    else:
        assert picked.dtype == torch.float32 and ", fp32, batch 1" in out and "no native bf16" in picked.reason
    asked = _run(tmp_path, "-m", "sapiens2", "benchmark", "--task", "seg", "--model", str(tiny_checkpoints["seg"]),
                 "--input-size", "64", "48", "--device", "cpu", "--iters", "1", "--warmup", "0", "--mode", "reference",
                 "--dtype", "fp16", emulate=False).stdout  # fmt: skip
    assert "precision         fp16: asked for (--dtype)" in asked, asked


def test_an_avx2_only_cpu_runs_fast_mode_in_fp32(tiny_checkpoints, tmp_path):
    out = _benchmark_precision(tmp_path, str(tiny_checkpoints["seg"]), emulate=True)
    assert ", fp32, batch 1" in out and "precision         fp32: " in out, out
    assert ("oneDNN is limited to AVX2" if NATIVE_BF16 else "no native bf16") in out, out


def test_an_avx512_cpu_without_bf16_runs_fast_mode_in_fp32(tmp_path):
    """The negative control: oneDNN packs bf16 under this emulation, so packing alone would have picked bf16."""
    result = _run(tmp_path, "-c", PRECISION_PROBE, emulate=AVX512_WITHOUT_BF16)
    assert result.returncode == 0, result.stderr[-2000:]
    dtype_and_packs, reason = result.stdout.splitlines()
    assert dtype_and_packs == "torch.float32 True", result.stdout
    assert ("oneDNN is limited to AVX512_CORE" if NATIVE_BF16 else "no native bf16") in reason
