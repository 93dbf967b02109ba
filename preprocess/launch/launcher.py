"""The launcher's side of a run of stage 1: start the job, wait for it, and tell what became of it
(`run(config, beam_args)`). Design notes: docs/internals.md."""

import contextlib
import logging
import os
import signal
import sys
import threading
import uuid

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from dataset_contract import manifest as manifest_lib
from preprocess import errors, filesystem
from preprocess.config import Stage1Config
from preprocess.errors import EmptyTrainSplitError, TooManyFailuresError
from preprocess.inspect.summary import failure_lines, format_bytes
from preprocess.launch import bucket_costs, dataflow_job, job_record, local_runner, progress, worker_image
from preprocess.pipeline import build_pipeline, job_config, output_dir_of
from preprocess.publish.commit import SupersededRunError, superseded_message
from preprocess.publish.protocol import (
    RETAINED_RUNS,
    TFT_TEMP_GRACE_SECONDS,
    published_run_id,
    read_published_manifest,
)
from preprocess.publish.runs import (
    STAGING_DIR,
    TFT_TEMP_PREFIX,
    RunPaths,
    is_run_id,
    new_run_id,
    tft_temp_dir,
)
from preprocess.reuse import shared_index


def own_manifest(output_dir: str, run_id: str) -> dict | None:
    """The published manifest if it is run `run_id`'s; SupersededRunError if a newer run's.

    None if it names an older run or none (the job did not publish: a dry run).
    """
    manifest = read_published_manifest(output_dir)
    current = published_run_id(manifest)
    if current == run_id:
        return manifest
    if current > run_id:
        retained = {entry["id"]: entry for entry in manifest.get(RETAINED_RUNS, [])}
        if run_id in retained:
            raise SupersededRunError(
                f"run {run_id} published into {output_dir}, but run {current}, which started later, has "
                f"published since (at {retained[run_id]['superseded_at']}): the published dataset is run {current}. "
                f"Run {run_id}'s files stay in {output_dir}/runs/{run_id}/ for the retention period "
                "(--retention-days)."
            )
        raise SupersededRunError(superseded_message(output_dir, run_id, current))
    return None


def _remove_tft_temp(output_dir: str, build_id: str):
    """This build's tf.Transform directory, best effort (publish.py's cleanup retries what is left)."""
    try:
        filesystem.delete_tree(tft_temp_dir(output_dir, build_id))
        filesystem.remove_empty_directory(manifest_lib.join(output_dir, STAGING_DIR))
    except Exception as exc:  # noqa: BLE001 - a leftover temporary directory never fails a run
        logging.warning(
            "could not remove tf.Transform's temporary directory %s (%s); the next publish removes it "
            "once idle",
            tft_temp_dir(output_dir, build_id),
            exc,
        )


def _fault_message(text: str, name: str) -> str:
    """The message of the exception `name` inside a runner's error `text` (which may quote its traceback)."""
    message = text[text.rindex(f"{name}: ") + len(name) + 2 :]
    return message.split(" [while running", 1)[0].splitlines()[0].strip()


def input_fault(exc: Exception, output_dir: str, run_id: str) -> Exception | None:
    """The run's failure as one of errors.INPUT_FAULTS (recognized by class name in the runner's wrapping
    error), with a message for a person; None if it is none."""
    text = f"{type(exc).__name__}: {exc}"
    for fault in (TooManyFailuresError, errors.RebuildNeededError):
        if fault.__name__ in text:
            return fault(_fault_message(text, fault.__name__))
    if EmptyTrainSplitError.__name__ not in text:
        return None
    try:  # the error log files the run has written so far
        paths = sorted(m.path for m in filesystem.match(RunPaths(output_dir, run_id).final("errors-*.jsonl")))
    except Exception:  # noqa: BLE001 - no log yet
        paths = []
    failures = errors.read_error_log(paths)
    counts = dict(sorted(failures.counts.items(), key=lambda item: -item[1]))
    lines = [
        f"run {run_id}: no image reached the train split, so there is nothing to learn from; nothing was "
        "published (the published dataset is unchanged)."
    ]
    if counts:
        lines.append(f"{sum(counts.values())} inputs failed, by reason:")
        lines += failure_lines(counts, failures.uris(), "  ")
        lines.append(
            f"Every failure, with its detail: {RunPaths(output_dir, run_id).final('errors-*.jsonl')}"
        )
    else:
        lines.append(
            "No input failed: the split gave train none (see --split, or the manifest's split column)."
        )
    return EmptyTrainSplitError("\n".join(lines))


