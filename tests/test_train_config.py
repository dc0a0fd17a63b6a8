"""Training config: YAML + dotted overrides -> typed frozen dataclasses; unknown keys, bad types and bad
combinations fail with messages that name the key and the fix."""

from __future__ import annotations

import dataclasses

import pytest

from sapiens2.train.config import (
    TrainConfig,
    config_from_dict,
    config_to_dict,
    load_config,
    save_config,
)

MINIMAL = "task: seg\nsteps: 1000\nmodel:\n  arch: sapiens2_0.4b\ndata:\n  root: /data/seg\n"


@pytest.fixture
def minimal_yaml(tmp_path):
    path = tmp_path / "seg.yaml"
    path.write_text(MINIMAL)
    return path


def test_defaults_are_the_official_recipe(minimal_yaml):
    config = load_config(minimal_yaml)
    assert isinstance(config, TrainConfig)
    assert config.optimizer.lr == 5e-4 and config.optimizer.weight_decay == 0.1
    assert config.optimizer.betas == (0.9, 0.999)
    assert config.schedule.warmup_steps is None and config.schedule.warmup_start_factor == 1e-3
    # Unset, the warm-up is a tenth of the run, at most the official 500.
    assert [config.schedule.resolved_warmup(n) for n in (5, 100, 5000, 20_000)] == [0, 10, 500, 500]
    assert config.data.input_size == (1024, 768)
    assert config.resolved_layer_decay("sapiens2_0.4b") == 0.8
    assert config.resolved_layer_decay("sapiens2_5b") == 0.94
    assert config.resolved_layer_decay("custom") == 1.0
    assert str(config.run_dir) == "runs/seg"


def test_overrides_are_parsed_and_converted_to_the_field_types(minimal_yaml):
    config = load_config(
        minimal_yaml,
        [
            "optimizer.lr=1e-4",  # YAML 1.1 reads this as a string
            "data.input_size=[512, 384]",
            "grad_clip=null",
            "model.head.num_classes=5",
            "precision=fp32",
            "distributed.strategy=fsdp",
            "steps=2e3",
        ],
    )
    assert config.optimizer.lr == 1e-4 and isinstance(config.optimizer.lr, float)
    assert config.data.input_size == (512, 384)
    assert config.grad_clip is None
    assert config.model.head == {"num_classes": 5}
    assert config.precision == "fp32" and config.distributed.strategy == "fsdp"
    assert config.steps == 2000 and isinstance(config.steps, int)


def test_configs_are_frozen(minimal_yaml):
    config = load_config(minimal_yaml)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.steps = 3


def test_custom_arch_dict_is_accepted(minimal_yaml):
    arch = {"embed_dims": 32, "num_layers": 2, "num_heads": 2, "feedforward_channels": 64, "num_tokenizer_layers": 0}
    values = {"task": "pose", "steps": 5, "schedule": {"warmup_steps": 1}, "data": {"root": "x"}}
    values["model"] = {"arch": arch}
    config = config_from_dict(values)
    assert config.model.arch == arch
    assert config_from_dict(config_to_dict(config)) == config
    with pytest.raises(ValueError, match="model.arch"):
        config_from_dict(values | {"model": {"arch": {"embed_dims": "wide"}}})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optimizer.lrr=1", "unknown config key 'optimizer.lrr'.*Did you mean 'lr'"),
        ("stepz=3", "unknown config key 'stepz'.*Did you mean 'steps'"),
        ("modle.arch=1b", "Did you mean 'model'"),
        ("precision=bf-16", "'bf-16' is not one of.*Did you mean 'bf16'"),
        ("distributed.strategy=fsdpp", "Did you mean 'fsdp'"),
        ("data.batch_size=abc", "data.batch_size: expected an integer"),
        ("data.batch_size=2.5", "data.batch_size: expected an integer"),
        ("data.augment=yes please", "data.augment: expected true or false"),
        ("data.input_size=[512]", "data.input_size: expected 2 values"),
        ("optimizer.lr=fast", "optimizer.lr"),
        ("model.arch=sapiens2_2b", "model.arch: unknown arch"),
        ("task=segmentation", "task 'segmentation' is not trainable"),
        ("epochs=3", "set exactly one of steps and epochs"),
        ("schedule.warmup_steps=100", r"warmup_steps=100 must be smaller than the run's 50 steps \(steps=50\)"),
        ("data.input_size=[500, 384]", "multiples of 16"),
        ("optimizer.layer_decay=1.5", "layer_decay must be in"),
        ("log_every=0", "log_every must be >= 1"),
        ("data.root=", "data.root is required"),
        ("steps", "has no '='"),
        ("loss={bogus: 1}", r"loss.bogus: the seg loss \(SegLoss\) takes no 'bogus'; it takes class_weight"),
        ("loss={dice_wieght: 1}", "Did you mean 'dice_weight'"),
        ("device=tpu", "device 'tpu' is not a device; use cpu, cuda or cuda:N"),
        ("nonfinite_patience=-1", "nonfinite_patience must be >= 0"),
    ],
)
def test_bad_values_fail_with_the_key_and_the_fix(minimal_yaml, override, message):
    overrides = ["steps=50"] if override.startswith("schedule") else []
    with pytest.raises(ValueError, match=message):
        load_config(minimal_yaml, [*overrides, override])


def test_arch_or_init_from_is_required(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("task: normal\nsteps: 1000\ndata:\n  root: /d\n")
    with pytest.raises(ValueError, match="model.arch is needed"):
        load_config(path)
    assert load_config(path, ["model.init_from=1b"]).model.arch is None


def test_missing_file_and_bad_yaml_are_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="training config not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: [seg\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="mapping of sections"):
        load_config(listed)


def test_saved_yaml_loads_back_to_an_equal_config(minimal_yaml, tmp_path):
    config = load_config(minimal_yaml, ["model.head.deconv_out_channels=[8, 8]", "data.options.label_map=dome34_to_29"])
    path = save_config(config, tmp_path / "out" / "config.yaml")
    assert load_config(path) == config
    assert "deconv_out_channels" in path.read_text()


def test_yaml_is_data_not_code(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("task: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(path)


@pytest.mark.parametrize("override", ["loss={bogus: 1}", "device=tpu"])
def test_cli_refuses_a_bad_loss_key_or_device_in_one_line_before_any_run_folder(override, tmp_path, capsys):
    from sapiens2.cli import main

    path = tmp_path / "seg.yaml"
    path.write_text(MINIMAL.replace("/data/seg", str(tmp_path / "data")) + f"output_dir: {tmp_path / 'run'}\n")
    assert main(["train", str(path), "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sapiens2 train: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()
