"""Decoding images: the per-image step, the outcome counts, the failure budget and the spill of decoded images.

Design notes: docs/internals.md."""
