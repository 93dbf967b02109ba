"""A worker process that lists, hashes and deduplicates files does not load TensorFlow.

Dataflow runs one SDK process per vCPU; TensorFlow and tf.Transform cost
each ~530 MB more (benchmarks/worker_memory.py). The stages are those of the
real pipeline, fused as the local runner fuses them, and loaded in a fresh
process the way Beam's bundle processor loads them.
"""

import pytest

from benchmarks.worker_memory import HEAVY_MODULES, LISTING_AND_DEDUP, OTHER_STAGES, measure_worker
from tests.cli_probe import run_fresh_python


@pytest.mark.slow  # builds and fuses the whole pipeline, and a worker-like process imports TensorFlow
def test_listing_hashing_and_dedup_stages_load_in_a_worker_without_tensorflow():
    harness, lean, other = measure_worker("uint8", (LISTING_AND_DEDUP, OTHER_STAGES))
    assert lean["after"] == LISTING_AND_DEDUP
    assert lean["heavy_modules"] == [], lean["steps_that_loaded_them"]
    # The loader does load code: the decoding, encoding and analysis stages bring TensorFlow in.
    assert "tensorflow" in other["heavy_modules"]


def test_importing_the_pipeline_module_loads_neither_tensorflow_nor_tf_transform():
    # Any function of these modules that a worker unpickles imports its module.
    script = (
        "import sys\n"
        "import preprocess.pipeline, preprocess.write.encode, preprocess.transform, preprocess.write.transform_output\n"
        f"print(sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules))\n"
    )
    result = run_fresh_python(script)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
