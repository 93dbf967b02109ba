"""What the grouping's two quadratic steps hold (preprocess/near_duplicates/grouping.py), measured with tracemalloc.

A bucket's verified pairs go into its union-find one at a time, and a component's grey prefilter is taken a
few rows at a time: a worker holds O(entries) for a bucket, not O(pairs), and O(n^2) int16 for a component,
not n x n uint64 temporaries (benchmarks/RESULTS.md, row 14). Plain calls, no Beam: these are per-element.
"""

import hashlib
import random

import numpy as np

from preprocess.near_duplicates.grouping import VerifyBucketFn, _near_matrix, signature_bytes
from preprocess.near_duplicates.signature import DEFAULT_MAX_DISTANCE, near
from tests.python_heap import peak_heap_bytes

BITS = 64


def _signature(grey: int) -> int:
    """A signature of grey hash `grey` alone (colour layout and thumbnail zero: they agree with any other's),
    its mirrored hash far from any other's."""
    mirror = int.from_bytes(hashlib.sha256(grey.to_bytes(8, "little")).digest()[:8], "little")
    return grey | mirror << BITS


def test_a_bucket_of_near_entries_is_joined_without_a_list_of_its_pairs():
    # 400 images of one grey hash: 79,800 verified pairs. A list of them peaked at 5.0 MiB; now 0.1.
    signature = _signature(random.Random(0).getrandbits(BITS))
    points = [(hashlib.sha256(str(index).encode()).hexdigest(), signature) for index in range(400)]
    verify = VerifyBucketFn(DEFAULT_MAX_DISTANCE, max_bucket_size=2000)
    verify.start_bundle()
    entries = [(key, signature_bytes(value)) for key, value in points]  # as the Bands step sends them

    outputs, peak = peak_heap_bytes(lambda: list(verify.process((0, entries))))

    edges = [output for output in outputs if isinstance(output, tuple)]
    smallest = min(key for key, _ in points)
    assert sorted(edges) == sorted((key, smallest) for key, _ in points if key != smallest)
    assert peak < 1 << 20, f"{peak / 2**20:.1f} MiB held for a bucket of 400 entries"


def test_a_components_near_matrix_is_prefiltered_a_few_rows_at_a_time():
    # 1,200 signatures: the prefilter's n x n uint64 temporaries (11 MB each) peaked at 13.8 MiB; now 6.3,
    # of which the int16 result is 2.7.
    rng = random.Random(1)
    greys = [rng.getrandbits(BITS) for _ in range(1000)]
    greys += [grey ^ 1 << rng.randrange(BITS) for grey in greys[:200]]  # 200 near pairs
    signatures = [_signature(grey) for grey in greys]

    matrix, peak = peak_heap_bytes(lambda: _near_matrix(signatures, DEFAULT_MAX_DISTANCE))

    count = len(signatures)
    assert peak < matrix.nbytes + (5 << 20), f"{peak / 2**20:.1f} MiB for a {count} x {count} int16 result"
    assert matrix.dtype == np.int16
    # The same answer as `near`: the planted pairs near, at their distance; random pairs not (none of 64 random
    # bits is within the distance of another).
    for index in range(200):
        found = near(signatures[index], signatures[1000 + index], DEFAULT_MAX_DISTANCE)
        assert matrix[index, 1000 + index] == matrix[1000 + index, index] == found
    assert (matrix >= 0).sum() == count + 2 * 200
