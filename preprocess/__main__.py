"""`python -m preprocess`: see preprocess/pipeline.py."""

import sys

from preprocess.options import parse_args
from preprocess.worker_image import LauncherPythonError, check_launcher_python

if __name__ == "__main__":
    # --help, a wrong flag and a launcher Python that the worker image cannot load are answered before
    # TensorFlow and Beam are imported (~8 s, and log noise).
    _, beam_args = parse_args(sys.argv[1:])
    try:
        check_launcher_python(beam_args)
    except LauncherPythonError as exc:
        sys.exit(f"preprocess: {exc}")
    from preprocess.pipeline import main
    from preprocess.process_exit import exit_without_teardown

    main()
    exit_without_teardown(0)
