"""`python -m preprocess`: --help and a wrong flag are answered before TensorFlow or Beam is imported."""

from tests.cli_probe import probe_module

HEAVY = ("tensorflow", "apache_beam", "tensorflow_transform")


def _probe(tmp_path, *args):
    return probe_module("preprocess", args, HEAVY, tmp_path)


def test_help_prints_before_tensorflow_or_beam_is_imported(tmp_path):
    result = _probe(tmp_path, "--help")
    assert "EXIT 0 HEAVY []" in result.stderr, result.stderr[-2000:]
    assert "--in-process-below" in result.stdout and "--encoding" in result.stdout


def test_a_wrong_flag_is_refused_before_tensorflow_or_beam_is_imported(tmp_path):
    result = _probe(tmp_path, "--input", "x", "--output", "y", "--jpeg-quality", "0")
    assert "--jpeg-quality 0: expected 1..100" in result.stderr
    assert "HEAVY []" in result.stderr and "EXIT 0" not in result.stderr, result.stderr[-2000:]
