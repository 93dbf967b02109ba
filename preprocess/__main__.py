"""`python -m preprocess`: see preprocess/pipeline.py."""

import sys

from preprocess.options import parse_args

if __name__ == "__main__":
    # --help and a wrong flag are answered before TensorFlow and Beam are imported (~8 s, and log noise).
    parse_args(sys.argv[1:])
    from preprocess.pipeline import main
    from preprocess.process_exit import exit_without_teardown

    main()
    exit_without_teardown(0)
