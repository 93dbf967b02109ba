"""`python -m preprocess`: each common mistake is refused before Beam starts, in a few lines, exit 2, no
traceback, and nothing is left behind. Real processes, real folders."""

import time

import pytest

from preprocess import options
from preprocess.inputs import size_check
from tests.user_mistakes import assert_refused, command_env, run_command, write_image, write_text


def _preprocess(cwd, *args):
    return run_command("preprocess", args, cwd)


@pytest.fixture(scope="module")
def two_classes(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_classes")
    for index in range(3):
        write_image(root / "cat" / f"{index}.jpg", index)
        write_image(root / "dog" / f"{index}.jpg", 10 + index)
    return root


def test_a_typo_in_a_flag_is_refused_with_the_flag_it_meant(tmp_path, two_classes):
    result = _preprocess(tmp_path, "--input", two_classes, "--output", tmp_path / "out", "--image-szie", "64")
    assert_refused(result, "unknown flag --image-szie", "did you mean --image-size?")
    assert not (tmp_path / "out").exists()


def test_a_typo_in_a_beam_flag_is_refused_with_the_beam_flag_it_meant(tmp_path, two_classes):
    result = _preprocess(
        tmp_path, "--input", two_classes, "--output", tmp_path / "out", "--runer", "DirectRunner"
    )
    assert_refused(result, "unknown flag --runer", "did you mean --runner?")


def test_beam_and_dataflow_pipeline_options_pass_untouched():
    argv = ["--input", "in", "--output", "out"]
    beam = [
        "--runner",
        "DataflowRunner",
        "--project",
        "p",
        "--region",
        "europe-west4",
        "--temp_location",
        "gs://b/tmp",
        "--setup_file",
        "./setup.py",
        "--experiments",
        "use_runner_v2",
        "--experiments=shuffle_mode=service",
        "--direct_num_workers=2",
        "--direct_running_mode",
        "multi_processing",
        "--max_num_workers",
        "17",
        "--machine_type=n2-standard-8",
        "--sdk_container_image",
        "image:tag",
        "--save_main_session",
    ]
    args, beam_args = options.parse_args(argv + beam)
    assert beam_args == beam and args.input == "in"


def test_a_wrong_input_path_is_named_and_no_output_directory_is_made(tmp_path):
    result = _preprocess(tmp_path, "--input", tmp_path / "photoz", "--output", tmp_path / "out")
    assert_refused(result, f"--input {tmp_path / 'photoz'}: no such folder")
    assert not (tmp_path / "out").exists()


def test_an_empty_folder_is_refused(tmp_path):
    (tmp_path / "photos").mkdir()
    result = _preprocess(tmp_path, "--input", tmp_path / "photos", "--output", tmp_path / "out")
    assert_refused(result, "holds no class folders and no images")
    assert not (tmp_path / "out").exists()


def test_images_without_class_folders_are_refused_with_the_layout_to_use(tmp_path):
    for index in range(3):
        write_image(tmp_path / "photos" / f"{index}.jpg", index)
    result = _preprocess(tmp_path, "--input", tmp_path / "photos", "--output", tmp_path / "out")
    assert_refused(result, "holds 3 images", "no class folders", "ROOT/<class>/<image>")


def test_class_folders_without_images_are_refused(tmp_path):
    write_text(tmp_path / "photos" / "cat" / "notes.txt", "cats")
    write_text(tmp_path / "photos" / "dog" / "meta.json", "{}")
    result = _preprocess(tmp_path, "--input", tmp_path / "photos", "--output", tmp_path / "out")
    assert_refused(result, "none of its 2 class folders", "holds an image")


def test_a_single_class_is_refused(tmp_path):
    for index in range(3):
        write_image(tmp_path / "photos" / "cat" / f"{index}.jpg", index)
    (tmp_path / "photos" / "dog").mkdir()  # an empty folder is no second class
    result = _preprocess(tmp_path, "--input", tmp_path / "photos", "--output", tmp_path / "out")
    assert_refused(result, "only one class, 'cat', has images", "at least two classes")
    assert not (tmp_path / "out").exists()


def test_an_output_inside_the_input_is_refused(tmp_path, two_classes):
    output = two_classes / "dataset"
    result = _preprocess(tmp_path, "--input", two_classes, "--output", output)
    assert_refused(result, "is inside --input", "outside the input folder")
    assert not output.exists()


def test_a_csv_whose_rows_are_all_bad_is_refused_with_their_reason(tmp_path, two_classes):
    manifest = tmp_path / "labels.csv"
    # Semicolons, as a spreadsheet in some locales writes them: one field per row.
    manifest.write_text("".join(f"{two_classes}/cat/{index}.jpg;cat\n" for index in range(3)))
    result = _preprocess(tmp_path, "--input", manifest, "--output", tmp_path / "out")
    assert_refused(result, "none of its rows can be used", "bad_manifest_row 3")
    assert not (tmp_path / "out").exists()


def test_a_semicolon_header_is_not_counted_as_a_bad_row(tmp_path, two_classes):
    manifest = tmp_path / "labels.csv"
    rows = "".join(f"{two_classes}/cat/{index}.jpg;cat\n" for index in range(3))
    manifest.write_text("path;label\n" + rows)
    result = _preprocess(tmp_path, "--input", manifest, "--output", tmp_path / "out")
    assert_refused(result, "none of its rows can be used", "bad_manifest_row 3)")


def test_a_manifest_whose_files_are_not_there_is_refused(tmp_path):
    manifest = tmp_path / "lists" / "labels.csv"
    write_text(manifest, "filename,label\nimages/a.jpg,cat\nimages/b.jpg,dog\n")
    result = _preprocess(tmp_path, "--input", manifest, "--output", tmp_path / "out")
    assert_refused(result, "none of the first 2 files it names exists", "relative to the manifest's folder")


def test_a_missing_manifest_is_refused(tmp_path):
    result = _preprocess(tmp_path, "--input", tmp_path / "labels.csv", "--output", tmp_path / "out")
    assert_refused(result, "no such manifest file")


def test_verbose_shows_the_traceback_of_a_refusal(tmp_path):
    result = _preprocess(tmp_path, "--input", tmp_path / "photoz", "--output", tmp_path / "out", "--verbose")
    assert result.returncode != 0 and "Traceback" in result.stderr and "InputError" in result.stderr


def test_a_gcs_tree_with_a_single_class_is_refused(tmp_path, gcs_emulator):
    from google.cloud import storage

    bucket = storage.Client().bucket(gcs_emulator.bucket)
    for name in ("single/cat/1.jpg", "single/cat/notes.txt", "single/dog/meta.json"):
        bucket.blob(name).upload_from_string(b"x")
    result = run_command(
        "preprocess",
        ["--input", gcs_emulator.url("single"), "--output", gcs_emulator.url("single-out")],
        tmp_path,
        env=gcs_emulator.subprocess_env(command_env()),
    )
    assert_refused(result, "only one class, 'cat', has images", "1 other folder holds no image: dog")


@pytest.mark.parametrize("command", ["preprocess", "pipelines.local"])
def test_an_image_size_past_the_limit_is_refused_in_a_moment_and_nothing_is_written(
    tmp_path, two_classes, command
):
    output = ["--output", tmp_path / "out"] if command == "preprocess" else ["--workdir", tmp_path / "out"]
    started = time.monotonic()
    result = run_command(command, ["--input", two_classes, *output, "--image-size", "100000"], tmp_path)
    assert_refused(result, "argument --image-size: 100000 px is past the limit of 2048")
    assert time.monotonic() - started < 30  # no Beam, no TensorFlow: well under a second on a laptop
    assert not (tmp_path / "out").exists()


def test_an_image_size_larger_than_most_sources_is_said_with_the_datasets_estimated_size(two_classes):
    # The corpus: 6 images of 24x20 px (short side 20). 64 px upscales all of them; 16 px none.
    warning = size_check.check_image_size(str(two_classes), 64, 64, "crop", "uint8")
    assert warning.startswith(
        "--image-size 64 is larger than 6 of the 6 source images sampled (their short side: 20-20 px"
    )
    assert f"about {6 * 64 * 64 * 3 / 1e3:.1f} KB (6 images, uint8)" in warning
    assert size_check.check_image_size(str(two_classes), 16, 16, "crop", "uint8") is None
    # pad scales the long side (24): 22 px upscales none of them.
    assert size_check.check_image_size(str(two_classes), 22, 22, "pad", "uint8") is None


def test_the_image_size_warning_is_printed_before_the_run_which_goes_on(tmp_path, two_classes):
    result = _preprocess(tmp_path, "--input", two_classes, "--output", tmp_path / "out", "--image-size", "48")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "WARNING preprocess.inputs.size_check: --image-size 48 is larger than 6 of the 6 source images"
        in (result.stderr)
    )
    assert (tmp_path / "out" / "dataset.json").exists()
