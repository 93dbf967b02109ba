"""A decoder change re-reads the failures a re-run would carry over (issue 32): two real Beam runs of a tiny
corpus with broken files, the second with the project's decode version raised (as a release that changes
decode/image.py does); every failed input is read and decoded again, none carried."""

import json
import os

import PIL

from dataset_contract import manifest as manifest_lib
from preprocess.decode import image
from preprocess.reuse.ledger import CARRIED_FAILURES
from tests.stage1 import run_stage1, write_corpus

ARGS = ("--near-duplicates", "off")


def _failed_lines(output, manifest) -> dict:
    lines = {}
    for path in manifest_lib.ledger_file_paths(manifest):
        with open(os.path.join(output, path)) as handle:
            lines.update(
                (entry["uri"], entry["failed"]) for entry in map(json.loads, handle) if "failed" in entry
            )
    return lines


def test_a_changed_decoder_reads_again_the_inputs_whose_decoding_failed(tmp_path, monkeypatch):
    corpus, output = tmp_path / "corpus", tmp_path / "dataset"
    write_corpus(corpus, images_per_class=2, include_broken=True)
    first = run_stage1(corpus, output, *ARGS, image_size=16, encoding="uint8", min_shards=1)
    failed = _failed_lines(output, first)
    assert failed and {line["reason"] for line in failed.values()} <= set(CARRIED_FAILURES)
    assert {line["decoder"] for line in failed.values()} == {f"Pillow {PIL.__version__}; decode 1"}

    monkeypatch.setattr(image, "DECODE_VERSION", image.DECODE_VERSION + 1)
    second = run_stage1(corpus, output, *ARGS, image_size=16, encoding="uint8", min_shards=1)
    inputs = second["inputs"]
    # The images are carried, the failed inputs decoded again (they fail again, under the new decoder): none
    # counts reused (a carried failure would), each decoded.
    assert inputs["num_reused"] == first["inputs"]["num_written"]
    assert inputs["num_decoded"] == len(failed)
    assert inputs["num_failed"] == first["inputs"]["num_failed"]
    assert {uri: line["decoder"] for uri, line in _failed_lines(output, second).items()} == {
        uri: f"Pillow {PIL.__version__}; decode 2" for uri in failed
    }
