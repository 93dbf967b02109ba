"""`python -m pipelines.local|dataflow --help` answers before TensorFlow or Beam is imported."""

import pytest

from tests.cli_probe import probe_module

HEAVY = ("tensorflow", "apache_beam", "tensorflow_transform", "keras")


@pytest.mark.parametrize(
    "module, flag", [("pipelines.local", "--skip-preprocess"), ("pipelines.dataflow", "--region")]
)
def test_help_prints_before_tensorflow_or_beam_is_imported(tmp_path, module, flag):
    result = probe_module(module, ["--help"], HEAVY, tmp_path)
    assert "EXIT 0 HEAVY []" in result.stderr, result.stderr[-2000:]
    assert flag in result.stdout


def test_the_local_workflow_hands_verbose_to_stage_1_and_is_quiet_without_it():
    from pipelines import local

    verbose = local.build_parser().parse_args(["--workdir", "w", "--verbose"])
    assert "--verbose" in local.preprocess_argv(verbose, "images", "dataset")
    quiet = local.build_parser().parse_args(["--workdir", "w"])
    assert "--verbose" not in local.preprocess_argv(quiet, "images", "dataset")
