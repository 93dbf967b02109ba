"""The one format of every command's log lines: time, level, logger, message (`configure` sets it unless
the root logger has a handler already)."""

import logging

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: int | None = None) -> None:
    """The root logger's handler with LOG_FORMAT (unless it has one), and `level` if given."""
    logging.basicConfig(format=LOG_FORMAT)
    if level is not None:
        logging.getLogger().setLevel(level)
