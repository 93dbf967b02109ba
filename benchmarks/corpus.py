"""The benchmarks' corpus: realistic photos (1-3 MP JPEGs at quality 90), generated once and cached.

Rendering a photo-like image costs about as much CPU as the whole of stage 1
spends on it (0.3-0.7 s per image on one core), so the benchmarks render a
pool of `unique` photos once (`pipelines.sample_corpus.write_photo_corpus`)
and make larger corpora from that pool: the first `unique` files are hard
links to the pool, every further file is a *variant* of a pool photo, the
same JPEG with a comment segment (`COM`, "variant k") inserted after the
start-of-image marker. A variant has other bytes (so another sha256: stage 1
keeps it, it is not a duplicate), the same pixels, the same decode cost and
about the same size, which is what a throughput or memory benchmark needs.
Accuracy benchmarks must not use variants (copies in two splits would leak);
they use the shape corpus or a pool without variants.

    python -m benchmarks.corpus --cache /tmp/bench-cache --num 4000 --unique 1000

prints the corpus directory (created if it is not cached yet).
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

from pipelines.sample_corpus import write_photo_corpus

_COMPLETE = ".complete.json"
PHOTO_MEGAPIXELS = (1.0, 3.0)
# For smoke tests: small photos render and decode in milliseconds.
TINY_MEGAPIXELS = (0.02, 0.05)
_SOI = b"\xff\xd8"


def with_comment(jpeg: bytes, text: str) -> bytes:
    """The same JPEG with a COM segment holding `text` right after SOI (decodes to the same pixels)."""
    if jpeg[:2] != _SOI:
        raise ValueError("not a JPEG (no SOI marker)")
    payload = text.encode("ascii")
    segment = b"\xff\xfe" + (len(payload) + 2).to_bytes(2, "big") + payload
    return _SOI + segment + jpeg[2:]


def _read_marker(directory: str) -> dict | None:
    try:
        with open(os.path.join(directory, _COMPLETE)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _write_marker(directory: str, content: dict) -> None:
    with open(os.path.join(directory, _COMPLETE), "w") as handle:
        json.dump(content, handle, indent=2, sort_keys=True)


def photo_pool(
    cache_dir: str,
    unique: int,
    *,
    classes: int = 4,
    seed: int = 0,
    processes: int = 2,
    megapixels: tuple[float, float] = PHOTO_MEGAPIXELS,
) -> str:
    """`unique` distinct photos under `cache_dir/photos-pool-...` (rendered once, then reused)."""
    low, high = megapixels
    directory = os.path.join(cache_dir, f"photos-pool-{unique}-c{classes}-s{seed}-mp{low:g}-{high:g}")
    params = {"unique": unique, "classes": classes, "seed": seed, "megapixels": [low, high]}
    marker = _read_marker(directory)
    if marker is not None and marker.get("params") == params:
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    start = time.perf_counter()
    info = write_photo_corpus(
        directory, num_images=unique, classes=classes, seed=seed, processes=processes, megapixels=(low, high)
    )
    files = [{"path": f.path, "class_name": f.class_name} for f in info.files]
    _write_marker(
        directory, {"params": params, "files": files, "render_seconds": round(time.perf_counter() - start, 1)}
    )
    return directory


def photo_corpus(
    cache_dir: str,
    num_images: int,
    *,
    unique: int | None = None,
    classes: int = 4,
    seed: int = 0,
    processes: int = 2,
    megapixels: tuple[float, float] = PHOTO_MEGAPIXELS,
) -> str:
    """A directory tree ROOT/<class>/<file>.jpg of `num_images` photos, `unique` of them distinct renders.

    Files beyond `unique` are COM-segment variants of the pool (see the module
    docstring). The tree is cached under `cache_dir` by its parameters.
    """
    unique = min(unique or num_images, num_images)
    pool = photo_pool(
        cache_dir, unique, classes=classes, seed=seed, processes=processes, megapixels=megapixels
    )
    if num_images == unique:
        return pool
    directory = os.path.join(cache_dir, f"photos-{num_images}-from-{os.path.basename(pool)}")
    params = {"num_images": num_images, "pool": os.path.basename(pool)}
    marker = _read_marker(directory)
    if marker is not None and marker.get("params") == params:
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    pool_files = _read_marker(pool)["files"]
    for index in range(num_images):
        source = pool_files[index % unique]
        copy = index // unique
        class_dir = os.path.join(directory, source["class_name"])
        os.makedirs(class_dir, exist_ok=True)
        stem, extension = os.path.splitext(os.path.basename(source["path"]))
        source_path = os.path.join(pool, *source["path"].split("/"))
        if copy == 0:
            os.link(source_path, os.path.join(class_dir, stem + extension))
            continue
        with open(source_path, "rb") as handle:
            data = with_comment(handle.read(), f"variant {copy}")
        with open(os.path.join(class_dir, f"{stem}_v{copy}{extension}"), "wb") as handle:
            handle.write(data)
    _write_marker(directory, {"params": params})
    return directory


def stage1_dataset(
    cache_dir: str,
    corpus_dir: str,
    *,
    image_size: int,
    encoding: str,
    extra_args: tuple[str, ...] = (),
    workers: int = 2,
) -> str:
    """The dataset directory stage 1 writes from `corpus_dir` (run once per parameters, then cached).

    `corpus_dir` may also be a CSV/JSONL manifest. Runs the real job
    (`python -m preprocess` on the DirectRunner with `workers` processes).
    """
    name = f"{os.path.basename(corpus_dir.rstrip('/'))}-{image_size}-{encoding}"
    if extra_args:
        name += "-" + hashlib.sha256(" ".join(extra_args).encode()).hexdigest()[:8]
    directory = os.path.join(cache_dir, "datasets", name)
    params = {"corpus": os.path.abspath(corpus_dir), "image_size": image_size, "encoding": encoding}
    params["extra_args"] = list(extra_args)
    marker = _read_marker(directory)
    if marker is not None and marker.get("params") == params:
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    argv = [sys.executable, "-m", "preprocess", "--input", corpus_dir, "--output", directory]
    argv += ["--image-size", str(image_size), "--encoding", encoding, *extra_args]
    # A benchmark measures speed, not the corpus: its tiny sizes may leave a class out of train.
    argv += ["--max-failed-fraction", "1"]
    argv += ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]
    completed = subprocess.run(argv, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(
            f"stage 1 failed ({' '.join(argv)}):\n{completed.stdout[-3000:]}{completed.stderr[-3000:]}"
        )
    _write_marker(directory, {"params": params})
    return directory


def corpus_files(root: str) -> list[tuple[str, str]]:
    """(path, class name) of every image of a ROOT/<class>/<file> tree, sorted."""
    found = []
    for class_name in sorted(os.listdir(root)):
        class_dir = os.path.join(root, class_name)
        if not os.path.isdir(class_dir):
            continue
        for name in sorted(os.listdir(class_dir)):
            if not name.startswith("."):
                found.append((os.path.join(class_dir, name), class_name))
    return found


def corpus_bytes(root: str) -> int:
    return sum(os.path.getsize(path) for path, _ in corpus_files(root))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.corpus", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", required=True, help="Directory holding the cached corpora.")
    parser.add_argument("--num", type=int, required=True, help="Images in the corpus.")
    parser.add_argument("--unique", type=int, default=None, help="Distinct renders (default: --num).")
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=2, help="Render in parallel (default 2).")
    return parser


def main(argv=None) -> str:
    args = build_parser().parse_args(argv)
    root = photo_corpus(
        args.cache,
        args.num,
        unique=args.unique,
        classes=args.classes,
        seed=args.seed,
        processes=args.processes,
    )
    files = corpus_files(root)
    print(f"{root}: {len(files)} images, {corpus_bytes(root) / 1e6:.0f} MB")
    return root


if __name__ == "__main__":
    main(sys.argv[1:])
