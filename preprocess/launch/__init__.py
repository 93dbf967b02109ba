"""Launching stage 1 and what it prints: the local runner and its workers, a Dataflow job, progress and logs.

Design notes: docs/internals.md."""
