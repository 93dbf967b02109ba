"""Looking at a dataset directory: `python -m preprocess.inspect` (summary, contact sheet, HTML report).

Design notes: docs/internals.md."""
