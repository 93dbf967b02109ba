"""benchmarks/quick_check_index.py runs at a tiny size (no figure is asserted: benchmarks/RESULTS.md holds them)."""

from benchmarks import quick_check_index


def test_quick_check_index_runs_at_tiny_size():
    results = quick_check_index.main(["--entries", "300"])
    assert [result["form"] for result in results] == ["dict", "sqlite"]
    assert all(result["build_s"] >= 0 and result["lookup_us"] > 0 for result in results)
    assert results[1]["on_disk_bytes"] > 0
