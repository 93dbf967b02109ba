"""Check that the shards a manifest lists are there and intact.

One small function shared by training (before the first step, and with
`--verify-data` a full sha256 pass) and by stage 1's own `preprocess verify`
command, so both hold a dataset directory to the same standard. All file
access goes through `tf.io.gfile`, so the same code checks `gs://` datasets.
"""

import dataclasses
import hashlib

import tensorflow as tf

from dataset_contract import manifest as manifest_lib

MISSING = "missing"
WRONG_SIZE = "wrong_size"
WRONG_SHA256 = "wrong_sha256"

# Large reads keep a full sha256 pass over GCS at streaming speed.
_READ_CHUNK_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class ShardProblem:
    """One shard that does not match the manifest."""

    path: str  # the shard's full path (local or gs://)
    kind: str  # MISSING, WRONG_SIZE or WRONG_SHA256
    detail: str

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


def sha256_of_file(path: str) -> str:
    """Hex sha256 of a file's bytes, read in large chunks."""
    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as handle:
        while chunk := handle.read(_READ_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def verify_shards(
    data_dir: str, manifest: dict, splits=manifest_lib.SPLITS, check_sha256: bool = False
) -> list[ShardProblem]:
    """Every problem with the listed shards of `splits` (all of them, not just the first).

    Existence and size cost one stat per shard; `check_sha256` reads every
    byte, which for a large dataset on GCS takes minutes, so it is opt-in.
    A shard of the wrong size is not hashed: it is already known to be wrong.
    """
    problems = []
    for split in splits:
        for shard in manifest["splits"].get(split, {}).get("shards", []):
            path = manifest_lib.join(data_dir, shard["path"])
            if not tf.io.gfile.exists(path):
                problems.append(
                    ShardProblem(path, MISSING, f"listed in {manifest_lib.MANIFEST_FILE} but absent")
                )
                continue
            size = tf.io.gfile.stat(path).length
            if size != shard["num_bytes"]:
                problems.append(
                    ShardProblem(
                        path,
                        WRONG_SIZE,
                        f"{size} bytes, but {manifest_lib.MANIFEST_FILE} says {shard['num_bytes']} "
                        "(truncated, still being written, or from another run)",
                    )
                )
                continue
            if check_sha256:
                actual = sha256_of_file(path)
                if actual != shard["sha256"]:
                    problems.append(
                        ShardProblem(
                            path,
                            WRONG_SHA256,
                            f"sha256 {actual}, but {manifest_lib.MANIFEST_FILE} says {shard['sha256']} "
                            "(the content changed after it was written)",
                        )
                    )
    return problems
