"""An SDK worker's memory: the listing, hashing and deduplication stages vs the stages that need TensorFlow.

    python -m benchmarks.worker_memory [--encoding uint8] [--json worker_memory.json]

A Dataflow worker runs one SDK process per vCPU, and each process loads the
code of the stages it runs. This builds the real stage-1 pipeline, fuses it
into stages the way the local runner does (the FnApiRunner's fusion), and
starts a fresh process that does what an SDK worker does before it runs a
bundle of a stage: it imports Beam's harness (preprocess/launch/local_worker.py),
then builds every step of the stage from the pipeline proto, as Beam's
bundle processor does (unpickles its DoFn or CombineFn, builds the coders of
its inputs and outputs). It reports the process's RSS (VmRSS) after

  1. the harness alone,
  2. the listing, hashing and deduplication stages (every stage that holds
     a step of ListInputs or Deduplicate, with whatever fusion put with it),
  3. every other stage too (decoding, encoding, tf.Transform's analysis),

and which of TensorFlow, tf.Transform and TFX-BSL each step loaded.
tests/preprocess/launch/test_lean_workers.py holds step 2 free of TensorFlow.
"""

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile

from benchmarks.measure import finish_report, format_table, machine_description

HARNESS = "harness"
LISTING_AND_DEDUP = "listing_and_dedup"
OTHER_STAGES = "other_stages"
HEAVY_MODULES = ("tensorflow", "tensorflow_transform", "tfx_bsl")
# The top-level steps (build_pipeline's labels) that list, hash and deduplicate.
_LISTING_AND_DEDUP_STEPS = ("ListInputs", "Deduplicate")


def fused_stages(encoding: str, more_args=()):
    """(components, stages) of the real stage-1 pipeline for `encoding` (and `more_args`, stage 1's flags),
    fused as the local runner fuses them."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    from preprocess import pipeline as stage1
    from preprocess.options import parse_args

    with tempfile.TemporaryDirectory() as scratch:
        args, beam_args = parse_args(
            ["--input", os.path.join(scratch, "images"), "--output", os.path.join(scratch, "dataset")]
            + ["--encoding", encoding, *more_args]
        )
        pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
        stage1.build_pipeline(pipeline, args, "benchmark")
        context, stages = fn_runner.FnApiRunner().create_stages(pipeline.to_runner_api())
    return context.components, stages


def lists_hashes_or_deduplicates(stage) -> bool:
    return any(t.unique_name.split("/")[0] in _LISTING_AND_DEDUP_STEPS for t in stage.transforms)


def write_stages(path: str, encoding: str) -> None:
    """The pipeline's components and its stages' steps, by group, as JSON (protos in base64)."""
    components, stages = fused_stages(encoding)
    groups = {LISTING_AND_DEDUP: [], OTHER_STAGES: []}
    for stage in stages:
        group = LISTING_AND_DEDUP if lists_hashes_or_deduplicates(stage) else OTHER_STAGES
        groups[group].extend(base64.b64encode(t.SerializeToString()).decode() for t in stage.transforms)
    with open(path, "w") as handle:
        json.dump({"components": base64.b64encode(components.SerializeToString()).decode(), **groups}, handle)


def _rss_bytes() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _loaded(names) -> list[str]:
    return [name for name in names if name in sys.modules]


def load_stages_as_a_worker(path: str, groups: list[str]) -> list[dict]:
    """In this (fresh) process: the harness, then each group's steps built as Beam's bundle processor builds them.

    Returns one figure per point: {"after", "rss_bytes", "heavy_modules", "steps_that_loaded_them"}.
    """
    import preprocess.launch.local_worker  # noqa: F401 - Beam's harness, as the local runner's workers start

    figures = [{"after": HARNESS, "rss_bytes": _rss_bytes(), "heavy_modules": _loaded(HEAVY_MODULES)}]

    import apache_beam as beam
    from apache_beam.internal import pickler
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import beam_runner_api_pb2
    from apache_beam.runners import pipeline_context
    from apache_beam.transforms import core

    with open(path) as handle:
        data = json.load(handle)
    components = beam_runner_api_pb2.Components.FromString(base64.b64decode(data["components"]))
    context = pipeline_context.PipelineContext(components)

    def urns(group):
        return {value.urn for value in vars(group).values() if hasattr(value, "urn")}

    pardo_urns = {common_urns.primitives.PAR_DO.urn} | urns(common_urns.sdf_components)
    combine_urns = urns(common_urns.combine_components)

    def build(transform) -> None:
        if transform.spec.urn in pardo_urns:
            payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
            if payload.do_fn.urn:
                # bundle_processor.create_par_do / _create_pardo_operation
                pickler.loads(core.DoFnInfo.from_runner_api(payload.do_fn, context).serialized_dofn_data())
        elif transform.spec.urn in combine_urns:
            payload = beam_runner_api_pb2.CombinePayload.FromString(transform.spec.payload)
            beam.CombineFn.from_runner_api(payload.combine_fn, context)
        for pcollection_id in [*transform.inputs.values(), *transform.outputs.values()]:
            if pcollection_id in components.pcollections:
                pcollection = components.pcollections[pcollection_id]
                context.coders.get_by_id(pcollection.coder_id)
                context.windowing_strategies.get_by_id(pcollection.windowing_strategy_id)

    for group in groups:
        culprits = []
        for encoded in data[group]:
            transform = beam_runner_api_pb2.PTransform.FromString(base64.b64decode(encoded))
            before = set(_loaded(HEAVY_MODULES))
            build(transform)
            if set(_loaded(HEAVY_MODULES)) - before:
                culprits.append(transform.unique_name)
        figures.append(
            {
                "after": group,
                "rss_bytes": _rss_bytes(),
                "heavy_modules": _loaded(HEAVY_MODULES),
                "steps_that_loaded_them": culprits,
            }
        )
    return figures


def measure_worker(encoding: str = "uint8", groups=(LISTING_AND_DEDUP, OTHER_STAGES)) -> list[dict]:
    """Writes the stages of the pipeline, then loads `groups` of them in a fresh process; its figures."""
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "stages.json")
        write_stages(path, encoding)
        # The benchmarks package is not installed: the fresh process finds it in this checkout.
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        pythonpath = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "TPU_LOAD_LIBRARY": "0", "PYTHONPATH": pythonpath}
        result = subprocess.run(
            [sys.executable, "-m", "benchmarks.worker_memory", "--load", path, "--groups", ",".join(groups)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=scratch,
        )
    if result.returncode != 0:
        raise RuntimeError(f"loading the stages failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--encoding", default="uint8")
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--load", default=None, help=argparse.SUPPRESS)  # the worker-like child process
    parser.add_argument("--groups", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.load:
        print(json.dumps(load_stages_as_a_worker(args.load, args.groups.split(","))))
        return
    figures = measure_worker(args.encoding)
    print(machine_description())
    harness = figures[0]["rss_bytes"]
    rows = [
        [
            figure["after"],
            f"{figure['rss_bytes'] / 2**20:,.0f}",
            f"{(figure['rss_bytes'] - harness) / 2**20:+,.0f}",
            ", ".join(figure["heavy_modules"]) or "none",
        ]
        for figure in figures
    ]
    print(
        format_table(["a worker process after", "RSS MiB", "over the harness", "heavy modules loaded"], rows)
    )
    finish_report({"encoding": args.encoding, "points": figures}, args.json)


if __name__ == "__main__":
    main()
