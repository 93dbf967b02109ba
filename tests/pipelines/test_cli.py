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
