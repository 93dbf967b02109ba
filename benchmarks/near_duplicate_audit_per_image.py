"""The near-duplicate audit's work per image, by thread CPU in one process: what the decode step adds with it.

    python -m benchmarks.near_duplicate_audit_per_image --num-images 600 --repeats 4
    python -m benchmarks.near_duplicate_audit_per_image --corpus /tmp/i30cost/cache/photos-pool-3200-c4-s0-mp1-3 --repeats 5

Runs stage 1's decode step (DecodeImagesFn: read, decode, orient, resize) over the same photos three ways:
without the audit; with the source signature (`signatures=True`); and with the signature, the spill of each
decoded example to Arrow part files and the routing's read-back of every part (SpillDecodedFn, read_part).
The three take each image in turn, the first of them rotating from image to image: passes of whole variants
in turns moved by 10-15% with the machine's speed, more than the audit costs (benchmarks/RESULTS.md, issue
30's thirteenth pass). The clock is `time.thread_time`: what other processes take of the core is not
counted, and a job's start-up is not in it, so the per-image figure holds on a loaded machine where a whole
job's margin (`benchmarks.stage1_vs_handwritten --near-duplicate-audit`) moves by more than the audit costs.
The grouping's own CPU per image is `benchmarks.near_duplicate_grouping_cpu`; a whole job's, the benchmark
above.
"""

import argparse
import os
import tempfile
import time

from benchmarks import corpus as corpus_lib
from benchmarks.measure import finish_report, machine_line, median

DECODE = "decode"
SIGNATURE = "decode + signature"
SPILL = "decode + signature + spill + read-back"
VARIANTS = (DECODE, SIGNATURE, SPILL)


def decode_step_ms_per_image(inputs: list, image_size: int, workdir: str, first: int = 0) -> dict:
    """{variant: thread CPU ms per image of the decode step (and the audit's per-image parts)} over `inputs`.

    The variants take each image in turn, the first of them rotating from one image to the next (from
    `first`), so that a drift of the machine's speed over the pass, or a cache warmed by the variant before,
    weighs on each variant alike: the differences between variants are measured far below the spread of
    whole passes. The spill's read-back of every part comes last and is the spill variant's."""
    from preprocess.decode.stage import DecodeImagesFn  # noqa: PLC0415 - after argument parsing
    from preprocess.near_duplicates.routing import SpillDecodedFn, read_part  # noqa: PLC0415

    decoders = {
        variant: DecodeImagesFn(image_size, "crop", 1 << 40, signatures=variant != DECODE)
        for variant in VARIANTS
    }
    spill = SpillDecodedFn(workdir)
    for decoder in decoders.values():
        decoder.start_bundle()
    spill.start_bundle()
    seconds = dict.fromkeys(VARIANTS, 0.0)
    parts = []
    for index, item in enumerate(inputs):
        turn = (first + index) % len(VARIANTS)
        for variant in VARIANTS[turn:] + VARIANTS[:turn]:
            start = time.thread_time()
            for example in decoders[variant].process(item, None):
                if variant == SPILL:
                    # The main output (a SignedImage) is what grouping takes; a part's path comes tagged.
                    parts += [
                        output.value for output in spill.process(example, "run") if hasattr(output, "tag")
                    ]
            seconds[variant] += time.thread_time() - start
    start = time.thread_time()
    parts += [output.value.value for output in spill.finish_bundle()]
    for path in parts:
        for _ in read_part(path):
            pass
    seconds[SPILL] += time.thread_time() - start
    for decoder in decoders.values():
        decoder.finish_bundle()
    return {variant: value / len(inputs) * 1000 for variant, value in seconds.items()}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "bench-stage1"))
    parser.add_argument(
        "--corpus",
        help="An existing ROOT/<class>/<file> tree (e.g. stage1_vs_handwritten's): --num-images of it.",
    )
    parser.add_argument("--num-images", type=int, default=600)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--tiny", action="store_true", help="8 tiny photos, one repetition (a smoke run).")
    parser.add_argument("--json", help="Also write every figure to this JSON file.")
    args = parser.parse_args(argv)
    if args.tiny:
        args.num_images, args.image_size, args.repeats = 8, 32, 1
    megapixels = corpus_lib.TINY_MEGAPIXELS if args.tiny else corpus_lib.PHOTO_MEGAPIXELS
    corpus = args.corpus or corpus_lib.photo_corpus(
        args.cache, args.num_images, unique=args.num_images, megapixels=megapixels
    )

    from preprocess.inputs.content import UniqueInput  # noqa: PLC0415 - after argument parsing

    files = corpus_lib.corpus_files(corpus)
    # Spread over the classes (the files are sorted by class).
    files = files[:: max(1, len(files) // args.num_images)][: args.num_images]
    inputs = [UniqueInput(path, label, "train", size=os.path.getsize(path)) for path, label in files]
    for path, _ in files:  # in the page cache before the first variant runs, as for the others
        with open(path, "rb") as handle:
            handle.read()
    print(machine_line())
    print(
        f"corpus: {corpus}: {len(inputs)} photos at {args.image_size} px, one thread, "
        f"{args.repeats} repetitions, the variants in turns on each image"
    )
    runs = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            measured = decode_step_ms_per_image(
                inputs, args.image_size, os.path.join(workdir, str(repeat)), first=repeat
            )
            for variant in VARIANTS:
                runs[variant].append(measured[variant])
            print(
                f"  repeat {repeat}: thread CPU ms per image, "
                + ", ".join(f"{variant} {runs[variant][-1]:.3f}" for variant in VARIANTS),
                flush=True,
            )
    medians = {variant: median(values) for variant, values in runs.items()}
    ratios = [audit / plain for audit, plain in zip(runs[SPILL], runs[DECODE], strict=True)]
    figures = {
        "ms_per_image": runs,
        "medians": medians,
        "signature_ms": medians[SIGNATURE] - medians[DECODE],
        "spill_and_read_back_ms": medians[SPILL] - medians[SIGNATURE],
        "added_ms": medians[SPILL] - medians[DECODE],
        "ratios": ratios,
    }
    print(
        f"the audit's work per image in the decode step (medians): signature {figures['signature_ms']:.3f} ms, "
        f"spill and read-back {figures['spill_and_read_back_ms']:.3f} ms, together {figures['added_ms']:.3f} ms "
        f"on {medians[DECODE]:.3f} ms of decoding"
    )
    print(
        f"decode step with the audit's parts / without: median {median(ratios):.3f} "
        f"({', '.join(f'{ratio:.3f}' for ratio in ratios)})"
    )
    return finish_report(figures, args.json)


if __name__ == "__main__":
    main()
