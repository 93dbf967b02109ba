"""`python -m preprocess`'s command line: the flags of Stage1Config; everything else goes to Beam untouched."""

import argparse
import dataclasses
import difflib

from dataset_contract.cli_help import CommandParser, flag_value, group_flags
from preprocess.config import Stage1Config

PROG = "python -m preprocess"


def build_parser() -> CommandParser:
    """The command's parser: a flag per Stage1Config field (--image-size for image_size), in --help groups."""
    parser = CommandParser(
        prog=PROG,
        description="Turn a corpus of images into a dataset directory of resized, sharded TFRecords "
        "with a manifest (dataset.json) holding the train split's normalization statistics. Any flag not listed here is passed to Apache Beam "
        "(--runner, --project, --region, --temp_location, --num_workers, --sdk_container_image, ...).",
    )
    groups: dict[str, list[str]] = {}
    for field in dataclasses.fields(Stage1Config):
        groups.setdefault(field.metadata["group"], []).append(flag_of(field.name))
        _add_flag(parser, field)
    group_flags(parser, {title: tuple(flags) for title, flags in groups.items()})
    return parser


def flag_of(name: str) -> str:
    """A Stage1Config field's flag: image_size -> --image-size."""
    return "--" + name.replace("_", "-")


def _add_flag(target, field: dataclasses.Field, **overrides) -> None:
    settings = {"help": field.metadata["help"], **field.metadata["flag"]}
    if field.type is bool:
        target.add_argument(flag_of(field.name), action="store_true", **{**settings, **overrides})
        return
    default = field.default_factory() if field.default is dataclasses.MISSING else field.default
    settings.update({"type": field.metadata["parse"], "default": default, **overrides})
    target.add_argument(flag_of(field.name), dest=field.name, **settings)


def add_stage1_flags(target, names, overrides: dict[str, dict] | None = None) -> None:
    """Add the flags of Stage1Config's fields `names` to `target` (a parser or an argument group), for a
    workflow that runs stage 1: the same checks and help as python -m preprocess's. `overrides`: {field:
    {"default": .., "help": ..}} where the workflow's own differ (a default of None: stage 1's)."""
    fields = {field.name: field for field in dataclasses.fields(Stage1Config)}
    for name in names:
        _add_flag(target, fields[name], **(overrides or {}).get(name, {}))


def stage1_argv(args: argparse.Namespace, names) -> list[str]:
    """The python -m preprocess flags of `args`' values for the fields `names` (None: not given)."""
    argv = []
    for name in names:
        value = getattr(args, name)
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag_of(name))
        else:
            argv += [flag_of(name), ",".join(value) if isinstance(value, (list, tuple)) else str(value)]
    return argv


def beam_option_flags() -> list[str]:
    """Every flag Beam's PipelineOptions (all of its subclasses: Dataflow's, the DirectRunner's, ...) knows.

    Collected as Beam collects them when it parses its options (PipelineOptions.get_all_options).
    """
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser  # noqa: PLC0415

    parser = _BeamArgumentParser(allow_abbrev=False, add_help=False)
    # A subclass defined twice (a re-imported main session) would add its flags twice: keep one.
    for cls in {str(cls): cls for cls in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # noqa: SLF001 - Beam's own way to list its flags
    return [flag for flag in parser._option_string_actions if flag.startswith("--")]  # noqa: SLF001


def unknown_flags(beam_args: list[str], known: list[str]) -> list[str]:
    """The command-line words of `beam_args` that no flag in `known` takes, as argparse leaves them
    (unknown flags, their values, stray words: cli_help.unknown_words tells them apart)."""
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    for flag in known:
        # Any flag with an optional value: only whether it is known matters here, Beam checks its value.
        parser.add_argument(flag, nargs="?")
    _, unknown = parser.parse_known_args(beam_args)
    return unknown


def runner_problem(beam_args: list[str]) -> str | None:
    """What is wrong with the --runner value among `beam_args` (a runner Beam does not know, resolved as
    Beam resolves it); None when it is fine or not given."""
    value = flag_value(beam_args, "--runner")
    if value is None or "." in value:
        return None
    from apache_beam.options.pipeline_options import StandardOptions  # noqa: PLC0415

    known = {name.lower(): name for name in StandardOptions.KNOWN_RUNNER_NAMES}
    if value.lower() in known or value.lower() + "runner" in known:
        return None
    close = difflib.get_close_matches(value.lower(), list(known), n=1, cutoff=0.6)
    hint = f" (did you mean {known[close[0]]}?)" if close else ""
    return (
        f"--runner {value}: no such Beam runner{hint}; choose DirectRunner (this machine), DataflowRunner, "
        "PrismRunner, ... or give a PipelineRunner subclass's full module.Class name"
    )


def beam_args_problem(beam_args: list[str], parser: CommandParser) -> str | None:
    """What is wrong with the flags `parser` left for Beam: a flag that is neither `parser`'s nor a Beam
    pipeline option (Beam would only warn 'Discarding unparseable args' and run without it), or a
    --runner Beam does not know; or None."""
    if not beam_args:
        return None  # Beam is not even imported
    beam_flags = beam_option_flags()
    unknown = unknown_flags(beam_args, beam_flags)
    if not unknown:
        return runner_problem(beam_args)
    return (
        parser.unknown_flags_problem(unknown, beam_flags)
        + ". Flags other than this command's own must be Apache Beam pipeline options "
        "(--runner, --project, --temp_location, ...)."
    )


def check_beam_args(beam_args: list[str], parser: CommandParser) -> None:
    """Refuses (exit 2) the flags beam_args_problem finds wrong."""
    problem = beam_args_problem(beam_args, parser)
    if problem:
        parser.refuse(problem)


def parse_args(
    argv, check_beam_flags: bool = True, parser: CommandParser | None = None
) -> tuple[Stage1Config, list[str]]:
    """(the Stage1Config of the command line, the rest for Beam's PipelineOptions); a mistake exits 2.
    `check_beam_flags`: also refuse a flag Beam does not know (imports Beam's options). `parser`: build_parser()'s,
    for a caller that refuses more with it (the command: launch/command.py)."""
    parser = parser or build_parser()
    args, beam_args = parser.parse_known_args(argv)
    mixed_up = parser.mixed_up_flags_problem(beam_args)  # ours for certain: said before Beam is imported
    if mixed_up:
        parser.refuse(mixed_up)
    config = Stage1Config(**vars(args))
    for problem in config.problems():
        parser.refuse(problem)
    if check_beam_flags:
        check_beam_args(beam_args, parser)
    return config, beam_args
