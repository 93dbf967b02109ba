"""Fixtures for the stage 2 tests: datasets written by the real stage 1 job.

`stage1_dataset(encoding)` runs `preprocess.pipeline.run` (DirectRunner, in
process) on one small generated corpus, once per encoding per test session,
and returns the dataset directory. The images are 32x32 (the smallest size
every model of `--model` accepts) and every split has 2 shards (so two input
pipelines can each read their own); `stage1_dataset(encoding, min_shards=1)`
writes one shard per split instead (fewer shards than input pipelines).
"""

import pytest

from tests.stage1 import run_stage1, write_corpus

IMAGE_SIZE = 32
MIN_SHARDS = 2
IMAGES_PER_CLASS = 16
# No test split: stage 2 reads train and validation; a bigger validation split
# gives the parity and coverage tests more to hold.
SPLIT = "0.6,0.4,0.0"


@pytest.fixture(scope="session")
def sample_corpus(tmp_path_factory):
    """The generated shape corpus (5 classes, every kind of good and broken input)."""
    return write_corpus(tmp_path_factory.mktemp("corpus"), images_per_class=IMAGES_PER_CLASS, seed=0)


@pytest.fixture(scope="session")
def stage1_dataset(sample_corpus, tmp_path_factory):
    """stage1_dataset(encoding[, min_shards]) -> the directory stage 1 wrote (made once, then cached)."""
    written = {}

    def dataset_dir(encoding: str, min_shards: int = MIN_SHARDS) -> str:
        if (encoding, min_shards) not in written:
            output = tmp_path_factory.mktemp(f"dataset_{encoding}_{min_shards}")
            run_stage1(
                sample_corpus.root,
                output,
                "--split",
                SPLIT,
                image_size=IMAGE_SIZE,
                encoding=encoding,
                min_shards=min_shards,
            )
            written[encoding, min_shards] = str(output)
        return written[encoding, min_shards]

    return dataset_dir
