"""benchmarks/near_duplicate_quality.py runs at a tiny size: every kind is scored, the threshold is chosen on
the tuning half, the held-out half goes through FindNearDuplicateGroups, and the sample shape corpus's
distinct images and scikit-learn's digits are checked for false pairs. No figure is asserted beyond
what a tiny corpus must give: the full-size ones are in benchmarks/RESULTS.md."""

import pytest

from benchmarks import near_duplicate_quality


@pytest.mark.slow
def test_near_duplicate_quality_runs_at_tiny_size(capsys):
    report = near_duplicate_quality.main(["--tiny"])
    kinds = {*near_duplicate_quality.ALL_KINDS, "all", "posted"}
    assert set(report["held_out"]) == set(report["tuning"]) == kinds
    assert report["distinct_images"]["tuning"] > 0 and report["distinct_images"]["held-out"] > 0
    # Each held-out original has one planted copy per kind.
    assert all(
        report["held_out"][kind]["planted"] == report["distinct_images"]["held-out"]
        for kind in kinds - {"all", "posted"}
    )
    assert report["chosen_threshold"] is not None and report["signature_over_load"] > 0
    assert set(report["grouping"]) == kinds | {"stats"}
    assert report["grouping"]["stats"]["images_not_converged"] == 0
    # PNG keeps the original's pixels: its pairs are found, by the signature and by the groups.
    assert report["held_out"]["png"]["recall"] == report["grouping"]["png"]["recall"] == 1.0
    # The crop of 2-5% per side that `crop` was before signature version 2: scored apart, not a target.
    assert set(report["held_out_information"]) == {near_duplicate_quality.OLD_CROP}
    # The sample shape corpus: distinct flat-coloured shapes, many of one grey structure; colour keeps them apart.
    shapes = report["shape_corpus"]
    assert shapes["images"] == 100 and shapes["pairs"] == 100 * 99 // 2
    assert shapes["false_pairs"] == 0, shapes["listed"]
    # scikit-learn's digits: distinct scans, some with grey hashes within the default, none near.
    digits = report["digits"]
    assert digits["images"] == digits["distinct_scans"] == near_duplicate_quality.TINY_DIGITS
    assert digits["false_pairs"] == 0
    assert 0 < digits["pairs_grey_only"] <= digits["pairs_grey_or_mirrored"]
    out = capsys.readouterr().out
    assert "signature / load" in out and "FindNearDuplicateGroups" in out and "sample shape corpus" in out
    assert "scikit-learn's digits" in out
