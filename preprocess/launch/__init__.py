"""Launching stage 1 and what it prints: the local runner and its workers, a Dataflow job, progress and logs.

Design notes: docs/internals.md."""

from preprocess import lazy_entry

__all__, __getattr__ = lazy_entry(
    __name__,
    {
        "dataflow_job": ("runs_remotely",),
    },
)
