"""Publishing a run: the manifest, the commit of dataset.json, runs and their paths, the superseded check.

Design notes: docs/internals.md."""
