"""The manifest's `source_image_sizes`: how large the decoded source images were, before resizing."""

import bisect

import apache_beam as beam

# Upper bounds (inclusive) of the longest-side bins; None: larger than the last.
LONGEST_SIDE_BINS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, None)


def longest_side_bin(width: int, height: int) -> int:
    """The index in LONGEST_SIDE_BINS of an image's longest side."""
    return bisect.bisect_left(LONGEST_SIDE_BINS[:-1], max(width, height))


def _pick(size, other, sign: int):
    """Of two sizes (either None), the smaller (sign 1) or larger (-1) by pixels, then width, then height:
    the same smallest and largest whatever order images come in."""
    if size is None or other is None:
        return size or other
    order = [(sign * w * h, sign * w, sign * h) for w, h in (size, other)]
    return other if order[1] < order[0] else size


class SourceImageSizesFn(beam.CombineFn):
    """(width, height) pairs -> the manifest's `source_image_sizes` dict."""

    def create_accumulator(self):
        return 0, None, None, [0] * len(LONGEST_SIDE_BINS)

    def add_input(self, accumulator, size):
        count, smallest, largest, bins = accumulator
        size = (int(size[0]), int(size[1]))
        bins[longest_side_bin(*size)] += 1
        return count + 1, _pick(smallest, size, 1), _pick(largest, size, -1), bins

    def merge_accumulators(self, accumulators):
        count, smallest, largest, bins = self.create_accumulator()
        for other_count, other_smallest, other_largest, other_bins in accumulators:
            count += other_count
            bins = [a + b for a, b in zip(bins, other_bins, strict=True)]
            smallest, largest = _pick(smallest, other_smallest, 1), _pick(largest, other_largest, -1)
        return count, smallest, largest, bins

    def extract_output(self, accumulator):
        count, smallest, largest, bins = accumulator
        return {
            "count": count,
            "smallest": list(smallest) if smallest else None,
            "largest": list(largest) if largest else None,
            "longest_side": [
                {"upto": upto, "count": number} for upto, number in zip(LONGEST_SIDE_BINS, bins, strict=True)
            ],
        }


def source_size(example: dict) -> tuple[int, int]:
    """A decoded example (DecodeImagesFn) -> its source image's (width, height)."""
    return example["source_width"], example["source_height"]


def source_image_sizes(decoded_examples, carried_sizes, referenced_sizes):
    """The manifest's `source_image_sizes`, a singleton: decoded and carried over alike (the ledger keeps a
    carried image's source size), as a full rebuild counts."""
    return (
        (decoded_examples | "SourceSizes" >> beam.Map(source_size), carried_sizes, referenced_sizes)
        | "AllSourceSizes" >> beam.Flatten()
        | "SourceImageSizes" >> beam.CombineGlobally(SourceImageSizesFn())
    )
