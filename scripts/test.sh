#!/usr/bin/env bash
# Sets up .venv (if needed), lints, and runs the whole test suite, slow tests included; then the Python 3.10
# leg (scripts/test_py310.sh): the train tests and the `[tpu]` install-and-train test on Python 3.10, the
# Python of Cloud TPU VMs; between them the JAX leg (scripts/test_jax.sh): the trainer's tests marked `jax`
# again on Keras' JAX backend. Extra arguments go to the main suite's pytest, e.g.
# `bash scripts/test.sh -m "not slow"`; SKIP_PY310=1 skips the 3.10 leg, SKIP_JAX=1 the JAX leg.
# The main suite runs in TEST_WORKERS (default 2) pytest-xdist worker processes, a test file to a worker
# (`--dist loadfile`: a file's module fixtures are built once); TEST_WORKERS=0 runs it in this process.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
# The HTML report's test (tests/preprocess/inspect/test_report.py) opens the page in a real headless Chromium:
# Debian's package, installed here when missing (CI runs this script as root on a fresh Debian 12).
if [ ! -x /usr/bin/chromium ] && [ -z "${CHROMIUM:-}" ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
  else
    echo "error: the tests need Chromium (/usr/bin/chromium). Install it as root:" >&2
    echo "  apt-get update && apt-get install -y --no-install-recommends chromium" >&2
    echo "  (or set CHROMIUM=/path/to/chromium)" >&2
    exit 2
  fi
fi
ruff check .
ruff format --check .
status=0
# Two workers on two cores: most tests spend much of their time waiting on the processes they start
# (figures: docs/development.md).
python -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile "$@" || status=$?
jax_status=0
bash scripts/test_jax.sh -v --durations=15 || jax_status=$?
py310_status=0
bash scripts/test_py310.sh -v --durations=15 || py310_status=$?
if [ "$status" != 0 ] || [ "$jax_status" != 0 ] || [ "$py310_status" != 0 ]; then
  echo "failed: main suite exit status $status, JAX leg exit status $jax_status, Python 3.10 leg exit status $py310_status" >&2
  exit 1
fi
