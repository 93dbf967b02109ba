"""benchmarks/near_duplicate_grouping_cpu.py's parts run at a tiny size, in this process (no figure is asserted:
benchmarks/RESULTS.md holds them)."""

from benchmarks import near_duplicate_grouping_cpu


def test_the_images_carry_a_full_size_signature():
    from preprocess.near_duplicates import signature as signature_lib

    images = list(near_duplicate_grouping_cpu.full_size_images(20))
    assert len(images) == 20
    assert all(image.signature.bit_length() > 2 * signature_lib.CANDIDATE_BITS for image in images)


def test_the_shuffle_census_counts_each_crossing():
    census = {row["shuffle"].split(" ")[0]: row for row in near_duplicate_grouping_cpu.shuffle_census(50)}
    assert census["Floods"]["elements"] == 1 and census["Buckets"]["elements"] > 1
    assert all(row["bytes"] > 0 for row in census.values())


def test_one_grouping_run_takes_cpu():
    assert near_duplicate_grouping_cpu.one_run(20, grouping=True, rounds=1) > 0
