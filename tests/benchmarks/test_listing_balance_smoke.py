"""benchmarks/listing_balance.py runs at a tiny size and reports the planning before and after issue 23."""

from benchmarks import listing_balance


def test_listing_balance_runs_at_tiny_size(capsys):
    rows = listing_balance.main(["--tiny"])
    assert {row["code"] for row in rows} == {"before", "after"}
    assert all(row["largest_over_ideal"] <= 2 for row in rows if row["code"] == "after")
    assert "largest/ideal" in capsys.readouterr().out
