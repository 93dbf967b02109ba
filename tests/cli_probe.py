"""Runs a command (`python -m MODULE ARGS`) in a fresh interpreter and reports which heavy modules it imported.

The report is the last line of stderr: `EXIT <exit status> HEAVY [<imported heavy modules>]`, so a test can
check that --help or a flag error is answered before TensorFlow or Beam is imported. `run_fresh_python`
runs a test's own script the same way, for what it imports.
"""

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# argv: MODULE HEAVY,MODULES ARGS...; runs MODULE as `python -m` does.
_PROBE = textwrap.dedent(
    """
    import runpy, sys
    module, heavy_names, args = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
    sys.argv = [module, *args]
    code = None
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    heavy = sorted(m for m in heavy_names if m in sys.modules)
    print(f"EXIT {code} HEAVY {heavy}", file=sys.stderr)
    """
)


def probe_module(module: str, args, heavy, cwd) -> subprocess.CompletedProcess:
    """`python -m module *args` in a fresh interpreter, reporting which of `heavy` it imported."""
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run(
        [sys.executable, "-c", _PROBE, module, ",".join(heavy), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_fresh_python(script: str) -> subprocess.CompletedProcess:
    """`python -c script` in a fresh interpreter (nothing imported yet), from `/` with the repo on the path."""
    return subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": REPO, "TPU_LOAD_LIBRARY": "0"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
