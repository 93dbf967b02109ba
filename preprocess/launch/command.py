"""`python -m preprocess`: parse the flags once, check the inputs once, run, and end with one exit code:
0 done (or superseded), 2 a user's mistake or the input's fault, 1 an error of the code, 130 Ctrl-C."""

import sys

from dataset_contract import log_format, native_logs
from preprocess import options
from preprocess.inputs import checks as input_checks
from preprocess.launch.worker_image import LauncherPythonError, check_launcher_python


def main(argv=None) -> None:
    """The command: returns when the run is done, raises SystemExit with the code of any other end."""
    argv = sys.argv[1:] if argv is None else argv
    # --help, a wrong flag, a launcher Python that the worker image cannot load and a wrong --input or
    # --output are answered before TensorFlow and Beam's pipeline code are imported (~8 s, and log noise).
    parser = options.build_parser()
    config, beam_args = options.parse_args(argv, check_beam_flags=False, parser=parser)
    log_format.configure()  # the launcher's warnings (input checks) in the one format of every command
    try:
        check_launcher_python(beam_args)
    except LauncherPythonError as exc:
        sys.exit(f"preprocess: {exc}")
    # Beam's options are imported for this (a second or two), only when flags are left for Beam.
    options.check_beam_args(beam_args, parser)
    # A template may be made before its input exists (input_checks.check_inputs).
    template = any(arg.split("=", 1)[0] == "--template_location" for arg in beam_args)
    try:
        input_checks.check_inputs(config.input, config.output, config.labels, template=template)
    except input_checks.InputError as exc:
        if config.verbose:
            raise
        parser.refuse(str(exc))
    if not template:
        from preprocess.inputs import size_check  # noqa: PLC0415

        size_check.warn_if_upscaled(config)
    try:
        _run_and_report(config, beam_args)
    except KeyboardInterrupt:
        from preprocess.launch import launcher  # noqa: PLC0415 - loaded by now
        from preprocess.pipeline import output_dir_of  # noqa: PLC0415

        # One line, from the launcher alone (local workers exit quietly at a Ctrl-C: local_worker.py).
        if config.verbose:
            raise
        print(launcher._interrupted_message(output_dir_of(config)), file=sys.stderr)
        from preprocess.launch.process_exit import exit_without_teardown  # noqa: PLC0415

        exit_without_teardown(130)


def _run_and_report(config, beam_args: list[str]) -> None:
    from apache_beam.options.pipeline_options import PipelineOptions  # noqa: PLC0415

    from preprocess.launch import logs, progress  # noqa: PLC0415

    local = progress.runs_locally(PipelineOptions(beam_args))
    # Before TensorFlow is imported (the pipeline, the summary): it reads its C++ log level once. Quiet
    # only a local run: on Dataflow, Beam's INFO lines (the job's link, its states) are the progress.
    logs.configure_launcher(config.verbose, local=local)
    if not config.verbose:
        logs.quiet_input_faults()
    if local:
        # TensorFlow's native start-up lines would precede the progress: loaded once here, filtered.
        native_logs.import_tensorflow_quietly(config.verbose)
    from preprocess.errors import INPUT_FAULTS  # noqa: PLC0415
    from preprocess.inspect.summary import format_summary, read_error_examples  # noqa: PLC0415
    from preprocess.launch import job_record, launcher  # noqa: PLC0415 - TensorFlow, Beam
    from preprocess.launch.dataflow_job import JobContinuesError  # noqa: PLC0415
    from preprocess.publish.commit import SupersededRunError  # noqa: PLC0415

    try:
        with launcher.sigterm_as_ctrl_c(enabled=not local):
            manifest = launcher.run(config, beam_args)
    except job_record.RelaunchRefused as exc:
        print(f"preprocess: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except JobContinuesError as exc:
        # The job is fine and goes on: a message, not a traceback.
        print(f"preprocess: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except SupersededRunError as exc:
        # Not a failure (launcher.PublishedThenSuperseded too: this run did its job): a run that started
        # later published, and its dataset is there, complete. An orchestrator must not retry this run:
        # exit 0, with that line.
        print(f"preprocess: {exc}")
        return
    except INPUT_FAULTS as exc:
        # The input's fault, not the code's: no traceback (the runner's own is quieted: launch/logs.py).
        if config.verbose:
            raise
        print(f"preprocess: {exc}", file=sys.stderr)
        sys.exit(2)
    if manifest is not None:
        output_dir = config.output.rstrip("/")
        print(format_summary(manifest, output_dir, read_error_examples(output_dir, manifest)))
