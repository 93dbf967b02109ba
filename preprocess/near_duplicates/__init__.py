"""Near-duplicate images: signatures, groups, and the split they share."""
