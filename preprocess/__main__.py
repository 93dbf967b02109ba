"""`python -m preprocess`: see preprocess/pipeline.py."""

import sys

from preprocess.launch.worker_image import LauncherPythonError, check_launcher_python
from preprocess.options import build_parser, check_beam_args, parse_args, refuse

if __name__ == "__main__":
    # --help, a wrong flag, a launcher Python that the worker image cannot load and a wrong --input or
    # --output are answered before TensorFlow and Beam's pipeline code are imported (~8 s, and log noise).
    args, beam_args = parse_args(sys.argv[1:], check_beam_flags=False)
    try:
        check_launcher_python(beam_args)
    except LauncherPythonError as exc:
        sys.exit(f"preprocess: {exc}")
    # Beam's options are imported for this (a second or two), only when flags are left for Beam.
    check_beam_args(beam_args, build_parser())
    from preprocess.inputs import checks as input_checks

    # A template may be made before its input exists (input_checks.check_inputs).
    template = any(arg.split("=", 1)[0] == "--template_location" for arg in beam_args)
    try:
        input_checks.check_inputs(args.input, args.output, args.labels, template=template)
    except input_checks.InputError as exc:
        if args.verbose:
            raise
        refuse(str(exc))
    from preprocess.launch.process_exit import exit_without_teardown
    from preprocess.pipeline import main

    main(inputs_checked=True)
    exit_without_teardown(0)
