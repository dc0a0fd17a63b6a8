"""``sapiens2 predict --engine ray`` on a real local Ray instance (2 CPUs, one per module) with tiny models."""

from __future__ import annotations

import logging
import os
import warnings

import pytest
from conftest import require_module
from test_bulk_predict import files_of, photos, predict
from test_serve_hostile import is_loopback, listening_sockets

from sapiens2.bulk import Ledger


@pytest.fixture(scope="module")
def ray_instance():
    ray = require_module("ray")
    require_module("pyarrow")
    from sapiens2.bulk.ray_engine import start_local_ray

    start_local_ray(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_a_local_ray_instance_listens_on_loopback_only(ray_instance):
    @ray_instance.remote
    def worker() -> int:
        return os.getpid()

    assert ray_instance.get(worker.remote()) != os.getpid()  # a worker is up, with its servers
    sockets = listening_sockets(os.getpid())
    names = " ".join(name for _, _, name in sockets)
    assert all(part in names for part in ("gcs_server", "raylet", "DashboardAgent")), sockets
    exposed = [s for s in sockets if not is_loopback(s[0])]
    assert exposed == [], f"listening beyond loopback: {exposed}"


@pytest.mark.slow  # 20+ s on 2 cores; the default suite keeps the Ray rows-equal and loopback tests
def test_ray_pipeline_writes_the_single_process_files_and_resumes(ray_instance, tiny_checkpoints, tmp_path, capsys,
                                                                   caplog):  # fmt: skip
    inputs = photos(tmp_path / "in")
    one = ("--batch-size", "1")
    assert predict(tiny_checkpoints, [inputs], tmp_path / "one", "--device", "cpu", *one) == 1
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        assert predict(tiny_checkpoints, [inputs], tmp_path / "ray", "--engine", "ray", "--devices", "cpu:2", *one) == 1
    deprecations = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert deprecations == [] and "deprecated" not in caplog.text  # none from our calls to Ray (Data)
    captured = capsys.readouterr()
    assert "3 done, 1 failed, 0 skipped" in captured.out and "ray:" in captured.out
    assert captured.err.count("error:") == 1 and "broken.png" in captured.err
    single, ray = files_of(tmp_path / "one"), files_of(tmp_path / "ray")
    assert sorted(single) == sorted(ray) and [name for name in single if single[name] != ray[name]] == []
    assert Ledger(tmp_path / "ray").entries()["broken.png"].status == "failed"
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "ray").rglob("*_seg.png")}
    assert predict(tiny_checkpoints, [inputs], tmp_path / "ray", "--engine", "ray", "--devices", "cpu:1", *one) == 1
    assert "0 done, 1 failed, 3 skipped" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "ray").rglob("*_seg.png")} == stamps


def test_ray_parquet_rows_equal_the_local_engine(ray_instance, tiny_checkpoints, tmp_path):
    pq = require_module("pyarrow.parquet")
    inputs = photos(tmp_path / "in")
    for engine in ("local", "ray"):
        predict(tiny_checkpoints, [inputs], tmp_path / engine, "--sink", "parquet", "--engine", engine, "--devices",
                "cpu:1", tasks=("seg", "pose"))  # fmt: skip
    rows = {}
    for engine in ("local", "ray"):
        parts = sorted((tmp_path / engine / "parts").glob("*.parquet"))
        rows[engine] = [row for part in parts for row in pq.read_table(part).to_pylist()]
    assert len(rows["ray"]) == 3 and rows["ray"] == rows["local"]
