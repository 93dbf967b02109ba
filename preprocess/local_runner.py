"""The engine that runs stage 1 on this machine when the runner is the DirectRunner.

Beam 2.77's DirectRunner does not run a batch pipeline itself: it first tries
the Prism runner (a Go binary it downloads on first use), and runs the
pipeline there if that works, else falls back to the FnApiRunner, the
in-process portable runner with its `--direct_num_workers` SDK worker
processes. Stage 1 asks for the FnApiRunner directly, for two reasons:

- the same job runs the same way on every machine: with network access the
  DirectRunner would run it on Prism, offline on the FnApiRunner, and the
  README's `--direct_running_mode` / `--direct_num_workers` are the
  FnApiRunner's options;
- the failed Prism attempt is not free: it serializes the whole pipeline
  (~150 stages after tf.Transform's expansion) once more before falling back,
  ~12 s of a small job on a 2-core machine (benchmarks/RESULTS.md, target 1).

Any other runner (Dataflow, `--runner PrismRunner`, ...) is left to Beam.
"""

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

_DIRECT_RUNNER_NAMES = {"directrunner", "direct", "switchingdirectrunner"}


def uses_direct_runner(options: PipelineOptions) -> bool:
    """True when the user named no runner or the DirectRunner."""
    runner = options.view_as(StandardOptions).runner
    if runner is None:
        return True
    if not isinstance(runner, str):
        return False
    return runner.rsplit(".", 1)[-1].lower() in _DIRECT_RUNNER_NAMES


def fn_api_runner(options: PipelineOptions):
    """An FnApiRunner set up as the DirectRunner sets it up: its workers receive the job's options."""
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded_options = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    provision_info = fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded_options)
    )
    return fn_runner.FnApiRunner(provision_info=provision_info)


def runner_for(options: PipelineOptions):
    """The runner object to hand to beam.Pipeline, or None to let Beam pick from --runner."""
    return fn_api_runner(options) if uses_direct_runner(options) else None
