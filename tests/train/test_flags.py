"""The training flags come from TrainConfig's fields: every field's flag parses into that field, and the
four commands that take training flags take the same ones."""

import argparse

import pytest

from pipelines import dataflow, local
from train import flags
from train.__main__ import build_parser, config_from_args
from train.config import MODEL_AND_MACHINE, RECIPE, TrainConfig
from train.tools import bench_input

# A value other than the default for every field with a flag: the flag's text and the field's value.
SAMPLES = {
    "model": ("resnet50", "resnet50"),
    "epochs": ("3", 3),
    "steps_per_epoch": ("40", 40),
    "more_epochs": ("2", 2),
    "global_batch_size": ("64", 64),
    "learning_rate": ("0.25", 0.25),
    "backend": ("jax", "jax"),
    "strategy": ("mirrored", "mirrored"),
    "tpu": ("my-v4-32", "my-v4-32"),
    "mixed_precision": ("bfloat16", "bfloat16"),
    "steps_per_execution": ("8", 8),
    "jit_compile": ("on", "on"),
    "augment": (None, True),
    "verify_data": (None, True),
    "shuffle_buffer": ("512", 512),
    "parallel_files": ("4", 4),
    "export": (None, False),
    "checkpoint_every": ("5m", "5m"),
    "preemption_check_every": ("20", "20"),
    "log_every": ("7", 7),
    "eval_every": ("30", 30),
    "profile_steps": ("10,12", (10, 12)),
    "shared_filesystem": (None, True),
    "allow_cpu": (None, True),
    "weights": ("imagenet", "imagenet"),
    "freeze_backbone_epochs": ("2", 2),
    "optimizer": ("sgd", "sgd"),
    "base_learning_rate": ("0.2", 0.2),
    "learning_rate_scaling": ("sqrt", "sqrt"),
    "warmup_epochs": ("2.5", 2.5),
    "weight_decay": ("0.01", 0.01),
    "label_smoothing": ("0.1", 0.1),
    "gradient_accumulation_steps": ("4", 4),
    "ema": (None, True),
    "ema_momentum": ("0.99", 0.99),
}
# The other side of a mutually exclusive pair, on its own run.
EXCLUSIVE_SAMPLES = {"steps": ("90", 90), "warmup_steps": ("100", 100)}


def argv_for(samples: dict) -> list[str]:
    argv = ["--data", "d", "--model-dir", "m"]
    for name, (text, _) in samples.items():
        argv += [flags.flag_name(name)] + ([] if text is None else [text])
    return argv


def test_every_field_with_a_flag_has_a_sample_here():
    assert set(SAMPLES) | set(EXCLUSIVE_SAMPLES) == set(flags.config_flags()) - {"data_dir", "model_dir"}


@pytest.mark.parametrize("samples", [SAMPLES, EXCLUSIVE_SAMPLES], ids=["fields", "exclusive-fields"])
def test_each_flag_of_python_m_train_sets_its_field(samples):
    config = config_from_args(build_parser().parse_args(argv_for(samples)))
    default = TrainConfig(data_dir="", model_dir="")
    assert (config.data_dir, config.model_dir) == ("d", "m")
    for name, (_, value) in samples.items():
        assert getattr(config, name) == value != getattr(default, name), name


def test_python_m_train_without_flags_builds_the_default_config():
    assert config_from_args(build_parser().parse_args(["--data", "d", "--model-dir", "m"])) == TrainConfig(
        "d", "m"
    )


def test_train_argv_gives_the_flags_that_rebuild_the_values():
    values = {name: value for name, (_, value) in SAMPLES.items() if name != "profile_steps"}
    config = config_from_args(
        build_parser().parse_args(["--data", "d", "--model-dir", "m", *flags.train_argv(values)])
    )
    assert {name: getattr(config, name) for name in values} == values
    assert flags.train_argv({"epochs": 10, "learning_rate": None, "ema": False}) == []  # defaults and unset


def actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {action.dest: action for action in parser._actions}


def same_flag(ours: argparse.Action, train: argparse.Action) -> bool:
    return (ours.option_strings, ours.type, ours.choices, type(ours)) == (
        train.option_strings,
        train.type,
        train.choices,
        type(train),
    )


def test_bench_input_takes_python_m_train_s_dataset_and_machine_flags():
    train, bench = actions(build_parser()), actions(bench_input.build_parser())
    for name in ("data_dir", *flags.names_in(MODEL_AND_MACHINE)):
        assert same_flag(bench[name], train[name]) and bench[name].help == train[name].help, name


def test_the_workflows_take_python_m_train_s_flags_with_only_their_defaults_and_model_check_their_own():
    train = actions(build_parser())
    for parser, fields in (
        (local.build_parser(), local.TRAIN_FIELDS),
        (dataflow.build_parser(), dataflow.STAGE2_FIELDS),
    ):
        ours = actions(parser)
        for name in fields:
            if name != "model":  # the workflows check --model their own way (a did-you-mean; built-ins only)
                assert same_flag(ours[name], train[name]), name
    recipe = actions(dataflow.build_parser())
    for name in flags.names_in(RECIPE):
        assert same_flag(recipe[name], train[name]) and recipe[name].help == train[name].help, name
