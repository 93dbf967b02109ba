"""Decoding images: the per-image step, the outcome counts, the failure budget and the spill of decoded images.

Design notes: docs/internals.md."""

from preprocess import lazy_entry

__all__, __getattr__ = lazy_entry(
    __name__,
    {
        "stage": ("decode_images",),
        "source_sizes": ("source_image_sizes",),
        "outcomes": ("outcomes",),
    },
)
