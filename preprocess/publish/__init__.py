"""Publishing a run: the manifest, its commit in the log (commit), garbage collection (gc), their protocol,
store, runs and the superseded check. Design notes: docs/internals.md."""
