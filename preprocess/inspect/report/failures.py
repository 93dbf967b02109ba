"""Examples of each failure reason, with their detail lines, from the error log the manifest lists.

Reads the error files in the manifest's order only until every reason the
manifest counts has its examples, or until `max_bytes` of log are read: a
few lines for a small log, a bounded amount for a huge one.
"""

import dataclasses
import json

import tensorflow as tf

from dataset_contract import manifest as manifest_lib


@dataclasses.dataclass(frozen=True)
class FailureExample:
    uri: str
    detail: str


@dataclasses.dataclass
class FailureExamples:
    by_reason: dict[str, list[FailureExample]] = dataclasses.field(default_factory=dict)
    bytes_read: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)


def read_failure_examples(
    data_dir: str, manifest: dict, per_reason: int = 5, max_bytes: int = 16 << 20
) -> FailureExamples:
    """Up to `per_reason` (uri, detail) examples of each reason the manifest counts."""
    wanted = manifest["inputs"].get("failures_by_reason") or {}
    found = FailureExamples()
    if not wanted:
        return found

    def complete() -> bool:
        return all(
            len(found.by_reason.get(reason, [])) >= min(per_reason, count) for reason, count in wanted.items()
        )

    for relative in manifest_lib.error_file_paths(manifest):
        path = manifest_lib.join(data_dir, relative)
        if not tf.io.gfile.exists(path):
            found.notes.append(f"error file {path} is missing")
            continue
        with tf.io.gfile.GFile(path, "r") as handle:
            for line in handle:
                found.bytes_read += len(line)
                error = _parse(line)
                if error is not None:
                    examples = found.by_reason.setdefault(str(error.get("reason", "?")), [])
                    if len(examples) < per_reason:
                        examples.append(
                            FailureExample(str(error.get("uri", "?")), str(error.get("detail", "")))
                        )
                if complete():
                    return found
                if found.bytes_read >= max_bytes:
                    found.notes.append(
                        f"stopped reading the error log after {max_bytes >> 20} MB; some reasons have fewer examples"
                    )
                    return found
    return found


def _parse(line: str) -> dict | None:
    if not line.strip():
        return None
    try:
        error = json.loads(line)
    except json.JSONDecodeError:
        return None
    return error if isinstance(error, dict) else None
