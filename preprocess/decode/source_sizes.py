"""The manifest's `source_image_sizes`: how large the decoded source images were, before resizing."""

import apache_beam as beam

# Upper bounds (inclusive) of the longest-side bins; None: larger than the last.
LONGEST_SIDE_BINS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, None)


def longest_side_bin(width: int, height: int) -> int:
    """The index in LONGEST_SIDE_BINS of an image's longest side."""
    side = max(width, height)
    for index, upto in enumerate(LONGEST_SIDE_BINS[:-1]):
        if side <= upto:
            return index
    return len(LONGEST_SIDE_BINS) - 1


def _order(size):
    # By pixels, then by width: the same smallest and largest whatever order images come in.
    width, height = size
    return width * height, width, height


class SourceImageSizesFn(beam.CombineFn):
    """(width, height) pairs -> the manifest's `source_image_sizes` dict."""

    def create_accumulator(self):
        return 0, None, None, [0] * len(LONGEST_SIDE_BINS)

    def add_input(self, accumulator, size):
        count, smallest, largest, bins = accumulator
        size = (int(size[0]), int(size[1]))
        bins[longest_side_bin(*size)] += 1
        smallest = size if smallest is None or _order(size) < _order(smallest) else smallest
        largest = size if largest is None or _order(size) > _order(largest) else largest
        return count + 1, smallest, largest, bins

    def merge_accumulators(self, accumulators):
        count, smallest, largest, bins = self.create_accumulator()
        for other_count, other_smallest, other_largest, other_bins in accumulators:
            count += other_count
            bins = [a + b for a, b in zip(bins, other_bins, strict=True)]
            if other_smallest is not None and (smallest is None or _order(other_smallest) < _order(smallest)):
                smallest = other_smallest
            if other_largest is not None and (largest is None or _order(other_largest) > _order(largest)):
                largest = other_largest
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
