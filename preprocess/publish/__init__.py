"""Publishing a run: the manifest, its commit in the log (commit), garbage collection (gc), their protocol,
store, runs and the superseded check. Design notes: docs/internals.md."""

from preprocess import lazy_entry

__all__, __getattr__ = lazy_entry(
    __name__,
    {
        "runs": ("MakeRunId", "tft_temp_dir"),
        "finalize": ("finalize_dataset",),
    },
)
