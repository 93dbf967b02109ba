"""Where the images are: listing, the rules of what is an input, checks before a run, reading bytes, exact dedup.

Design notes: docs/internals.md."""
