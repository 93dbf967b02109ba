"""`python -m preprocess`: --help and a wrong flag are answered before TensorFlow or Beam is imported."""

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs `python -m preprocess ARGS` as `python -m` does, then reports which heavy modules were imported.
PROBE = textwrap.dedent(
    """
    import runpy, sys
    sys.argv = ["preprocess", *sys.argv[1:]]
    try:
        runpy.run_module("preprocess", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    heavy = sorted(m for m in ("tensorflow", "apache_beam", "tensorflow_transform") if m in sys.modules)
    print(f"EXIT {code} HEAVY {heavy}", file=sys.stderr)
    """
)


def _probe(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help_prints_before_tensorflow_or_beam_is_imported(tmp_path):
    result = _probe(tmp_path, "--help")
    assert "EXIT 0 HEAVY []" in result.stderr, result.stderr[-2000:]
    assert "--in-process-below" in result.stdout and "--encoding" in result.stdout


def test_a_wrong_flag_is_refused_before_tensorflow_or_beam_is_imported(tmp_path):
    result = _probe(tmp_path, "--input", "x", "--output", "y", "--jpeg-quality", "0")
    assert "--jpeg-quality 0: expected 1..100" in result.stderr
    assert "HEAVY []" in result.stderr and "EXIT 0" not in result.stderr, result.stderr[-2000:]
