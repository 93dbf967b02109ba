"""`python -m pipelines.local|dataflow`: a mistake is refused before stage 1 (and before TensorFlow is
imported), in a few lines, exit 2, no traceback, nothing written. Real processes."""

import pytest

from tests.cli_probe import probe_module
from tests.user_mistakes import assert_refused, command_env, run_command, write_image

HEAVY = ("tensorflow", "keras", "tensorflow_transform")


@pytest.fixture(scope="module")
def one_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("one_class") / "photos"
    for number in range(3):
        write_image(root / "cat" / f"{number}.jpg", number)
    return root


@pytest.fixture(scope="module")
def two_classes(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_classes") / "photos"
    for number in range(2):
        write_image(root / "cat" / f"{number}.jpg", number)
        write_image(root / "dog" / f"{number}.jpg", 10 + number)
    return root


def test_local_an_unknown_model_is_refused_before_stage_1_and_tensorflow(tmp_path, two_classes):
    result = probe_module(
        "pipelines.local",
        ["--input", str(two_classes), "--workdir", str(tmp_path / "w"), "--model", "resnet5"],
        HEAVY,
        tmp_path,
    )
    assert "--model resnet5: no such model (did you mean resnet50?)" in result.stderr
    assert "EXIT 2 HEAVY []" in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and not (tmp_path / "w").exists()


def test_local_a_wrong_input_path_is_refused_and_no_workdir_is_made(tmp_path):
    result = run_command(
        "pipelines.local", ["--input", tmp_path / "photoz", "--workdir", tmp_path / "w"], tmp_path
    )
    assert_refused(result, f"--input {tmp_path / 'photoz'}: no such folder")
    assert not (tmp_path / "w").exists()


def test_local_a_single_class_is_refused(tmp_path, one_class):
    result = run_command("pipelines.local", ["--input", one_class, "--workdir", tmp_path / "w"], tmp_path)
    assert_refused(result, "only one class, 'cat'", "at least two classes")
    assert not (tmp_path / "w").exists()


def test_local_a_workdir_inside_the_input_is_refused(tmp_path, two_classes):
    workdir = two_classes / "run"
    result = run_command("pipelines.local", ["--input", two_classes, "--workdir", workdir], tmp_path)
    assert_refused(result, f"--workdir {workdir}/dataset is inside --input {two_classes}")
    assert not workdir.exists()


_DATAFLOW = ["--project", "p", "--region", "europe-west4", "--tpu", "my-tpu"]


def test_dataflow_a_typo_in_a_dataflow_flag_is_refused_with_the_flag_it_meant(tmp_path):
    args = [
        "--input",
        "gs://b/raw",
        "--workdir",
        "gs://b/run",
        *_DATAFLOW,
        "--max_num_worker",
        "9",
        "--dry-run",
    ]
    result = run_command("pipelines.dataflow", args + ["--dry-run-dir", tmp_path / "dry"], tmp_path)
    assert_refused(result, "unknown flag --max_num_worker", "did you mean --max_num_workers?")
    assert not (tmp_path / "dry").exists()


def test_dataflow_a_workdir_inside_the_input_is_refused_even_for_a_dry_run(tmp_path):
    args = ["--input", "gs://b/raw", "--workdir", "gs://b/raw/run", *_DATAFLOW, "--dry-run"]
    result = run_command("pipelines.dataflow", args + ["--dry-run-dir", tmp_path / "dry"], tmp_path)
    assert_refused(result, "--workdir gs://b/raw/run/dataset is inside --input gs://b/raw")
    assert not (tmp_path / "dry").exists()


def test_dataflow_a_missing_input_bucket_folder_is_refused_before_dataflow(tmp_path, gcs_emulator):
    args = ["--input", gcs_emulator.url("no-such-folder"), "--workdir", gcs_emulator.url("run"), *_DATAFLOW]
    result = run_command("pipelines.dataflow", args, tmp_path, env=gcs_emulator.subprocess_env(command_env()))
    assert_refused(result, "no such folder, or nothing is in it")
