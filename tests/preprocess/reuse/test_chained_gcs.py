"""Versions chained over three runs on GCS (the emulator), corpus and dataset both in the bucket: each re-run
reads only its new objects (not the broken ones, whose failures it carries over), and the third version
references the shards of all three runs; verify and the stage 2 loader read it whole."""

import io

import numpy as np
from google.cloud import storage
from PIL import Image

from dataset_contract import manifest as manifest_lib
from preprocess import errors
from tests.stage1 import run_stage1, write_corpus

SPLITS = ("train", "validation", "test")


def _upload_bytes(gcs_emulator, data: bytes, url: str) -> str:
    name = url.removeprefix(f"gs://{gcs_emulator.bucket}/")
    storage.Client().bucket(gcs_emulator.bucket).blob(name).upload_from_string(data)
    return name


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (30, 30, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _shard_runs(manifest) -> set:
    return {shard["path"].split("/")[1] for info in manifest["splits"].values() for shard in info["shards"]}


def _error_log(output, manifest) -> dict:
    paths = [manifest_lib.join(output, path) for path in manifest_lib.error_file_paths(manifest)]
    sample = errors.read_error_log(paths)
    return {record.uri: record.reason for records in sample.examples.values() for record in records}


def test_three_chained_versions_read_only_new_objects_and_carry_failures_over(
    gcs_emulator, gcs_dir, gcs_read_faults, tmp_path, capsys
):
    from preprocess import verify as verify_cli  # noqa: PLC0415
    from train import load_dataset  # noqa: PLC0415

    corpus = write_corpus(tmp_path / "corpus", images_per_class=2, include_broken=False)
    root, output = f"{gcs_dir}/raw", f"{gcs_dir}/dataset"
    for corpus_file in corpus.files:
        with open(corpus.uri(corpus_file), "rb") as handle:
            _upload_bytes(gcs_emulator, handle.read(), f"{root}/{corpus_file.path}")
    classes = sorted(corpus.class_names)
    # Broken in their bytes: the first version's decoding fails them; later ones carry the failure over.
    broken = {
        f"{root}/{classes[0]}/truncated.png": (_png(1)[:120], errors.TRUNCATED),
        f"{root}/{classes[1]}/not-an-image.png": (b"not an image at all", errors.NOT_AN_IMAGE),
    }
    for url, (data, _) in broken.items():
        _upload_bytes(gcs_emulator, data, url)
    prefix = root.removeprefix(f"gs://{gcs_emulator.bucket}/") + "/"
    args = ("--near-duplicates", "off")
    manifests = [run_stage1(root, output, *args, image_size=16, encoding="uint8", min_shards=1)]
    expected_failures = {url: reason for url, (_, reason) in broken.items()}
    assert _error_log(output, manifests[0]) == expected_failures
    for version in (2, 3):
        new = _upload_bytes(
            gcs_emulator, _png(version * 10), f"{root}/{classes[version % 2]}/new-{version}.png"
        )
        gcs_read_faults.forwarded_reads.clear()
        manifest = run_stage1(root, output, *args, image_size=16, encoding="uint8", min_shards=1)
        previous = manifests[-1]
        manifests.append(manifest)
        # Only the new object is read: the unchanged images are carried, the broken ones' failures too.
        assert {read.name for read in gcs_read_faults.forwarded_reads if read.name.startswith(prefix)} == {
            new
        }
        inputs = manifest["inputs"]
        assert inputs["num_decoded"] == 1
        assert inputs["num_reused"] == previous["inputs"]["num_written"] + len(broken)
        assert inputs["num_failed"] == len(broken)
        assert inputs["failures_by_reason"] == {errors.TRUNCATED: 1, errors.NOT_AN_IMAGE: 1}
        assert inputs["num_written"] == inputs["num_decoded"] + inputs["num_reused"] - inputs["num_failed"]
        assert inputs["num_found"] == inputs["num_written"] + inputs["num_failed"] + inputs["num_duplicates"]
        assert _error_log(output, manifest) == expected_failures
        assert manifest["run"]["built_from"] == previous["run"]["id"]
    # The third version's shards live in the directories of all three runs.
    assert _shard_runs(manifests[2]) == {manifest["run"]["id"] for manifest in manifests}
    assert verify_cli.main([output]) == 0, capsys.readouterr().out
    third = manifests[2]
    for split in [split for split in SPLITS if third["splits"][split]["num_examples"]]:
        count = sum(
            int(batch[1].shape[0]) for batch in load_dataset(output, split, batch_size=4, training=False)
        )
        assert count == third["splits"][split]["num_examples"], split
