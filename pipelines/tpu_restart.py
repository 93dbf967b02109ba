"""`python -m pipelines.tpu_restart`: the name the docs gave the restart loop before the TPU modules moved
into pipelines/tpu/; it runs `python -m pipelines.tpu.restart`, so commands users wrote down keep working."""

import sys

from pipelines.tpu.restart import main

if __name__ == "__main__":
    sys.exit(main())
