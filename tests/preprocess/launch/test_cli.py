"""`python -m preprocess`: --help and a wrong flag are answered before TensorFlow or Beam is imported; a job ends without the interpreter's teardown."""

import os
import subprocess
import sys

import pytest

from preprocess import options
from preprocess.launch import command
from tests.cli_probe import REPO, probe_module

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


def test_the_command_builds_its_parser_once_and_refuses_a_missing_input_with_it(
    tmp_path, monkeypatch, capsys
):
    built = []
    build_parser = options.build_parser
    monkeypatch.setattr(options, "build_parser", lambda: built.append(build_parser()) or built[-1])
    with pytest.raises(SystemExit) as stopped:
        command.main(["--input", str(tmp_path / "missing"), "--output", str(tmp_path / "out")])
    assert stopped.value.code == 2
    assert len(built) == 1
    assert "preprocess: error:" in capsys.readouterr().err


def test_the_end_of_a_job_skips_only_the_teardown_exit_handlers_still_run_and_output_is_flushed(tmp_path):
    script = (
        "import atexit, logging, sys\n"
        "atexit.register(lambda: print('exit handler ran'))\n"
        "logging.basicConfig(stream=sys.stderr)\n"
        "logging.warning('logged')\n"
        "print('summary', end='')  # buffered: stdout is a pipe\n"
        "from preprocess.launch.process_exit import exit_without_teardown\n"
        "exit_without_teardown(0)\n"
        "print('never printed')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert result.stdout == "summaryexit handler ran\n"
    assert "logged" in result.stderr


def test_a_wrong_near_duplicates_mode_or_distance_is_refused_with_exit_2(tmp_path):
    for flags, said in (
        (("--near-duplicates", "maybe"), "--near-duplicates: invalid choice: 'maybe'"),
        (("--near-duplicate-distance", "-1"), "--near-duplicate-distance: expected a whole number >= 0"),
        (
            ("--near-duplicate-distance", "ten"),
            "--near-duplicate-distance: expected a whole number, got 'ten'",
        ),
        (
            ("--near-duplicate-distance", "17"),
            "--near-duplicate-distance: expected at most 16 (of the 64 grey bits",
        ),
        (
            ("--near-duplicate-max-group", "1"),
            "--near-duplicate-max-group: expected at least 2 (a group has two images or more), got 1",
        ),
        (
            ("--near-duplicate-max-moved", "5"),
            "--near-duplicate-max-moved: expected a fraction between 0 and 1, got 5",
        ),
    ):
        result = _probe(tmp_path, "--input", "x", "--output", "y", *flags)
        assert said in result.stderr, result.stderr[-2000:]
        assert "EXIT 2 HEAVY []" in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
