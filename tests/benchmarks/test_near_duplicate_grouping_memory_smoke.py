"""benchmarks/near_duplicate_grouping_memory.py runs end to end at a tiny size (no figure is asserted:
benchmarks/RESULTS.md holds the full-size ones)."""

import pytest

from benchmarks import near_duplicate_grouping_memory
from preprocess.near_duplicates import signature as signature_lib


def test_the_synthetic_corpus_plants_groups_and_a_hot_band():
    images = list(near_duplicate_grouping_memory.synthetic_images(0, 1000))
    assert len(images) == 1000 == len({image.key for image in images})
    counts = {}
    for image in images:
        # The grey hash (the signature's low 64 bits; the mirrored hash above it is random per image).
        grey = signature_lib.grey_hash(image.signature)
        counts[grey] = counts.get(grey, 0) + 1
    assert (
        max(counts.values()) > 10
    )  # the near-blank band: many exact copies of one signature among its variants
    assert images == list(near_duplicate_grouping_memory.synthetic_images(0, 1000))  # deterministic


@pytest.mark.slow
def test_near_duplicate_grouping_memory_runs_at_tiny_size(capsys):
    report = near_duplicate_grouping_memory.main(["--tiny"])
    runs = report["runs"]
    assert [(run["images"], run["contender"]) for run in runs] == [
        (300, "grouping"),
        (300, "bare shuffle"),
        (600, "grouping"),
        (600, "bare shuffle"),
    ]
    assert all(run["peak_rss_sdk_worker_bytes"] > 0 for run in runs)
    for run in runs:
        if run["contender"] == "grouping":
            assert run["stats"]["groups"] > 0 and run["stats"]["members"] == run["stats"]["images_in_groups"]
    assert "2x / 1x" in capsys.readouterr().out
