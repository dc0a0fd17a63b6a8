"""``benchmarks/gpu_session.sh`` (issue #38): its control flow, dry-run on the CPU with ``--device cpu --tiny``.

The script runs every GPU step in the order of the issue, each under its own time limit and a global budget, writes
each step's log and tables to ``$OUT`` as the step ends and appends them to ``$OUT/summary.md``. With no budget left,
every step is recorded as skipped, in order, with the command that runs them later (the fast test); the slow test runs
the whole dry run on tiny models, where every step must finish and print its table.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["tests", "backbone", "pose", "mocap", "fp8", "fp8-accuracy", "ops"]


def _session(tmp_path: Path, *args: str, budget: int | None = None, timeout: int = 60) -> str:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_SESSION_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    if budget is not None:
        env["GPU_SESSION_BUDGET_S"] = str(budget)
    result = subprocess.run(["bash", "benchmarks/gpu_session.sh", "--device", "cpu", "--tiny", *args], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.startswith("# GPU session ") and "device cpu, tiny dry run" in summary
    return summary


def _headings(summary: str) -> list[tuple[str, str]]:
    return re.findall(r"^## ([\w-]+): (.*)$", summary, flags=re.MULTILINE)


def test_without_budget_every_step_is_recorded_as_skipped_in_order(tmp_path):
    summary = _session(tmp_path, budget=0)
    headings = _headings(summary)
    assert [name for name, _ in headings] == [*STEPS, "end"]
    assert all(status.startswith("skipped (") for _, status in headings[:-1])
    assert f"bash benchmarks/gpu_session.sh --device cpu --tiny --steps {','.join(STEPS)}" in summary
    assert not list((tmp_path / "out").glob("0*-*.log"))  # nothing ran


def test_steps_runs_only_the_steps_named(tmp_path):
    summary = _session(tmp_path, "--steps", "tests,fp8-accuracy", budget=0)
    assert [name for name, _ in _headings(summary)] == ["tests", "fp8-accuracy", "end"]


@pytest.mark.slow
def test_the_dry_run_runs_every_step_to_its_table(tmp_path):
    """About 4 minutes on 2 busy cores: every step on tiny models, each ending with rc 0 and its figures."""
    summary = _session(tmp_path, timeout=900)
    headings = dict(_headings(summary))
    assert list(headings) == [*STEPS, "end"]
    assert all(status.startswith("rc 0, ") for name, status in headings.items() if name != "end"), headings
    out = tmp_path / "out"
    for number, name in enumerate(STEPS, 1):
        assert (out / f"{number:02d}-{name}.log").is_file() and (out / f"{number:02d}-{name}.md").is_file()
    assert re.search(r"^\d+ skipped, \d+ deselected in", (out / "01-tests.md").read_text(), flags=re.MULTILINE)
    backbone = (out / "02-backbone.md").read_text()
    assert "| compiled, with fused ops |" in backbone and "| transformers' port, eager |" in backbone
    assert re.search(r"^decision: compiled with fused ops runs at [\d.]+x compiled without", backbone, re.MULTILINE)
    assert "| ours fast bf16 + fused kernels, 6 crops + mirrors |" in (out / "03-pose.md").read_text()
    assert re.search(r"^\| tiny \| 3 \| ", (out / "04-mocap.md").read_text(), flags=re.MULTILINE)
    assert "int8-weight blocks" in (out / "05-fp8.md").read_text()
    assert "| pose | int8-weight fast mode |" in (out / "06-fp8-accuracy.md").read_text()
    assert "| LayerScale + residual | fused |" in (out / "07-ops.md").read_text()