def run(args: Stage1Config, beam_args: list[str]) -> dict | None:
    """Runs the job and waits for it; returns its run's manifest (None if the runner did not run it). The
    caller checks the inputs first. SupersededRunError if a later run has published; on Dataflow a relaunch
    attaches to its running job (RelaunchRefused if Dataflow cannot be asked); Ctrl-C: JobContinuesError."""
    worker_image.check_launcher_python(beam_args)
    output_dir = output_dir_of(args)
    build_id = uuid.uuid4().hex[:12]
    options = PipelineOptions(beam_args)
    template = bool(options.view_as(GoogleCloudOptions).template_location)
    # A template's runs make their ids when they run; a job launched here is this run.
    run_id = None if template else new_run_id()
    if filesystem.FileSystems.get_scheme(output_dir) == "gs":
        # What superseded runs and training reads will cost in this bucket, said before any work.
        for line in bucket_costs.launch_lines(output_dir, read_published_manifest(output_dir)):
            print(f"preprocess: {line}", flush=True)
    claimed = attached = None
    if dataflow_job.runs_remotely(options) and not template:
        # A retried launch of the same request finds its job, whatever --job_name it is given (Airflow
        # appends a unique suffix): the request and its job are recorded in the output directory.
        request = {key: value for key, value in job_config(args, build_id).items() if key != "build_id"}
        job_name = dataflow_job.set_job_identity(
            options,
            output_dir,
            request,
            beam_args,
            {dataflow_job.RUN_ID_LABEL: run_id, dataflow_job.BUILD_ID_LABEL: build_id},
        )
        decision, record = job_record.claim(
            output_dir,
            dataflow_job.request_digest(output_dir, request, beam_args),
            job_name,
            run_id,
            build_id,
            dataflow_job.recorded_job_state(options),
        )
        claimed, attached = (record, None) if decision == job_record.SUBMIT else (None, record)
    local_runner.run_small_jobs_in_process(options, args.input, args.in_process_below)
    pipeline = beam.Pipeline(runner=local_runner.runner_for(options, args.verbose), options=options)
    if attached is None:
        try:
            build_pipeline(pipeline, args, build_id, run_id)
        except BaseException:
            if claimed is not None:
                job_record.abandon(claimed)  # no job: the next launch need not wait for one
            shared_index.release(pipeline)  # nor its quick check's index, uploaded as the graph was built
            raise
    result = None
    # Dataflow has its own monitoring UI; a local run prints a progress line every few seconds.
    local = progress.runs_locally(options)
    try:
        with (
            progress.ProgressReporter(
                enabled=local, worker_processes=not local_runner.runs_in_this_process(options)
            ),
            stop_at_ctrl_c(output_dir, enabled=local and not args.verbose),
        ):
            labels = None
            if attached is not None:
                result, labels = dataflow_job.attach_to_job(options, attached.job_id)
            else:
                try:
                    result = pipeline.run()
                except Exception as exc:
                    # Unless Dataflow refuses a job whose name a running job holds:
                    if type(exc).__name__ != "DataflowJobAlreadyExistsError":
                        if claimed is not None:
                            job_record.abandon(claimed)  # no job: the next launch need not wait for one
                        raise
                    result, labels = dataflow_job.attach_to_running_job(options, exc)
                    # That job is another launch's, with an index of its own: this one's is not used.
                    shared_index.release(pipeline)
                if claimed is not None and dataflow_job.is_remote_job(result):
                    job_record.record_job_id(claimed, result.job_id())
            if labels is not None:
                run_id = dataflow_job.label_to_run_id(labels.get(dataflow_job.RUN_ID_LABEL)) or run_id
                build_id = labels.get(dataflow_job.BUILD_ID_LABEL) or build_id
                logging.warning(
                    "Dataflow job %s (run %s) is already running this request%s: waiting for it instead of "
                    "starting a second job",
                    result.job_id(),
                    run_id,
                    f" (recorded in {attached.path})" if attached is not None else "",
                )
            state = result.wait_until_finish()
    except KeyboardInterrupt as interrupt:
        if not dataflow_job.is_finished(result):
            raise dataflow_job.JobContinuesError(
                dataflow_job.continues_message(result, options, shared_index.upload_of(pipeline))
            ) from interrupt
        raise
    except Exception as exc:
        if run_id is not None:
            # The runner's error may wrap the step's; say plainly if the reason is a newer run.
            try:
                own_manifest(output_dir, run_id)
            except SupersededRunError as superseded:
                raise superseded from exc
            except Exception:  # noqa: BLE001 - could not tell: the job's own error says more
                pass
            fault = input_fault(exc, output_dir, run_id)
            if fault is not None:
                raise fault from exc
        raise
    finally:
        # This build's tf.Transform directory serves the job until it ends (tf.Transform may write
        # into it until the very end, and a Dataflow job outlives an interrupted launcher: its
        # workers load the analysis from it). A template's is shared by its runs: publish.py removes
        # it once idle.
        if not template and dataflow_job.is_finished(result):
            _remove_tft_temp(output_dir, build_id)
        if local or dataflow_job.is_finished(result):
            # The quick check's index, built once for the job's workers (reuse/shared_index.py).
            shared_index.release(pipeline)
    if run_id is None:
        logging.info("pipeline finished in state %s (a template: its runs publish when they run)", state)
        return None
    try:
        manifest = own_manifest(output_dir, run_id)
    except SupersededRunError as exc:
        if str(state) == "DONE":
            # The job succeeded, so its publish step published (a superseded one fails the job): the
            # run did its work, and a newer run has published since.
            newer = published_run_id(read_published_manifest(output_dir))
            raise PublishedThenSuperseded(
                f"run published, then superseded by a newer run: run {run_id} published into {output_dir}, but "
                f"run {newer}, which started later, has published since and is the dataset there now. This run "
                "succeeded: nothing to retry"
            ) from exc
        raise
    if manifest is None:
        logging.info("pipeline finished in state %s without publishing run %s (a dry run?)", state, run_id)
    return manifest


