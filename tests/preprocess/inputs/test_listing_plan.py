"""A large GCS folder's listing ranges hold similar numbers of names, whatever the names look like.

The folders here hold hundreds of thousands of names, more than the emulator can be given in a test's
time (tests/preprocess/inputs/test_inputs.py lists a real, smaller one through it). So GCS's listing is stood
in for by a sorted list with GCS's paging semantics (`startOffset`, `endOffset`, `maxResults`, a next
page token), reached where the code asks GCS (`inputs._list_gcs_level`); the planning and the ranges
are the real ones, and each range's names are counted.
"""

import bisect
import types

import pytest

from benchmarks.listing_balance import Concatenated, Numbered, hashed_names
from preprocess.inputs import listing as inputs

FOLDER = "gs://bucket/raw/cat"
PREFIX = "raw/cat/"


SKEWED = {
    # A few odd names, then the bulk under one long prefix: the old planning left it in one range.
    "odd names, then a bulk prefix": Concatenated(
        hashed_names(20), Numbered("photos_2024_07_batch_%07d.jpg", 300_000)
    ),
    "a small bulk, then a large one": Concatenated(
        Numbered("a_%05d.jpg", 10_000), Numbered("b_%07d.jpg", 300_000)
    ),
    "hashed names": hashed_names(100_000, length=32),
    "numbers without padding": sorted(f"{i}.jpg" for i in range(150_000)),
}


class FakeListing:
    """What `storage.Client.list_blobs` returns, over a sorted sequence of names below PREFIX."""

    def __init__(self, names, start_offset, end_offset, page_size, requests):
        relative_start = (start_offset or PREFIX)[len(PREFIX) :]
        self._first = bisect.bisect_left(names, relative_start)
        self._end = len(names) if end_offset is None else bisect.bisect_left(names, end_offset[len(PREFIX) :])
        self._names, self._page_size = names, page_size or 1000
        self._requests = requests
        self.prefixes = set()
        self.next_page_token = None

    def _blob(self, index):
        return types.SimpleNamespace(name=PREFIX + self._names[index], size=1, md5_hash=None)

    @property
    def pages(self):
        start = self._first
        while start < self._end:
            self._requests.append(start)
            stop = min(self._end, start + self._page_size)
            self.next_page_token = "next" if stop < self._end else None
            yield [self._blob(index) for index in range(start, stop)]
            start = stop

    def __iter__(self):
        for page in self.pages:
            yield from page


@pytest.fixture
def fake_gcs(monkeypatch):
    state = types.SimpleNamespace(names=[], requests=[])

    def list_level(folder, start=None, end=None, page_size=None):
        assert folder == FOLDER
        listing = FakeListing(
            state.names,
            PREFIX + start if start else None,
            PREFIX + end if end else None,
            page_size,
            state.requests,
        )
        return listing, PREFIX, "bucket"

    monkeypatch.setattr(inputs, "_list_gcs_level", list_level)
    return state


def _names_per_range(names, ranges):
    assert ranges[0].start is None and ranges[-1].end is None
    assert all(before.end == after.start for before, after in zip(ranges, ranges[1:], strict=False))
    edges = [0, *(bisect.bisect_left(names, r.start) for r in ranges[1:]), len(names)]
    return [end - start for start, end in zip(edges, edges[1:], strict=False)]


@pytest.mark.parametrize("pattern", sorted(SKEWED))
def test_each_range_holds_at_most_twice_the_ideal_on_skewed_names(fake_gcs, pattern):
    names = SKEWED[pattern]
    fake_gcs.names = names
    ranges = list(inputs.plan_listing_ranges(("cat", FOLDER)))
    counts = _names_per_range(names, ranges)
    ideal = len(names) / len(ranges)
    assert sum(counts) == len(names)
    assert inputs.GCS_LISTING_RANGES // 2 <= len(ranges) <= 2 * inputs.GCS_LISTING_RANGES
    assert max(counts) <= 2 * ideal, (
        f"{pattern}: the largest range holds {max(counts) / ideal:.1f}x the ideal"
    )
    # The planning is a few hundred pages, not a listing of the folder (300 pages here).
    assert len(fake_gcs.requests) <= 1000


def test_a_folder_under_the_threshold_is_one_range(fake_gcs):
    fake_gcs.names = Numbered("img_%05d.jpg", 3000)
    assert list(inputs.plan_listing_ranges(("cat", FOLDER))) == [inputs.ListingRange("cat", FOLDER)]
    assert len(fake_gcs.requests) <= inputs.SPLIT_LISTING_ABOVE // 1000 + 1  # pages up to the threshold
