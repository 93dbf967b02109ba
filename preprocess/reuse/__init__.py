"""Incremental versions (issue 32): a re-run carries over the records of unchanged inputs from the
published version and decodes only new or changed ones (docs/preprocessing.md, "Re-runs")."""
