"""What a dataset was built from, as one hash: the stage 1 settings and the state of the inputs.

Stored by the last step in the manifest (`build.fingerprint`, docs/dataset_format.md), so that a
workflow run again with the same command can tell that the published dataset already is what
stage 1 would build, and skip it (pipelines/local.py):

    settings   every data-determining entry of the job's config (pipeline.job_config), i.e. the
               stage 1 flags: --input, --image-size, --encoding, --crop-margin, --resize-method,
               --split, --max-pixels, ... ; not where the output goes nor how failures are judged
               (--output, --max-failed-fraction, --retention-days), which do not change a record
    inputs     a directory tree: every file below it, by relative path, size and modification
               time (one listing, as stage 1's own); a CSV/JSONL manifest: that file's bytes.
               The files a manifest names are not looked at (on GCS that is a request per file):
               a changed image under an unchanged manifest needs the manifest changed, or
               `python -m preprocess` run by hand

Same settings and same listing: same fingerprint. The hash says nothing about the images' content
beyond their size and time: a file rewritten in place within the same second at the same size
would go unnoticed.
"""

import hashlib
import json

FINGERPRINT_VERSION = 1
# job_config entries that do not change what the records hold.
# Not what a record holds: where it goes, how failures are judged, and which version a re-run started
# from (an incremental run and a full rebuild of the same inputs write the same records).
_NOT_DATA = ("build_id", "output", "max_failed_fraction", "retention_days", "built_from", "full_rebuild")


def settings_of(config: dict) -> dict:
    """The entries of `config` that determine the records, sorted (see the module docstring)."""
    return {key: config[key] for key in sorted(config) if key not in _NOT_DATA}


def _listing_lines(config: dict):
    """One line per input file (directory trees) or the manifest file's digest (CSV/JSONL)."""
    from preprocess import filesystem  # noqa: PLC0415 - Beam's filesystems, loaded when used

    source = config["input"].rstrip("/")
    if config.get("input_kind", "directory") != "directory":
        yield f"manifest {hashlib.sha256(filesystem.read_bytes(source)).hexdigest()}"
        return
    prefix = source + "/"
    for metadata in sorted(filesystem.list_files(source), key=lambda m: m.path):
        relative = metadata.path[len(prefix) :] if metadata.path.startswith(prefix) else metadata.path
        yield f"{relative}\t{metadata.size_in_bytes}\t{int(metadata.last_updated_in_seconds)}"


def compute_fingerprint(config: dict) -> dict:
    """{"version", "sha256", "num_input_files"} of the job `config` and its inputs as they are now."""
    digest = hashlib.sha256()
    digest.update(json.dumps(settings_of(config), sort_keys=True, default=str).encode())
    count = 0
    for line in _listing_lines(config):
        digest.update(b"\n" + line.encode())
        count += 1
    return {"version": FINGERPRINT_VERSION, "sha256": digest.hexdigest(), "num_input_files": count}


def published_fingerprint(manifest: dict | None) -> str | None:
    """The fingerprint's sha256 a published manifest records (None when it has none of this version)."""
    if not manifest:
        return None
    fingerprint = (manifest.get("build") or {}).get("fingerprint") or {}
    if fingerprint.get("version") != FINGERPRINT_VERSION:
        return None
    return fingerprint.get("sha256")
