"""benchmarks/near_duplicate_grouping_memory.py runs end to end at a tiny size (no figure is asserted:
benchmarks/RESULTS.md holds the full-size ones)."""

import pytest

from benchmarks import near_duplicate_grouping_memory


def test_the_synthetic_corpus_plants_groups_and_a_hot_band():
    images = list(near_duplicate_grouping_memory.synthetic_images(0, 1000))
    assert len(images) == 1000 == len({image.key for image in images})
    counts = {}
    for image in images:
        counts[image.signature] = counts.get(image.signature, 0) + 1
    assert (
        max(counts.values()) > 10
    )  # the near-blank band: many exact copies of one signature among its variants
    assert images == list(near_duplicate_grouping_memory.synthetic_images(0, 1000))  # deterministic


@pytest.mark.slow
def test_near_duplicate_grouping_memory_runs_at_tiny_size(capsys):
    report = near_duplicate_grouping_memory.main(["--tiny"])
    assert [run["images"] for run in report["runs"]] == [300, 600]
    for run in report["runs"]:
        assert run["peak_rss_sdk_worker_bytes"] > 0
        assert run["stats"]["groups"] > 0 and run["stats"]["members"] == run["stats"]["images_in_groups"]
    assert "2x / 1x" in capsys.readouterr().out
