#!/usr/bin/env bash
# The Python 3.10 leg of the tests: Cloud TPU VM images (Ubuntu 22.04) and Ubuntu 22.04 GPU hosts train on
# Python 3.10, where pip resolves other Keras and NumPy releases than on 3.11. Creates .venv-py310 (once)
# with stage 2 alone (the `[train]` extra, requirements-py310.txt, pinned by constraints-py310.txt) and runs
# the subset of tests/train marked `py310` with it (`-m py310`; the whole of tests/train again would add
# too much to CI's time): the `[tpu]` install-and-train test (tests/train/test_install.py), which builds
# its venv from this interpreter, `python -m train --help`, the dataset pin (datetime.UTC crashed it on
# 3.10), training to an export, and what drives Keras' own hooks (freeze, resume with EMA, the recipe,
# the optimizer, the strategy, the multi-step loop), and the supervisor (a TPU VM's python3). Stage 1's
# stack does not install on 3.10, so the datasets these tests read are written by stage 1 in the quick
# start's .venv (STAGE1_PYTHON, tests/stage1.py).
#
# Run by scripts/test.sh after the main suite, or alone: `bash scripts/test_py310.sh [pytest args]`
# (after scripts/bootstrap.sh has made .venv). Finds Python 3.10 in $PYTHON310, on PATH as python3.10, or
# in pyenv's versions; SKIP_PY310=1 skips this leg (CI never sets it).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv-py310"

if [ "${SKIP_PY310:-}" = 1 ]; then
  echo "SKIP_PY310=1: the Python 3.10 leg (train tests, [tpu] install) did not run" >&2
  exit 0
fi

is_python310() {
  "$1" -c 'import sys, venv; sys.exit(0 if sys.version_info[:2] == (3, 10) else 1)' >/dev/null 2>&1
}

find_python310() {
  local candidate
  # pyenv's `python3.10` shim fails unless a 3.10 is selected, hence the versions folder after it.
  for candidate in "${PYTHON310:-}" python3.10 "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.10*/bin/python3.10 /usr/bin/python3.10; do
    if [ -n "$candidate" ] && is_python310 "$candidate"; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

if ! python310="$(find_python310)"; then
  cat >&2 <<'EOF'
error: the Python 3.10 leg of the tests needs a Python 3.10 with its venv module (Cloud TPU VMs train on 3.10).
  Get one: `pyenv install 3.10.13`, or on Ubuntu 22.04 `apt-get install python3.10 python3.10-venv`;
  or point PYTHON310=/path/to/python3.10 at one. To skip this leg: SKIP_PY310=1 bash scripts/test.sh
EOF
  exit 2
fi
stage1_python="$repo/.venv/bin/python"
if [ ! -x "$stage1_python" ]; then
  echo "error: $stage1_python is missing: run scripts/bootstrap.sh (or scripts/test.sh) first; it writes this leg's datasets" >&2
  exit 2
fi

stamp="$venv/.installed-$(cat "$repo/requirements-py310.txt" "$repo/constraints-py310.txt" "$repo/setup.py" "$repo/train/install_lines.py" | cksum | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
  echo "Setting up $venv with $python310 (first run: a few minutes)..."
  started=$SECONDS
  [ -x "$venv/bin/python" ] || "$python310" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r "$repo/requirements-py310.txt" -c "$repo/constraints-py310.txt" -e "$repo[train]"
  rm -f "$venv"/.installed-*
  touch "$stamp"
  echo "$venv set up in $((SECONDS - started)) s"
fi

cd "$repo"
echo "Python 3.10 leg: $("$venv/bin/python" --version) runs tests/train -m py310 (stage 1 datasets from $stage1_python)"
started=$SECONDS
status=0
# A -m among the arguments replaces this one (pytest keeps the last).
STAGE1_PYTHON="$stage1_python" "$venv/bin/python" -m pytest tests/train -m py310 "$@" || status=$?
echo "Python 3.10 leg: $((SECONDS - started)) s, pytest exit status $status"
exit "$status"
