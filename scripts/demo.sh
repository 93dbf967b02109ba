#!/usr/bin/env bash
# Sets up .venv (if needed) and runs the whole local workflow on the embedded
# sample corpus: generate it, preprocess it (Beam DirectRunner), train the small
# CNN, export it, and predict one original image with the export.
# Extra arguments go to `python -m pipelines.local`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
# Each demo trains a new model: one left by an earlier demo is pinned to that
# demo's dataset run, and the workflow refuses to resume it on a new one.
rm -rf demo-output/model
python -m pipelines.local --workdir demo-output "$@"