class PublishedThenSuperseded(SupersededRunError):
    """This run published, then a run that started later published too: not a failure of this run (the
    launcher exits 0), but its dataset is not the published one (the workflow does not train on it)."""


@contextlib.contextmanager
def stop_at_ctrl_c(output_dir: str, enabled: bool = True):
    """While a local run runs, a Ctrl-C (SIGINT) stops this process at once, saying so in one line (not
    through KeyboardInterrupt); nothing it wrote is published."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        print(_interrupted_message(output_dir), file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130)

    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def sigterm_as_ctrl_c(enabled: bool = True):
    """While a Dataflow launch runs, SIGTERM (an orchestrator stopping its task) ends it as Ctrl-C does: the
    job, if it runs, goes on and is said to, and the quick check's index uploaded for a job that will not run is
    removed. SIGTERM's default action would end the launcher where it stands, with neither."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _leftovers(output_dir: str, published: str | None) -> tuple[int, list[str]]:
    """(bytes, folders) an interrupted run leaves: everything in staging/, and the run folders of runs newer
    than the published one (their unpublished shards)."""
    num_bytes, folders = 0, set()
    for top in (STAGING_DIR, manifest_lib.RUNS_DIR):
        base = manifest_lib.join(output_dir, top)
        for metadata in filesystem.list_files(base):
            name = metadata.path[len(base) :].lstrip("/").split("/")[0]
            run_id = name.split(".")[0]
            if top == manifest_lib.RUNS_DIR and (not is_run_id(run_id) or run_id <= (published or "")):
                continue
            num_bytes += metadata.size_in_bytes
            folders.add(manifest_lib.join(base, "") if top == STAGING_DIR else manifest_lib.join(base, name))
    return num_bytes, sorted(folders)


def _interrupted_message(output_dir: str) -> str:
    """What a Ctrl-C prints: what was published is untouched, and what the run left behind (its size,
    what removes it)."""
    try:
        published = published_run_id(read_published_manifest(output_dir))
    except Exception:  # noqa: BLE001 - an unreadable manifest: say what is certain
        published = None
    state = f"is still run {published}" if published else "does not exist yet"
    message = f"preprocess: interrupted, nothing published: the published dataset of {output_dir} {state}"
    try:
        num_bytes, folders = _leftovers(output_dir, published)
    except Exception:  # noqa: BLE001 - a listing that fails must not hide the first line
        return message
    if not num_bytes:
        return message
    from preprocess.publish.gc import ABANDONED_RUN_SECONDS  # noqa: PLC0415

    return (
        f"{message}\n  left behind: {format_bytes(num_bytes)} of temporary and unpublished files in "
        f"{', '.join(folders)}; the next run that publishes to {output_dir} removes them, as does "
        f"`python -m preprocess.gc {output_dir}` once this run is {ABANDONED_RUN_SECONDS / 86400:g} days old "
        f"(tf.Transform's {STAGING_DIR}/{TFT_TEMP_PREFIX}* once unused for {TFT_TEMP_GRACE_SECONDS / 86400:g} "
        "days); or delete them now"
    )
