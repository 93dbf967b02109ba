"""The near-duplicate audit on a real corpus no one tuned on, through the real stage 1 job (DirectRunner).

scikit-learn's digits (tests/data/README.md): 1,797 distinct 8x8 scans, each
written as a PNG under its digit's folder, as a user would. Similar digits
are not copies: the audit (on by default) must leave them alone and the
splits must stay the requested ones.
"""

import gzip
import os

import numpy as np
import pytest
from PIL import Image

from tests.stage1 import run_stage1

pytestmark = pytest.mark.slow

DIGITS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "data", "digits.csv.gz")


def write_digits(root: str) -> int:
    with gzip.open(DIGITS, "rt") as handle:
        rows = np.loadtxt(handle, delimiter=",", dtype=np.int64)
    for index, row in enumerate(rows):
        folder = os.path.join(root, str(row[64]))
        os.makedirs(folder, exist_ok=True)
        pixels = (row[:64].reshape(8, 8) * 255 // 16).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{index:04d}.png"))
    return len(rows)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("digits"))
    count = write_digits(root)
    output = tmp_path_factory.mktemp("digits_out")
    return count, run_stage1(root, output, image_size=32, encoding="uint8", min_shards=1)


def test_distinct_digits_are_left_alone_and_the_splits_stay_as_requested(digits):
    count, manifest = digits
    near = manifest["near_duplicates"]
    assert manifest["inputs"]["num_found"] == count
    assert near["mode"] == "keep"
    assert near["images_in_groups"] <= 0.02 * count, near
    assert near["largest_group"] <= 8, near
    written = {split: info["num_examples"] for split, info in manifest["splits"].items()}
    total = sum(written.values())
    for split, requested in (("train", 0.8), ("validation", 0.1), ("test", 0.1)):
        assert abs(written[split] / total - requested) <= 0.02, written
        assert near["realised_split_fractions"][split] == round(written[split] / total, 4)
    assert near["changes_withheld"] == 0
    # Every scan is tiny, so every one needs equal pixels (what the report counts by split).
    assert sum(near["low_information_by_split"].values()) == count
    assert sum(near["distance_histogram"]) > 0
