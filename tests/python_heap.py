"""The peak of Python's allocations (tracemalloc: Python objects and numpy arrays) while one call runs, for
tests that bound what a step holds in memory."""

import tracemalloc


def peak_heap_bytes(call):
    """(call's result, the most memory Python and numpy held above the start while it ran)."""
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak - start
