"""The task table (``sapiens2.tasks``) is the one declaration of the tasks: every per-task mapping of the package
covers exactly the tasks the table says it should, so a new task shows up everywhere or fails here."""

from __future__ import annotations

import pytest

from sapiens2.eval.metrics import DENSE_METRICS
from sapiens2.models.heads import HEAD_CONFIGS, HEADS, OUTPUT_LAYERS
from sapiens2.models.zoo import ARCHS
from sapiens2.tasks import PRETRAIN, TASKS, check_task, published_tasks
from sapiens2.train.config import TRAIN_TASKS
from sapiens2.train.datasets import TASK_DATASETS
from sapiens2.train.losses import TASK_LOSSES
from sapiens2.transformers_format import TRANSFORMERS_CLASSES

ALL = set(TASKS)
DENSE = {name for name, task in TASKS.items() if task.dense}
TRAINABLE = {name for name, task in TASKS.items() if task.trainable}
EVALUABLE = {name for name, task in TASKS.items() if task.evaluable}


def _mappings() -> dict[str, tuple[set, set]]:
    """name -> (keys of the mapping, the tasks it must cover)."""
    from sapiens2.eval.run import TASK_EVALUATORS
    from sapiens2.export.program import OUTPUT_NAMES
    from sapiens2.predict.predictor import DENSE_TASKS
    from sapiens2.predict.writers import WRITERS
    from sapiens2.train.trainer import EVAL_TARGETS

    return {
        "models.heads.HEADS": (set(HEADS), ALL),
        "models.heads.OUTPUT_LAYERS": (set(OUTPUT_LAYERS), ALL),
        "models.heads.HEAD_CONFIGS": (set(HEAD_CONFIGS), ALL),
        "predict.predictor.DENSE_TASKS": (set(DENSE_TASKS), DENSE),
        "predict.writers.WRITERS": (set(WRITERS), ALL),
        "train.losses.TASK_LOSSES": (set(TASK_LOSSES), TRAINABLE),
        "train.datasets.TASK_DATASETS": (set(TASK_DATASETS), TRAINABLE),
        "train.config.TRAIN_TASKS": (set(TRAIN_TASKS), TRAINABLE),
        "train.trainer.EVAL_TARGETS": (set(EVAL_TARGETS), TRAINABLE & DENSE),
        "eval.metrics.DENSE_METRICS": (set(DENSE_METRICS), TRAINABLE & DENSE),
        "eval.run.TASK_EVALUATORS": (set(TASK_EVALUATORS), EVALUABLE),
        "export.program.OUTPUT_NAMES": (set(OUTPUT_NAMES), ALL),
        # transformers has no albedo model; "pretrain" is its bare backbone.
        "transformers_format.TRANSFORMERS_CLASSES": (set(TRANSFORMERS_CLASSES), (ALL - {"albedo"}) | {PRETRAIN}),
    }


@pytest.mark.parametrize("name", sorted(_mappings()))
def test_every_per_task_mapping_covers_exactly_the_declared_tasks(name):
    keys, expected = _mappings()[name]
    assert keys == expected, f"{name}: missing {sorted(expected - keys)}, not declared {sorted(keys - expected)}"


def test_published_weights_and_known_head_widths_are_separate_facts():
    # Published weights: the task table. Albedo has released configs (head widths) but no published weights;
    # matting has published 1b weights but no known widths.
    assert ARCHS["sapiens2_1b"].released_tasks == (PRETRAIN, "pose", "seg", "normal", "pointmap", "matting")
    assert "albedo" not in published_tasks("1b") and ARCHS["sapiens2_1b"].head_config("albedo") is not None
    assert "matting" in published_tasks("1b") and ARCHS["sapiens2_1b"].head_config("matting") is None
    assert ARCHS["sapiens2_0.1b"].released_tasks == (PRETRAIN,)
    assert all(set(arch.head_widths) <= ALL for arch in ARCHS.values())


def test_evaluable_tasks():
    # Matting has published weights but no labelled layout, metric or reference evaluator to reproduce.
    assert EVALUABLE == ALL - {"matting"}


def test_unknown_task_names_get_a_suggestion():
    assert check_task("seg") == "seg"
    with pytest.raises(ValueError, match="Did you mean 'pointmap'"):
        check_task("pointmaps")


def test_each_writer_writes_its_primary_file_last(tmp_path):
    """``--skip-existing`` trusts ``TaskWriter.primary``: it must be the last file each writer writes."""
    from test_visualize import astronaut_image
    from test_writers import RESULTS

    from sapiens2.predict.writers import WRITERS, write_result

    assert set(RESULTS) == set(WRITERS)
    for task, make in RESULTS.items():
        written = write_result(task, make(), tmp_path / task / "img", astronaut_image())
        assert written[-1].name == "img" + WRITERS[task].primary, (task, [p.name for p in written])
