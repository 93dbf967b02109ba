"""The short report the job prints when it ends: what was written and what failed."""

from dataset_contract import manifest as manifest_lib


def _size(num_bytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if num_bytes < 1024 or unit == "GB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.1f} TB"


def format_summary(manifest: dict, output_dir: str) -> str:
    inputs = manifest["inputs"]
    image = manifest["image"]
    lines = [
        f"Dataset written to {output_dir}",
        f"  images: {inputs['num_found']} found = {inputs['num_written']} written"
        f" + {inputs['num_failed']} failed + {inputs['num_duplicates']} duplicates",
        f"  image: {image['height']}x{image['width']}x{image['channels']} {image['encoding']},"
        f" resize {image['resize_method']}",
        f"  normalization (train): mean {[round(v, 2) for v in manifest['normalization']['mean']]}"
        f" std {[round(v, 2) for v in manifest['normalization']['std']]}",
    ]
    total_bytes = 0
    for split, info in manifest["splits"].items():
        split_bytes = sum(shard["num_bytes"] for shard in info["shards"])
        total_bytes += split_bytes
        per_class = ", ".join(f"{name} {count}" for name, count in info["num_examples_per_class"].items())
        lines.append(
            f"  {split}: {info['num_examples']} examples in {len(info['shards'])} shards ({_size(split_bytes)}): {per_class}"
        )
    lines.append(f"  total size: {_size(total_bytes)}")
    if inputs["failures_by_reason"]:
        reasons = ", ".join(f"{reason} {count}" for reason, count in inputs["failures_by_reason"].items())
        lines.append(
            f"  failures: {reasons} (details: {manifest_lib.join(output_dir, manifest_lib.ERRORS_FILE)})"
        )
    lines.append(f"  manifest: {manifest_lib.join(output_dir, manifest_lib.MANIFEST_FILE)}")
    return "\n".join(lines)
