#!/usr/bin/env bash
# Creates .venv in the repository (once) and installs the pinned dependencies
# and the project itself into it. Sourced by demo.sh and test.sh.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 12) else 1)'; then
  echo "error: needs Python 3.10-3.12 (tested on 3.11); found $("$python" --version 2>&1). Set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
stamp="$venv/.installed-$(cat "$repo/requirements.txt" "$repo/constraints.txt" "$repo/setup.py" | cksum | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
  echo "Setting up $venv (first run: several minutes)..."
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r "$repo/requirements.txt" -c "$repo/constraints.txt"
  "$venv/bin/python" -m pip install --quiet --no-deps -e "$repo"
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
cd "$repo"
