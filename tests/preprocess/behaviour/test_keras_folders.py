"""A folder of class folders is read the way Keras' image_dataset_from_directory reads it: one real run of
`python -m preprocess` over a corpus as people have them (sidecar files, a nested folder, an empty class,
files at the root, an upper-case extension, a .jpg that is not an image)."""

import json

import pytest

from tests.user_mistakes import run_command, said_lines, write_image, write_text

SIDECARS = {"meta.json": '{"source": "camera"}', "notes.txt": "shot in 2024", "README": "same in every class"}


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    """(corpus root, dataset dir, the finished process) of one run over a corpus with everything above."""
    base = tmp_path_factory.mktemp("keras_folders")
    root = base / "photos"
    index = 0
    for name in ("cat", "dog"):
        for number in range(5):
            write_image(root / name / f"{number}.jpg", index)
            index += 1
        for sidecar, text in SIDECARS.items():  # identical in both classes: no conflicting_labels
            write_text(root / name / sidecar, text)
    write_image(root / "cat" / "IMG_0001.JPG", index, fmt="JPEG")  # an extension in upper case
    write_image(root / "cat" / "2024" / "a.png", index + 1)  # a sub-folder of a class: still a cat
    write_image(root / "cat" / "2024" / "b.jpeg", index + 2, fmt="JPEG")
    write_text(root / "cat" / "2024" / "notes.txt", "a trip")
    write_text(root / "dog" / "broken.jpg", "not an image")  # an image by name: a failure, with its reason
    write_text(root / "empty" / "notes.txt", "nothing yet")  # a class folder without images
    write_image(root / "cover.jpg", index + 3)  # at the root: no class
    write_text(root / "labels.txt", "cat\ndog\n")
    write_text(root / ".DS_Store", "debris")
    output = base / "dataset"
    result = run_command(
        "preprocess",
        ["--input", root, "--output", output, "--image-size", "16", "--split", "1,0,0", "--min-shards", "1"]
        + ["--max-failed-fraction", "0.1"],
        base,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root, output, result


def _manifest(output) -> dict:
    return json.loads((output / "dataset.json").read_text())


def test_only_images_are_inputs_and_the_other_files_are_counted_by_extension(folder_run):
    _, output, _ = folder_run
    inputs = _manifest(output)["inputs"]
    # Images: 5 + 1 + 2 cats, 5 + 1 (broken) dogs. Sidecars are not inputs, so not failures.
    assert inputs["num_found"] == 14
    assert inputs["num_written"] == 13
    assert inputs["failures_by_reason"] == {"not_an_image": 1}
    assert inputs["num_found"] == inputs["num_written"] + inputs["num_failed"] + inputs["num_duplicates"]
    assert inputs["skipped_by_extension"] == {"": 2, ".json": 2, ".txt": 4}
    assert inputs["skipped_at_root"] == 2


def test_images_in_a_sub_folder_belong_to_the_class_and_an_empty_folder_is_no_class(folder_run):
    _, output, _ = folder_run
    manifest = _manifest(output)
    assert manifest["labels"] == ["cat", "dog"]
    assert manifest["splits"]["train"]["num_examples_per_class"] == {"cat": 8, "dog": 5}


def test_the_summary_and_the_warnings_name_what_was_skipped(folder_run):
    root, _, result = folder_run
    said = "\n".join(said_lines(result.stdout + result.stderr))
    assert "skipped, not inputs: .txt 4, (no extension) 2, .json 2 (not images by their extension)" in said
    assert "2 files at the root (not in a class folder)" in said
    assert f"1 class folder of {root} holds no image and is left out: empty" in said
    assert "cover.jpg, labels.txt" in said
    assert "Traceback" not in said
