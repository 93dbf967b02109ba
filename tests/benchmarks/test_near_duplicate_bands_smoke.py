"""benchmarks/near_duplicate_bands.py runs at a tiny size: the corpora are signed, every band of both
schemes has a collision rate (the second product generator too), and the emulation reports a left-out share and a recall per scheme and scale.
No figure is asserted beyond what any corpus must give: the full-size ones are in benchmarks/RESULTS.md."""

import pytest

from benchmarks import near_duplicate_bands


@pytest.mark.slow
def test_near_duplicate_bands_runs_at_tiny_size(capsys):
    report = near_duplicate_bands.main(["--images", "300", "--tiny", "--product-copies", "10"])
    for found in report["product_copies"].values():
        assert set(found) == set(near_duplicate_bands.PRODUCT_COPY_KINDS)
        assert all(0 <= share <= 1 for share in found.values())
    assert set(report["collisions"]) == {
        f"{corpus}/{scheme}"
        for corpus in ("photos", "products", "second")
        for scheme in near_duplicate_bands.SCHEMES
    }
    assert all(len(rates) == near_duplicate_bands.BANDS for rates in report["collisions"].values())
    assert set(report["emulated"]) == {
        f"{scheme}/{scale}"
        for scheme in near_duplicate_bands.SCHEMES
        for scale in near_duplicate_bands.SCALES
    }
    for figures in report["emulated"].values():
        assert 0 <= figures["left_out"] <= 1 and 0 <= figures["recall"] <= 1
    assert 0 < report["recall_small"] <= 1
    assert "collision rate per band" in capsys.readouterr().out
