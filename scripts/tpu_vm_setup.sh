#!/usr/bin/env bash
# The on-VM mode's setup, on a single-host Cloud TPU VM, before `python -m pipelines.dataflow ... --tpu local`.
# That command is stage 1's launcher (this package's [all] extra: Beam, tf.Transform), which needs Python
# 3.11, and Cloud TPU VM images (Ubuntu 22.04) ship 3.10; training then gets a venv of its own
# (~/tf-image-pipeline/tpu-venv, the [tpu] extra, pipelines/tpu/interpreter.py), made with venv's ensurepip,
# which Debian and Ubuntu ship apart (python3.11-venv). This script brings both, then makes the launcher's
# venv with '.[all]' from this checkout (or from the sdist given):
#
#     bash scripts/tpu_vm_setup.sh [SDIST]
#
# Python 3.11: $PYTHON311, else python3.11 on PATH, else `apt-get install python3.11 python3.11-venv`
# (as root or with passwordless sudo: what a TPU VM's ssh user has), else a uv-managed CPython 3.11 (uv from
# the registry into the user's site with the image's python3, then `uv python install 3.11`, which downloads
# python-build-standalone). Where none of that can be done it stops, exit 2, with the commands to run. The
# venv: $LAUNCHER_VENV (default ~/tf-image-pipeline/launcher-venv). uv goes into it too: `--backend jax`
# trains in a venv on a uv-managed Python 3.11 (~/tf-image-pipeline/jax-venv, the [tpu-jax] extra), which
# the launcher makes with it (pipelines/tpu/interpreter.py).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source_spec="${1:-$repo}"
venv="${LAUNCHER_VENV:-$HOME/tf-image-pipeline/launcher-venv}"
# train/install_lines.py's UV_VERSION: the uv the launch installs on the VMs.
uv_version="$(sed -n 's/^UV_VERSION = "\(.*\)"$/\1/p' "$repo/train/install_lines.py")"
get_python="sudo apt-get install python3.11 python3.11-venv (Ubuntu 22.04: the universe component; or \`pyenv install 3.11\`), then run this again, or with PYTHON311=/path/to/python3.11"

refuse() {
  echo "error: $*" >&2
  exit 2
}

# apt-get as root, or through passwordless sudo; fails when neither is possible.
apt_get() {
  command -v apt-get >/dev/null 2>&1 || return 1
  if [ "$(id -u)" = 0 ]; then
    apt-get "$@"
  elif sudo -n true 2>/dev/null; then
    sudo apt-get "$@"
  else
    return 1
  fi
}

apt_install() {
  echo "installing $* with apt-get"
  apt_get update -q >/dev/null && apt_get install -y -q "$@"
}

# A uv-managed CPython 3.11 (it has ensurepip): uv from the registry with the image's python3, then uv's own
# interpreter download. Prints the interpreter's path; fails where pip or the download cannot be reached.
uv_python() {
  command -v python3 >/dev/null 2>&1 || return 1
  echo "installing uv==$uv_version and a uv-managed Python 3.11" >&2
  python3 -m pip install --quiet --user "uv==$uv_version" >&2 \
    && python3 -m uv python install 3.11 >&2 \
    && python3 -m uv python find --managed-python 3.11
}

python="${PYTHON311:-}"
if [ -z "$python" ]; then
  if command -v python3.11 >/dev/null 2>&1; then
    python="$(command -v python3.11)"
  elif apt_install python3.11 python3.11-venv && command -v python3.11 >/dev/null 2>&1; then
    python="$(command -v python3.11)"
  elif python="$(uv_python)" && [ -n "$python" ]; then
    echo "using the uv-managed $python"
  else
    refuse "the on-VM launcher needs Python 3.11 (this package's [all] extra: Beam and tf.Transform), and this VM has none (Cloud TPU VM images ship 3.10); neither apt-get nor uv (python3 -m pip install --user uv==$uv_version && python3 -m uv python install 3.11) could install it here. Run: $get_python"
  fi
fi
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
  refuse "$python is not Python 3.11, which the on-VM launcher needs (this package's [all] extra). Run: $get_python"
fi
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  apt_install python3.11-venv || true
  "$python" -c 'import ensurepip, venv' 2>/dev/null \
    || refuse "$python cannot make a venv (no ensurepip: Debian and Ubuntu ship it apart). Run: sudo apt-get install python3.11-venv, then this again"
fi

echo "making $venv with $python and installing ${source_spec}[all] and uv==$uv_version (a few minutes)"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet "${source_spec}[all]" "uv==$uv_version"
echo "The on-VM launcher is ready. Run: source $venv/bin/activate && python -m pipelines.dataflow ... --tpu local --accelerator-type TYPE"
