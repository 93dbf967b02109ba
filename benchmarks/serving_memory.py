"""Serving memory per image: peak RSS growth of a serving process for each adversarial file, vs. the code before.

    python -m benchmarks.serving_memory --workdir /tmp/bench-serving

Exports a model (the small CNN, 224x224 crop, the default limits) with the
current serving code (`train.serving.export`), and the same model behind the serving
code as it was before issue 14 (train/serving_image.py at --baseline-commit,
read with `git show`). Then, for each file of benchmarks/adversarial_images.py
and each export, a fresh process loads the SavedModel, warms it up on an
ordinary photo, resets the kernel's peak-RSS mark (/proc/self/clear_refs),
sends the one file as a batch of one, and reports VmHWM - VmRSS before the
request: the peak growth, whatever the allocator did in between (no sampling
to miss a spike). Target (issue 14): <= 300 MB for any single image at 224.

Baseline cases that would need more than --baseline-max-gb (default 10) are
skipped and say so, with the estimate: the 1x65500 JPEG (a 224 x 14.7M float
resize, ~39 GB) and the 23000^2 RGBA PNG (2.1 GB decoded, ~13 GB with the
int32 alpha blend and float resize of the old code).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from benchmarks.adversarial_images import (
    ADVERSARIAL_IMAGES,
    animated_gif,
    black_png,
    encode,
    gradient,
    one_row_png,
    ordinary_jpeg,
)
from benchmarks.measure import (
    finish_report,
    format_table,
    machine_line,
    reset_peak_rss,
    status_bytes,
    timed,
)

TARGET_BYTES = 300 * 10**6
BASELINE_COMMIT = "1c70835"  # main before issue 14
# What the code before issue 14 needs for the cases it cannot be run on here (issue 14's estimates).
BASELINE_ESTIMATES_GB = {"jpeg_1x65500": 39, "png_23000_rgba": 13}
_LABELS = ["a", "b", "c"]


def tiny_images() -> dict:
    """Small stand-ins for the smoke test: the same kinds at a size that costs nothing."""
    from PIL import Image  # noqa: PLC0415 - only the tiny mode needs it here

    return {
        "png_1x1000": ("1x1000 RGB PNG", lambda: one_row_png(1000)),
        "png_300_rgba": ("300x300 RGBA PNG", lambda: black_png(300, 300, alpha=True)),
        "gif_5_frames": ("5-frame 64x64 GIF", lambda: animated_gif(5, 64)),
        "jpeg_progressive_200": (
            "progressive 200x200 JPEG",
            lambda: encode(Image.fromarray(gradient(200, 200)), "JPEG", progressive=True),
        ),
    }


def manifest_for(size: int) -> dict:
    return {
        "image": {"height": size, "width": size, "channels": 3, "encoding": "uint8", "resize_method": "crop"},
        "labels": _LABELS,
        "normalization": {"mean": [120.0] * 3, "std": [60.0] * 3},
    }


def export_current(directory: str, size: int) -> str:
    from train.data import dataset  # noqa: PLC0415 - TensorFlow only in this step
    from train.model import models
    from train.serving import export  # noqa: PLC0415

    manifest = manifest_for(size)
    image_format = dataset.ImageFormat.from_manifest(manifest)
    model = models.build_model_for_dataset(models.SMALL_CNN, image_format, len(_LABELS))
    return export.export_serving_model(model, manifest, directory)


def export_baseline(directory: str, size: int, commit: str, repository: str) -> str | None:
    """The same model behind train/serving_image.py as of `commit` (decode_and_resize_batch, map_fn).

    None when git cannot show that commit (no git, a shallow clone).
    """
    shown = subprocess.run(
        ["git", "-C", repository, "show", f"{commit}:train/serving_image.py"], capture_output=True, text=True
    )
    if shown.returncode != 0:
        return None
    source = shown.stdout
    module_dir = tempfile.mkdtemp(prefix="serving_baseline_")
    with open(os.path.join(module_dir, "serving_image_baseline.py"), "w") as handle:
        handle.write(source)
    sys.path.insert(0, module_dir)
    import keras  # noqa: PLC0415
    import serving_image_baseline  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from train.data import dataset  # noqa: PLC0415
    from train.model import models

    manifest = manifest_for(size)
    model = models.build_model_for_dataset(
        models.SMALL_CNN, dataset.ImageFormat.from_manifest(manifest), len(_LABELS)
    )
    labels = tf.constant(_LABELS)

    def serve(image_bytes):
        pixels = serving_image_baseline.decode_and_resize_batch(image_bytes, size, "crop")
        probabilities = tf.cast(model(pixels, training=False), tf.float32)
        return {"probabilities": probabilities, "label": tf.gather(labels, tf.argmax(probabilities, axis=-1))}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        name="serving_default",
        fn=serve,
        input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")],
    )
    archive.write_out(directory, verbose=False)
    return directory


def measure_child(export_dir: str, image_path: str) -> dict:
    """In a fresh process: peak RSS growth while serving one file (after a warm-up request)."""
    import tensorflow as tf  # noqa: PLC0415

    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    warmup = ordinary_jpeg()
    serve(image_bytes=tf.constant([warmup]))
    with open(image_path, "rb") as handle:
        batch = tf.constant([handle.read()])
    reset_peak_rss()
    before = status_bytes("VmRSS")
    with timed() as timing:
        try:
            outputs = serve(image_bytes=batch)
            result = {
                "valid": bool(outputs["valid"].numpy()[0]) if "valid" in outputs else True,
                "error": outputs["error"].numpy()[0].decode() if "error" in outputs else "",
            }
        except tf.errors.OpError as error:
            result = {
                "valid": False,
                "error": f"raised {type(error).__name__}: {error.message.splitlines()[0][:120]}",
            }
    return {**result, "seconds": timing.wall_seconds, "peak_growth_bytes": status_bytes("VmHWM") - before}


def run_child(export_dir: str, image_path: str, timeout: float) -> dict:
    argv = [sys.executable, "-m", "benchmarks.serving_memory", "--child", export_dir, image_path]
    try:
        completed = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {
            "valid": False,
            "error": f"timed out after {timeout:.0f} s",
            "peak_growth_bytes": None,
            "seconds": None,
        }
    for line in completed.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (completed.stderr or "").strip().splitlines()[-1:] or ["no output"]
    return {
        "valid": False,
        "error": f"process died ({completed.returncode}): {tail[0][:120]}",
        "peak_growth_bytes": None,
        "seconds": None,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.serving_memory", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--workdir", default="/tmp/bench-serving")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--baseline-commit", default=BASELINE_COMMIT)
    parser.add_argument("--no-baseline", action="store_true", help="Only measure the current code.")
    parser.add_argument("--baseline-max-gb", type=float, default=10.0)
    parser.add_argument("--cases", default=None, help="Comma-separated case names (default: all).")
    parser.add_argument("--timeout", type=float, default=600.0, help="Seconds per measured request.")
    parser.add_argument("--json", default=None, help="Also write every figure to this JSON file.")
    parser.add_argument("--tiny", action="store_true", help="Smoke test: small stand-ins, 32 px.")
    parser.add_argument("--child", nargs=2, metavar=("EXPORT_DIR", "IMAGE"), help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(measure_child(*args.child)), flush=True)
        return {}
    images = tiny_images() if args.tiny else dict(ADVERSARIAL_IMAGES)
    if args.tiny:
        args.image_size = 32
    if args.cases:
        images = {name: images[name] for name in args.cases.split(",")}
    os.makedirs(args.workdir, exist_ok=True)
    print(machine_line(), flush=True)
    repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exports = {"current": export_current(os.path.join(args.workdir, "export_current"), args.image_size)}
    baseline_missing = None
    if not args.no_baseline:
        exports["before"] = export_baseline(
            os.path.join(args.workdir, "export_before"), args.image_size, args.baseline_commit, repository
        )
        if exports["before"] is None:
            baseline_missing = f"commit {args.baseline_commit} not in this clone"
            print(f"the code before: {baseline_missing}; measuring the current code only", flush=True)
    results = {}
    for name, (description, make) in images.items():
        path = os.path.join(args.workdir, f"{name}.img")
        data = make()
        with open(path, "wb") as handle:
            handle.write(data)
        results[name] = {"description": description, "file_bytes": len(data)}
        for contender, export_dir in exports.items():
            estimate = BASELINE_ESTIMATES_GB.get(name) if contender == "before" and not args.tiny else None
            if contender == "before" and baseline_missing:
                results[name][contender] = {"skipped": baseline_missing}
            elif estimate is not None and estimate > args.baseline_max_gb:
                results[name][contender] = {"skipped": f"needs ~{estimate} GB"}
            else:
                results[name][contender] = run_child(export_dir, path, args.timeout)
            print(f"  {name} {contender}: {results[name][contender]}", flush=True)
    rows = []
    for name, result in results.items():
        row = [name, f"{result['file_bytes']:,}", _outcome(result["current"]), _mb(result["current"])]
        if "before" in exports:
            before = result["before"]
            row += [_outcome(before), _mb(before), _ratio(before, result["current"])]
        rows.append(row)
    header = ["file", "bytes", "now: result", "now: peak RSS growth MB"]
    if "before" in exports:
        header += ["before: result", "before: peak RSS growth MB", "before / now"]
    print()
    print(format_table(header, rows))
    growths = [
        r["current"]["peak_growth_bytes"] for r in results.values() if r["current"].get("peak_growth_bytes")
    ]
    worst = max(growths) if growths else 0
    verdict = "met" if worst <= TARGET_BYTES else "NOT met"
    print(
        f"\nlargest peak RSS growth now: {worst / 1e6:,.0f} MB; target <= {TARGET_BYTES / 1e6:.0f} MB: {verdict}"
    )
    return finish_report({"image_size": args.image_size, "results": results, "worst_bytes": worst}, args.json)


def _outcome(result: dict) -> str:
    if "skipped" in result:
        return f"not run ({result['skipped']})"
    if result.get("valid"):
        return "valid"
    return result.get("error", "")[:70]


def _mb(result: dict) -> str:
    growth = result.get("peak_growth_bytes")
    return "-" if growth is None else f"{growth / 1e6:,.0f}"


def _ratio(before: dict, now: dict) -> str:
    if before.get("peak_growth_bytes") is None or not now.get("peak_growth_bytes"):
        return "-"
    return f"{before['peak_growth_bytes'] / max(now['peak_growth_bytes'], 1e6):,.1f}x"


if __name__ == "__main__":
    main(sys.argv[1:])
