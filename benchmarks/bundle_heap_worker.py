"""The local SDK worker (preprocess/launch/local_worker.py) under tracemalloc, for the memory benchmarks.

Appends one JSON line per bundle to BUNDLE_HEAP_DIR/bundles-<pid>.jsonl: the bundle's transforms, the Python
heap (Python objects and numpy arrays; not gRPC's or the allocator's native memory) at its start, its peak
over that start and what it left behind. Bundles are run one at a time (this runner sends one per worker).
tracemalloc slows the worker 2-4x and its RSS is then not the figure to report: only the heap is.
"""

import json
import os
import threading
import time
import tracemalloc

DIR_ENV_VAR = "BUNDLE_HEAP_DIR"

tracemalloc.start(1)

from apache_beam.runners.worker import sdk_worker  # noqa: E402

from preprocess.launch import local_worker  # noqa: E402

_one_bundle_at_a_time = threading.Lock()
_process_bundle = sdk_worker.SdkWorker.process_bundle


def _transforms(worker, request) -> list[str]:
    """The bundle's transforms by their first name under the pipeline's root (its steps' labels)."""
    descriptor = worker.bundle_processor_cache.fns[request.process_bundle_descriptor_id]
    names = {
        transform.unique_name.split("/")[min(1, transform.unique_name.count("/"))]
        for transform in descriptor.transforms.values()
    }
    return sorted(name for name in names if name and not name.startswith("ref_"))


def _traced_process_bundle(self, request, instruction_id):
    with _one_bundle_at_a_time:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        began = time.monotonic()
        response = _process_bundle(self, request, instruction_id)
        end, peak = tracemalloc.get_traced_memory()
    line = {
        "transforms": _transforms(self, request),
        "heap_at_start": start,
        "peak_over_start": peak - start,
        "left": end - start,
        "seconds": round(time.monotonic() - began, 3),
    }
    with open(os.path.join(os.environ[DIR_ENV_VAR], f"bundles-{os.getpid()}.jsonl"), "a") as handle:
        handle.write(json.dumps(line) + "\n")
    return response


sdk_worker.SdkWorker.process_bundle = _traced_process_bundle

if __name__ == "__main__":
    local_worker.main()
