"""Where the images are: listing, the rules of what is an input, checks before a run, reading bytes, exact dedup.

Design notes: docs/internals.md."""

from preprocess import lazy_entry

__all__, __getattr__ = lazy_entry(
    __name__,
    {
        "listing": ("ListInputs", "input_kind"),
        "content": ("DeduplicateByContent",),
    },
)
