"""What a dataset was built from, as one hash: the data-determining stage 1 settings and the state of the
inputs (a tree's listing, or a CSV/JSONL manifest's bytes). Stored as the manifest's `build.fingerprint`, so
that a workflow run again can skip stage 1; what it covers and misses: docs/internals.md."""

import hashlib
import json

FINGERPRINT_VERSION = 1
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
