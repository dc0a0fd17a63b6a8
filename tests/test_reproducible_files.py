"""Reproducible ``.safetensors`` files (issue #24 item 9): the same tensors and metadata give the same bytes, with mode
0644, from the shared writer and from every exporter that goes through it (training, pretraining, transformers)."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from conftest import TINY_ARCH

from sapiens2 import build_model
from sapiens2.data.io import write_safetensors

METADATA = {"format": "pt", "task": "seg", "step": "7", "weights": "teacher", "run": "a", "note": "ünïcode"}


@pytest.fixture
def strict_umask():
    """A umask that would make a file 0600 if the writer left the mode to it."""
    previous = os.umask(0o077)
    yield
    os.umask(previous)


def same_bytes_and_0644(paths) -> None:
    assert len({path.read_bytes() for path in paths}) == 1
    assert [oct(stat.S_IMODE(path.stat().st_mode)) for path in paths] == [oct(0o644)] * len(paths)


def test_write_safetensors_gives_the_same_bytes_for_the_same_content(tmp_path, strict_umask):
    from safetensors import safe_open

    tensors = {"b.weight": torch.arange(6.0).reshape(2, 3), "a.periods": torch.ones(4, dtype=torch.bfloat16),
               "c.index": torch.arange(3)}  # fmt: skip
    # safetensors writes its metadata map in a new random order on every call: five writes would not agree
    paths = [write_safetensors(tmp_path / f"{i}.safetensors", tensors, METADATA) for i in range(5)]
    same_bytes_and_0644(paths)
    with safe_open(paths[0], "pt") as reader:
        assert reader.metadata() == METADATA
        for name, tensor in tensors.items():
            assert torch.equal(reader.get_tensor(name), tensor) and reader.get_tensor(name).dtype == tensor.dtype
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_exported_weights_are_byte_identical_across_exports(tmp_path, strict_umask):
    from sapiens2.pretrain.export import CHECKPOINT_FORMAT as PRETRAIN_FORMAT
    from sapiens2.pretrain.export import export_backbone
    from sapiens2.train.trainer import CHECKPOINT_FORMAT as TRAIN_FORMAT
    from sapiens2.train.trainer import export_model
    from sapiens2.transformers_format import save_transformers

    torch.manual_seed(0)
    model = build_model("seg", TINY_ARCH, input_size=(64, 48), deconv_out_channels=(16, 8, 8, 8),
                        deconv_kernel_sizes=(4, 4, 4, 4), conv_out_channels=(8,), conv_kernel_sizes=(1,))  # fmt: skip
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"format": TRAIN_FORMAT, "model": state, "task": "seg", "step": 3}, tmp_path / "train.pt")
    backbone = {k: v for k, v in state.items() if k.startswith("backbone.")}
    torch.save({"format": PRETRAIN_FORMAT, "teacher": backbone, "student": backbone, "step": 3}, tmp_path / "pre.pt")
    for name, export in {
        "train": lambda out: export_model(tmp_path / "train.pt", out),
        "pretrain": lambda out: export_backbone(tmp_path / "pre.pt", out),
        "transformers": lambda out: save_transformers(model, out.with_suffix("")) / "model.safetensors",
    }.items():
        same_bytes_and_0644([export(tmp_path / f"{name}_{i}.safetensors") for i in range(3)])
