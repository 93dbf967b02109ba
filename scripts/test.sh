#!/usr/bin/env bash
# Sets up .venv (if needed), lints, and runs the whole test suite, slow tests included.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
ruff check .
ruff format --check .
python -m pytest "$@"
