"""`python -m pipelines.local|dataflow --help` answers before TensorFlow or Beam is imported."""

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs `python -m MODULE --help` as `python -m` does, then reports which heavy modules were imported.
PROBE = textwrap.dedent(
    """
    import runpy, sys
    module = sys.argv[1]
    sys.argv = [module, "--help"]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    heavy = sorted(m for m in ("tensorflow", "apache_beam", "tensorflow_transform", "keras") if m in sys.modules)
    print(f"EXIT {code} HEAVY {heavy}", file=sys.stderr)
    """
)


@pytest.mark.parametrize(
    "module, flag", [("pipelines.local", "--skip-preprocess"), ("pipelines.dataflow", "--region")]
)
def test_help_prints_before_tensorflow_or_beam_is_imported(tmp_path, module, flag):
    env = {**os.environ, "PYTHONPATH": REPO}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "EXIT 0 HEAVY []" in result.stderr, result.stderr[-2000:]
    assert flag in result.stdout
