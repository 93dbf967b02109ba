"""The engine that runs stage 1 on this machine when the runner is the DirectRunner."""

import itertools
import logging
import shlex
import sys

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

from preprocess.inputs import listing as inputs
from preprocess.launch import logs, progress

IN_MEMORY = "in_memory"


def uses_direct_runner(options: PipelineOptions) -> bool:
    """True when the user named no runner or the DirectRunner."""
    return progress.runner_name(options) in progress.DIRECT_RUNNERS


def runs_in_this_process(options: PipelineOptions) -> bool:
    """True when the DirectRunner runs the job in this process (--direct_running_mode=in_memory)."""
    return uses_direct_runner(options) and options.view_as(DirectOptions).direct_running_mode == IN_MEMORY


LOCAL_WORKER = "preprocess.launch.local_worker"


def worker_command(module: str = LOCAL_WORKER) -> str:
    """The command line of the local runner's worker processes (local_worker.py), `exec`ed by Beam's shell so
    that a Ctrl-C reaches the worker, not the shell."""
    return "exec " + shlex.join([sys.executable, "-m", module])


def fn_api_runner(options: PipelineOptions, verbose: bool = False, worker_module: str = LOCAL_WORKER):
    """An FnApiRunner set up as the DirectRunner sets it up: its workers (local_worker.py) receive the job's
    options, and log at WARNING unless `verbose`. `worker_module`: a benchmark's wrapper of local_worker.py."""
    from apache_beam.portability import python_urns
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    class LocalFnApiRunner(fn_runner.FnApiRunner):
        def run_via_runner_api(self, pipeline_proto, options):
            # run_pipeline has just named Beam's own worker command in the subprocess environment.
            for environment in pipeline_proto.components.environments.values():
                if environment.urn == python_urns.SUBPROCESS_SDK:
                    environment.payload = worker_command(worker_module).encode("utf-8")
            return super().run_via_runner_api(pipeline_proto, options)

    worker_options = logs.worker_log_options(options.get_all_options(), verbose)
    encoded_options = JobServiceHandle.encode_pipeline_options(worker_options)
    provision_info = fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded_options)
    )
    return LocalFnApiRunner(provision_info=provision_info)


def runner_for(options: PipelineOptions, verbose: bool = False):
    """The runner object to hand to beam.Pipeline, or None to let Beam pick from --runner."""
    return fn_api_runner(options, verbose) if uses_direct_runner(options) else None


def count_inputs_up_to(spec: str, limit: int) -> int | None:
    """How many inputs `spec` lists, counting no further than `limit` (a manifest: its non-blank lines);
    None if it cannot be listed here."""
    try:
        if inputs.input_kind(spec) == inputs.DIRECTORY:
            return sum(1 for _ in itertools.islice(inputs.list_directory_tree(spec), limit))
        with FileSystems.open(spec) as handle:
            return sum(1 for _ in itertools.islice(filter(bytes.strip, handle), limit))
    except Exception:  # noqa: BLE001 - a missing or unreadable input is the job's to report, with its message
        return None


def run_small_jobs_in_process(options: PipelineOptions, spec: str, below: int) -> bool:
    """Switches a local run over fewer than `below` inputs (not 0) to this process; True if it did."""
    direct = options.view_as(DirectOptions)
    if below <= 0 or not uses_direct_runner(options) or direct.direct_running_mode == IN_MEMORY:
        return False
    count = count_inputs_up_to(spec, below)
    if count is None or count >= below:
        return False
    logging.info(
        "%d inputs: running in this process; worker processes (--direct_running_mode=%s) start from "
        "--in-process-below %d inputs",
        count,
        direct.direct_running_mode,
        below,
    )
    direct.direct_running_mode = IN_MEMORY
    direct.direct_num_workers = 1
    return True
