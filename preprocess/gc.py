"""Garbage collection of a dataset directory (preprocess/publish/gc.py): what no commit, retention promise
or live lease needs goes, a bounded amount per call.

    python -m preprocess.gc DIR [--dry-run] [--max-objects N]
    python -m preprocess.gc gs://bucket/datasets/flowers --dry-run
"""

import logging
import sys

from preprocess.publish.gc import main

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
