"""An incremental run over a corpus in GCS (the emulator) reads only the objects that are new: the others are
matched to the previous version's ledger by the MD5 the listing gives, and carried over unread."""

import numpy as np
from google.cloud import storage
from PIL import Image

from tests.stage1 import run_stage1, write_corpus


def _upload(gcs_emulator, local, url):
    name = url.removeprefix(f"gs://{gcs_emulator.bucket}/")
    storage.Client().bucket(gcs_emulator.bucket).blob(name).upload_from_filename(str(local))
    return name


def test_an_incremental_run_reads_only_the_new_objects(gcs_emulator, gcs_dir, gcs_read_faults, tmp_path):
    corpus = write_corpus(tmp_path / "corpus", images_per_class=3, include_broken=False)
    root = f"{gcs_dir}/raw"
    for corpus_file in corpus.files:
        _upload(gcs_emulator, corpus.uri(corpus_file), f"{root}/{corpus_file.path}")
    output = tmp_path / "dataset"
    first = run_stage1(root, output, image_size=16, encoding="uint8", min_shards=1)
    prefix = root.removeprefix(f"gs://{gcs_emulator.bucket}/") + "/"
    first_reads = {read.name for read in gcs_read_faults.forwarded_reads if read.name.startswith(prefix)}
    assert len(first_reads) >= first["inputs"]["num_written"]  # the first version reads every image

    rng = np.random.default_rng(5)
    new = set()
    for index, class_name in enumerate(sorted(corpus.class_names)[:2]):
        local = tmp_path / f"new-{index}.png"
        Image.fromarray(rng.integers(0, 255, (30, 30, 3), dtype=np.uint8)).save(local)
        new.add(_upload(gcs_emulator, local, f"{root}/{class_name}/new-{index}.png"))
    gcs_read_faults.forwarded_reads.clear()
    second = run_stage1(root, output, image_size=16, encoding="uint8", min_shards=1)

    reads = [read for read in gcs_read_faults.forwarded_reads if read.name.startswith(prefix)]
    assert {read.name for read in reads} == new
    assert second["inputs"]["num_decoded"] == len(new)
    assert second["inputs"]["num_reused"] == first["inputs"]["num_written"]
