"""Incremental versions (issue 32): a re-run carries over the records of unchanged inputs from the
published version and decodes only new or changed ones (docs/preprocessing.md, "Re-runs")."""

from preprocess import lazy_entry

__all__, __getattr__ = lazy_entry(
    __name__,
    {
        "previous": ("ReusePlan", "plan_reuse"),
        "shared_index": ("share",),
        "stage": (
            "SortByPublished",
            "CARRY",
            "DECODE",
            "MOVED",
            "PUBLISHED",
            "FAILED",
            "IntactShards",
            "FindCarriedRecords",
            "ReferencedFn",
            "ANALYSIS",
            "SIZES",
            "OUTCOMES",
            "RelabelRecordFn",
            "referenced_shard_entries",
        ),
        "ledger": ("LEDGER", "entry_bytes", "entry_line", "failure_entry"),
    },
)
