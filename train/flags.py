"""The command-line flags of TrainConfig's fields, generated from the fields' own declarations.

`python -m train`, `train.tools.bench_input`, `pipelines.local` and `pipelines.dataflow` add their
training flags here and map the parsed values back with config_fields; each field's flag, group,
type and help are declared once, on the field (train/config.py). No TensorFlow here.
"""

import argparse
import dataclasses
import functools
from collections.abc import Iterable

from train.config import GROUPS, Flag, TrainConfig
from train.device import device_defaults
from train.model import lr_scaling
from train.model import recipe as recipe_lib


@functools.cache
def config_flags() -> dict[str, tuple[dataclasses.Field, Flag]]:
    """Every TrainConfig field that has a flag, in the order of the fields: name -> (field, flag)."""
    return {
        field.name: (field, field.metadata["flag"])
        for field in dataclasses.fields(TrainConfig)
        if "flag" in field.metadata
    }


def names_in(group: str) -> tuple[str, ...]:
    """The fields whose flags sit in `group` (one of config.GROUPS)."""
    return tuple(name for name, (_, flag) in config_flags().items() if flag.group == group)


def flag_name(name: str) -> str:
    """The flag of the field `name`: `--global-batch-size` for global_batch_size, `--data` for data_dir."""
    return config_flags()[name][1].name or "--" + name.replace("_", "-")


def help_values() -> dict:
    """The figures a flag's help names ({per_replica[tpu]}, {adamw.weight_decay:g}, ...), from where they live."""
    return {
        "per_replica": device_defaults.PER_REPLICA_BATCH,
        "parallel_files": device_defaults.PARALLEL_FILES,
        "image_size": device_defaults.REFERENCE_IMAGE_SIZE,
        "adamw": recipe_lib.DEFAULTS[recipe_lib.ADAMW],
        "sgd": recipe_lib.DEFAULTS[recipe_lib.SGD],
        "reference_batch": lr_scaling.REFERENCE_BATCH,
    }


def add_config_flags(
    parser: argparse.ArgumentParser,
    names: Iterable[str] | None = None,
    *,
    group: str | None = None,
    overrides: dict[str, dict] | None = None,
) -> dict[str, argparse._ArgumentGroup]:
    """Add the flags of the fields `names` (default: every field with a flag) to `parser`.

    Each lands in its field's group, the groups in config.GROUPS' order, or all in `group` when given.
    `overrides` is for a workflow whose own defaults differ from python -m train's: {field: {"default": ..,
    "help": .., or another Flag setting}}. Returns the argument groups made, by title, for a command's own
    flags to join them. The flag's dest is the field's name.
    """
    overrides = overrides or {}
    chosen = list(config_flags()) if names is None else list(names)
    if group is None:  # the usage line in the order of the groups, as --help lists them
        chosen.sort(key=lambda name: GROUPS.index(config_flags()[name][1].group))
    titles = (
        [group]
        if group
        else [title for title in GROUPS if any(config_flags()[n][1].group == title for n in chosen)]
    )
    groups = {title: parser.add_argument_group(title) for title in titles}
    exclusive = {}
    values = help_values()
    for name in chosen:
        field, flag = config_flags()[name]
        settings = dict(overrides.get(name, {}))
        default = settings.pop("default", field.default)
        flag = dataclasses.replace(flag, **settings)
        target = groups[group or flag.group]
        if (
            flag.exclusive
            and sum(config_flags()[other][1].exclusive == flag.exclusive for other in chosen) > 1
        ):
            key = (group or flag.group, flag.exclusive)
            if key not in exclusive:
                exclusive[key] = target.add_mutually_exclusive_group()
            target = exclusive[key]
        options = {"dest": name, "help": flag.help.format(**values)}
        if flag.switch:
            options["action"] = "store_false" if default is True else "store_true"
        else:
            required = default is dataclasses.MISSING
            # argparse's own metavar would come from the dest (DATA_DIR for --data): name it after the flag.
            metavar = flag.metavar or (
                None if flag.choices else flag_name(name).lstrip("-").replace("-", "_").upper()
            )
            options.update(type=flag.type, choices=flag.choices, metavar=metavar, required=required)
            options["default"] = None if required else default
        target.add_argument(flag_name(name), **options)
    return groups


def add_verbose_flag(group: argparse._ArgumentGroup) -> None:
    """--verbose: not a field (it is how a command logs, not what it trains), shared by the training commands."""
    group.add_argument(
        "--verbose",
        action="store_true",
        help="Log at INFO (default: warnings only), TensorFlow's start-up too.",
    )


def config_fields(args: argparse.Namespace, names: Iterable[str] | None = None) -> dict:
    """TrainConfig's fields from parsed flags: those of `names`, default every field `args` has a flag for.

    A field's `parse` turns its flag's text into its value here (ConfigError for a bad one).
    """
    chosen = [name for name in config_flags() if hasattr(args, name)] if names is None else list(names)
    fields = {}
    for name in chosen:
        value = getattr(args, name)
        parse = config_flags()[name][1].parse
        fields[name] = parse(value) if parse else value
    return fields


def train_argv(values: dict) -> list[str]:
    """`python -m train`'s flags for field values: those that differ from TrainConfig's defaults (None is
    not given: train's own default applies), in the order of `values`."""
    argv = []
    for name, value in values.items():
        field, flag = config_flags()[name]
        if value is None or value == field.default:
            continue
        argv += [flag_name(name)] if flag.switch else [flag_name(name), str(value)]
    return argv
