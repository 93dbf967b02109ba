"""GCS requests per input image of a whole stage 1 run, on the emulator: this code vs. a baseline checkout.

    git archive 91f7c33 | (mkdir -p /tmp/stage1-before && tar -x -C /tmp/stage1-before)
    python -m benchmarks.gcs_requests --baseline /tmp/stage1-before --images-per-class 20

Starts the GCS emulator and the tests' forwarder in front of it (tests/gcs_emulator.py), uploads a
corpus of small JPEGs (a folder per class, a few exact copies among them), and runs
`python -m preprocess --input gs://.../raw --output gs://.../out` (DirectRunner, in process) once per
checkout, each in a fresh process whose GCS client goes through the forwarder. The forwarder sees every
request; the table counts those that concern the input objects (their downloads, their metadata
requests; listings below the input prefix), divided by the number of input files. Writes to the output
directory are not counted: they do not depend on how inputs are read.

Where a bucket's read rate bounds a large job (about 5,000 object reads/s when a bucket starts, ramping
up over time), downloads per image are the figure that matters.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DUPLICATES = 2  # exact copies added to the corpus: their reads are counted too


def _upload_corpus(emulator, images_per_class: int, workdir: Path) -> int:
    """Uploads the sample corpus (no broken files) plus DUPLICATES copies under raw/; returns the file count."""
    from google.cloud import storage

    from pipelines.sample_corpus import write_sample_corpus

    local = workdir / "corpus"
    write_sample_corpus(str(local), images_per_class=images_per_class, seed=0, include_broken=False)
    files = sorted(path for path in local.rglob("*") if path.is_file())
    bucket = storage.Client().bucket(emulator.bucket)
    for path in files:
        bucket.blob(f"raw/{path.relative_to(local).as_posix()}").upload_from_filename(str(path))
    for index, path in enumerate(files[:DUPLICATES]):
        bucket.blob(f"raw/{path.parent.name}/copy-{index}{path.suffix}").upload_from_filename(str(path))
    return len(files) + DUPLICATES


def _run_stage1(code_dir: Path, env: dict, emulator, output: str) -> float:
    argv = [
        sys.executable,
        "-m",
        "preprocess",
        "--input",
        emulator.url("raw"),
        "--output",
        emulator.url(output),
        "--image-size",
        "32",
        "--encoding",
        "uint8",
        "--max-failed-fraction",
        "1",
    ]
    started = time.monotonic()
    subprocess.run(
        argv,
        cwd=code_dir,
        env={**env, "PYTHONPATH": str(code_dir)},
        check=True,
        capture_output=True,
        text=True,
    )
    return time.monotonic() - started


def measure(code_dirs: dict[str, Path], images_per_class: int) -> dict:
    sys.path.insert(0, str(REPO_ROOT))
    from tests.gcs_emulator import FaultInjectingForwarder, GcsEmulator

    workdir = Path(tempfile.mkdtemp(prefix="gcs-requests-"))
    emulator = GcsEmulator.start(workdir / "emulator")
    previous = {name: os.environ.get(name) for name in emulator.env}
    os.environ.update(emulator.env)
    forwarder = FaultInjectingForwarder(emulator.emulator, emulator.env)
    try:
        num_files = _upload_corpus(emulator, images_per_class, workdir)
        env = {**os.environ, **forwarder.env, "NO_GCE_CHECK": "true", "TPU_LOAD_LIBRARY": "0"}
        report = {"num_files": num_files, "runs": {}}
        for label, code_dir in code_dirs.items():
            before = len(forwarder.requests)
            seconds = _run_stage1(code_dir, env, emulator, f"out-{label}")
            kinds = collections.Counter(
                kind for kind, name in forwarder.requests[before:] if name.startswith("raw/")
            )
            report["runs"][label] = {
                "code": str(code_dir),
                "seconds": round(seconds, 1),
                "requests": dict(kinds),
                "per_image": {kind: round(count / num_files, 3) for kind, count in sorted(kinds.items())},
            }
        return report
    finally:
        forwarder.stop()
        emulator.stop()
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def format_report(report: dict) -> str:
    lines = [
        f"{report['num_files']} input files ({DUPLICATES} of them exact copies); GCS requests per input file:",
        f"{'code':<10} {'downloads':>10} {'metadata':>10} {'listings':>10} {'all':>8} {'seconds':>8}",
    ]
    for label, run in report["runs"].items():
        per = run["per_image"]
        total = sum(run["requests"].values()) / report["num_files"]
        lines.append(
            f"{label:<10} {per.get('media', 0):>10.3f} {per.get('metadata', 0):>10.3f} "
            f"{per.get('listing', 0):>10.3f} {total:>8.3f} {run['seconds']:>8.1f}"
        )
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gcs_requests", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--baseline", type=Path, help="a checkout of the code to compare with (e.g. git archive)"
    )
    parser.add_argument("--images-per-class", type=int, default=20)
    parser.add_argument("--tiny", action="store_true", help="a few images, for the smoke test")
    args = parser.parse_args(argv)
    code_dirs = {"before": args.baseline} if args.baseline else {}
    code_dirs["after"] = REPO_ROOT
    report = measure(code_dirs, 2 if args.tiny else args.images_per_class)
    print(format_report(report))
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
