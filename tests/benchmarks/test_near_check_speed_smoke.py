"""benchmarks/near_check_speed.py runs at a tiny size, and its `--before` loads an older signature.py that gives
the same answers (no figure is asserted: benchmarks/RESULTS.md holds them)."""

import shutil
import subprocess

import pytest

from benchmarks import near_check_speed


def test_near_check_speed_runs_at_tiny_size():
    result = near_check_speed.main(["--images", "300", "--repeats", "1"])
    assert result["candidate_pairs"] > 0 and result["bucket_pairs"] >= result["candidate_pairs"]
    assert result["seconds"]["near/now"][0] > 0 and result["seconds"]["bucket/now"][0] > 0


def _has_history() -> bool:
    if shutil.which("git") is None:
        return False
    found = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], capture_output=True, check=False)
    return found.returncode == 0


@pytest.mark.skipif(not _has_history(), reason="needs the repository's git history")
def test_near_check_speed_compares_with_a_commit():
    result = near_check_speed.main(["--images", "300", "--repeats", "1", "--before", "HEAD"])
    assert result["near_same_answers"] and result["bucket_same_answers"]


@pytest.mark.skipif(not _has_history(), reason="needs the repository's git history")
def test_near_check_speed_times_the_signature_against_a_commit():
    result = near_check_speed.main(["--signature-cost", "--repeats", "1", "--before", "HEAD"])
    for corpus in result["ms_per_image_best_median"].values():
        assert set(corpus) == {"now", "before"} and all(best > 0 for best, _ in corpus.values())
