#!/usr/bin/env bash
# Creates .venv in the repository (once) and installs the pinned dependencies
# and the project itself into it. Sourced by demo.sh and test.sh.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv"
python="${PYTHON:-python3}"
# The quick start's pins (requirements.txt + constraints.txt) are the environment CI runs on Python 3.11.
# They cannot install on 3.10: tf.Transform 1.21's tensorflow-metadata caps protobuf at 6.32 there, and
# Beam 2.77's Google Cloud clients need protobuf 6.33.5 (and matplotlib 3.11 and Keras 3.15 need 3.11).
# On 3.12 they resolve, but no CI leg runs them there.
if ! version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)"; then
  echo "error: cannot run $python. Set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
case "$version" in
  3.11) ;;
  3.12) echo "note: the quick start's pins are tested on Python 3.11 (CI); they resolve on 3.12, which no CI leg runs" >&2 ;;
  3.10)
    echo "error: the quick start needs Python 3.11: Beam 2.77 and tf.Transform 1.21 cannot install together on 3.10 ($python is 3.10)." >&2
    echo "  Set PYTHON=/path/to/python3.11 (e.g. \`pyenv install 3.11\`). Training alone runs on 3.10 (a Cloud TPU VM's Python): pip install '.[tpu]' or '.[train]'" >&2
    exit 2
    ;;
  *)
    echo "error: the quick start needs Python 3.11; $python is $version. Set PYTHON=/path/to/python3.11" >&2
    exit 2
    ;;
esac
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
