"""The one format of every command's log lines: time, level, logger, message.

`preprocess`, `train`, `train.evaluate`, `train.predict`, `pipelines.local` and `pipelines.dataflow` log
through Python's logging with this format (a workflow runs stage 1 and training in one process, so one
format is what keeps its output readable); `configure` sets it unless the root logger has a handler already
(a notebook's, a test's). The long-running supervisors (train.tools.supervisor, pipelines.tpu.restart) keep
their own prefix in the same layout.
"""

import logging

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: int | None = None) -> None:
    """The root logger's handler with LOG_FORMAT (unless it has one), and `level` if given."""
    logging.basicConfig(format=LOG_FORMAT)
    if level is not None:
        logging.getLogger().setLevel(level)
