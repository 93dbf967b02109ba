"""Stage 1's fixed cost with and without Beam's parameter look-ups remembered (preprocess/launch/beam_signatures.py).

    python -m benchmarks.beam_signatures --repeats 3

Runs stage 1 on a tiny photo corpus (8 images, 32 px) in process (the in-memory runner: what a small corpus
and the tests run), each run in a fresh Python, in turns: as stage 1 runs (`remembered`), and with Beam's own
look-up put back after `preprocess.pipeline` is imported (`beam's own`). Prints the whole process tree's CPU
seconds per job and the ratio per repetition. Worker processes are not compared here: the local worker
remembers from its start (preprocess/launch/local_worker.py), and no switch turns that off.
"""

import argparse
import os
import shutil
import sys
import tempfile

from benchmarks import corpus as corpus_lib
from benchmarks.measure import finish_report, machine_line, median, run_measured

REMEMBERED = "remembered"
BEAMS_OWN = "beam's own"
_RUN = """
import sys
if sys.argv[1] == "own":
    import preprocess.pipeline  # remembers, as every run does
    from apache_beam.transforms import core
    from preprocess.launch import beam_signatures
    core.get_function_args_defaults = beam_signatures._BEAMS_OWN
from preprocess.launch.command import main
main(sys.argv[2:])
"""


def stage1_cpu_seconds(variant: str, corpus: str, workdir: str) -> float:
    output = os.path.join(workdir, "out")
    shutil.rmtree(output, ignore_errors=True)
    argv = [sys.executable, "-c", _RUN, "own" if variant == BEAMS_OWN else "remembered"]
    argv += ["--input", corpus, "--output", output, "--image-size", "32", "--max-failed-fraction", "1"]
    result = run_measured(argv, log_path=os.path.join(workdir, "log.txt"))
    shutil.rmtree(output, ignore_errors=True)
    return result.tree_cpu_seconds


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "bench-stage1"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="Also write every figure to this JSON file.")
    args = parser.parse_args(argv)
    corpus = corpus_lib.photo_corpus(args.cache, 8, unique=8, megapixels=corpus_lib.TINY_MEGAPIXELS)
    print(machine_line())
    print(
        f"corpus: {corpus}: 8 tiny photos, stage 1 in process at 32 px, {args.repeats} repetitions in turns"
    )
    runs = {REMEMBERED: [], BEAMS_OWN: []}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            order = [REMEMBERED, BEAMS_OWN] if repeat % 2 == 0 else [BEAMS_OWN, REMEMBERED]
            for variant in order:
                runs[variant].append(stage1_cpu_seconds(variant, corpus, workdir))
            print(
                f"  repeat {repeat}: CPU s per job, {REMEMBERED} {runs[REMEMBERED][-1]:.2f}, "
                f"{BEAMS_OWN} {runs[BEAMS_OWN][-1]:.2f}",
                flush=True,
            )
    ratios = [mine / own for mine, own in zip(runs[REMEMBERED], runs[BEAMS_OWN], strict=True)]
    print(
        f"stage 1's CPU per job, remembered / Beam's own: median {median(ratios):.3f} "
        f"({', '.join(f'{ratio:.3f}' for ratio in ratios)}); CPU s {median(runs[REMEMBERED]):.2f} vs "
        f"{median(runs[BEAMS_OWN]):.2f}"
    )
    return finish_report({"cpu_seconds": runs, "ratios": ratios}, args.json)


if __name__ == "__main__":
    main()
