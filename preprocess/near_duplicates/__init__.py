"""Near-duplicate images: signatures, groups, and the split they share."""

from preprocess import lazy_entry

__all__, __getattr__ = lazy_entry(
    __name__,
    {
        "stage": ("NearDuplicateAudit",),
        "published": ("published_shards",),
    },
)
