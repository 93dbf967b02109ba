"""Publishing a run: the manifest, its commit in the log manifests/ (commit), garbage collection (gc), the
protocol both follow (protocol: the log's head, retention promises, markers), the store both use, runs and
their paths, the superseded check.

Design notes: docs/internals.md."""
