#!/usr/bin/env bash
# The JAX leg of the tests: the trainer's tests marked `jax` (`pytest tests/train -m jax`: resume mid-epoch,
# SIGTERM, EMA, mixed precision, the export, a multi-process run), again, in a process of their own on
# Keras' JAX backend, over two host devices (what DataParallel spreads a batch over on a TPU host's chips).
# The whole of tests/train is not run twice: it is most of the main suite's time.
#
# Run by scripts/test.sh after the main suite, or alone: `bash scripts/test_jax.sh [pytest args]` (in
# .venv, whose requirements.txt holds jax). SKIP_JAX=1 skips this leg (CI never sets it).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${SKIP_JAX:-}" = 1 ]; then
  echo "SKIP_JAX=1: the JAX leg (train tests on Keras' JAX backend) did not run" >&2
  exit 0
fi
python="${PYTHON_JAX:-python}"
if ! "$python" -c 'import jax' >/dev/null 2>&1; then
  echo "error: the JAX leg needs jax in $("$python" -c 'import sys; print(sys.prefix)'): pip install -r requirements.txt -c constraints.txt" >&2
  exit 2
fi
cd "$repo"
# No accelerator and no metadata server: JAX on two CPU devices, TensorFlow never loads libtpu.
export KERAS_BACKEND=jax JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=2
export TPU_LOAD_LIBRARY=0 NO_GCE_CHECK=true
exec "$python" -m pytest tests/train -m jax "$@"
