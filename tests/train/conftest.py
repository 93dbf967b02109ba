"""Fixtures for the stage 2 tests: datasets written by the real stage 1 job.

`stage1_dataset(encoding)` runs `preprocess.launch.launcher.run` (DirectRunner, in
process) on one small generated corpus, once per encoding per test session,
and returns the dataset directory. The images are 32x32 (the smallest size
every model of `--model` accepts) and every split has 2 shards (so two input
pipelines can each read their own); `stage1_dataset(encoding, min_shards=1)`
writes one shard per split instead (fewer shards than input pipelines), and
`stage1_dataset(encoding, CROP_MARGIN)` stores 36x36 squares for 32x32 crops.
"""

import pytest

from tests.stage1 import run_stage1, write_corpus

IMAGE_SIZE = 32
MIN_SHARDS = 2
IMAGES_PER_CLASS = 16
# No test split: stage 2 reads train and validation; a bigger validation split
# gives the parity and coverage tests more to hold.
SPLIT = "0.6,0.4,0.0"
# The crop margin of the crop tests: 32 px crops out of round(32 x 1.14) = 36 px stored squares.
CROP_MARGIN = 0.14
CROP_MARGIN_STORED_SIZE = 36


@pytest.fixture(scope="session")
def sample_corpus(tmp_path_factory):
    """The generated shape corpus (5 classes, every kind of good and broken input)."""
    return write_corpus(tmp_path_factory.mktemp("corpus"), images_per_class=IMAGES_PER_CLASS, seed=0)


@pytest.fixture(scope="session")
def stage1_dataset(sample_corpus, tmp_path_factory):
    """stage1_dataset(encoding, crop_margin=0.0, min_shards=MIN_SHARDS) -> the directory stage 1 wrote.

    Made once per arguments, then cached. With a crop margin the stored images are larger
    (CROP_MARGIN_STORED_SIZE for CROP_MARGIN) and the model sees IMAGE_SIZE crops of them.
    """
    written = {}

    def dataset_dir(encoding: str, crop_margin: float = 0.0, min_shards: int = MIN_SHARDS) -> str:
        key = (encoding, crop_margin, min_shards)
        if key not in written:
            output = tmp_path_factory.mktemp(
                f"dataset_{encoding}_{min_shards}" + (f"_margin{crop_margin}" if crop_margin else "")
            )
            margin_args = ("--crop-margin", str(crop_margin)) if crop_margin else ()
            run_stage1(
                sample_corpus.root,
                output,
                "--split",
                SPLIT,
                *margin_args,
                image_size=IMAGE_SIZE,
                encoding=encoding,
                min_shards=min_shards,
            )
            written[key] = str(output)
        return written[key]

    return dataset_dir
