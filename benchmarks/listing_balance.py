"""How evenly a large GCS folder's listing ranges split its names: by counting pages vs. the planning before.

    python -m benchmarks.listing_balance --bulk 5000000

Builds name patterns that corpora have (a few odd names before a bulk prefix,
a small bulk before a large one, hashed names, numbers without padding),
each a sorted sequence held in no memory, and plans the listing ranges of
one folder of them for 64 ranges (stage 1's GCS_LISTING_RANGES):

- `after`: preprocess/inputs/listing_plan.py (pages of 1,000 names counted by prefix);
- `before`: the planning before issue 23 (one probe of one name per next
  character after a prefix, breadth first, at most 256 probes; copied below).

Both ask the same stand-in for GCS's listing (a sorted sequence with GCS's
startOffset/endOffset/maxResults semantics). Printed per pattern: the
number of ranges, the largest range's names over the ideal (names / ranges),
and the requests the planning sent. A range is listed by one pager, so the
largest range bounds the listing's time.
"""

import argparse
import bisect
import collections
import hashlib
import json
import time

from preprocess.inputs import listing_plan

TARGET_RANGES = 64
_OLD_MAX_PROBES = 256


class Numbered:
    """`format % i` for i in range(count): sorted (zero-padded), held in no memory."""

    def __init__(self, format_, count):
        self.format, self.count = format_, count

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        if not 0 <= index < self.count:
            raise IndexError(index)
        return self.format % index


class Concatenated:
    """Sorted parts, each sorting after the one before, as one sorted sequence."""

    def __init__(self, *parts):
        self.parts = parts

    def __len__(self):
        return sum(len(part) for part in self.parts)

    def __getitem__(self, index):
        for part in self.parts:
            if index < len(part):
                return part[index]
            index -= len(part)
        raise IndexError(index)


def hashed_names(count, length=24):
    """`count` distinct hex names, sorted: names with no shared prefix to plan by."""
    return sorted(hashlib.sha256(str(i).encode()).hexdigest()[:length] + ".jpg" for i in range(count))


def patterns(bulk: int) -> dict:
    return {
        "20 hashed names, then photos_2024_07_batch_NNNNNNN.jpg": Concatenated(
            hashed_names(20), Numbered("photos_2024_07_batch_%07d.jpg", bulk)
        ),
        "a_NNNNN.jpg (10K), then b_NNNNNNN.jpg": Concatenated(
            Numbered("a_%05d.jpg", 10_000), Numbered("b_%07d.jpg", bulk)
        ),
        "README.jpg, a.jpg, b.jpg, then img_NNNNNNN.jpg": Concatenated(
            ["README.jpg", "a.jpg", "b.jpg"], Numbered("img_%07d.jpg", bulk)
        ),
        "hashed names (1M)": hashed_names(min(bulk, 1_000_000), length=32),
    }


def page_lister(names, requests: list):
    """GCS's listing of a folder: up to `limit` names in [start, end), and whether more follow."""

    def page_of(start, end, limit):
        requests.append(start)
        first = bisect.bisect_left(names, start)
        last = len(names) if end is None else bisect.bisect_left(names, end)
        return [names[index] for index in range(first, min(last, first + limit))], first + limit < last

    return page_of


def _next_character(character):
    point = ord(character) + 1
    if 0xD800 <= point <= 0xDFFF:
        point = 0xE000
    return chr(point) if point <= 0x10FFFF else None


def old_boundaries(page_of, target):
    """The planning before issue 23 (preprocess/inputs/listing.py at 91f7c33), over the same listing."""

    def first_at_or_after(start, other_than):
        names, _ = page_of(start, None, 2)
        names = [name for name in names if name != other_than]
        return names[0] if names else None

    boundaries, frontier, probes = set(), collections.deque([""]), 0
    while frontier and len(boundaries) + 1 < target and probes < _OLD_MAX_PROBES:
        prefix = frontier.popleft()
        children, start = [], prefix
        while probes < _OLD_MAX_PROBES:
            name = first_at_or_after(start, prefix)
            probes += 1
            if name is None or not name.startswith(prefix):
                break
            children.append(name[len(prefix)])
            following = _next_character(children[-1])
            if following is None:
                break
            start = prefix + following
        boundaries.update(prefix + character for character in children[1:])
        frontier.extend(prefix + character for character in children)
    return boundaries


def names_per_range(names, boundaries) -> list[int]:
    edges = [0, *(bisect.bisect_left(names, start) for start in sorted(boundaries)), len(names)]
    return [end - start for start, end in zip(edges, edges[1:], strict=False)]


def measure(bulk: int) -> list[dict]:
    rows = []
    for pattern, names in patterns(bulk).items():
        for code in ("before", "after"):
            requests = []
            started = time.monotonic()
            page_of = page_lister(names, requests)
            if code == "before":
                boundaries = old_boundaries(page_of, TARGET_RANGES)
            else:
                boundaries = listing_plan.plan_boundaries(page_of, TARGET_RANGES)
            counts = names_per_range(names, boundaries)
            rows.append(
                {
                    "pattern": pattern,
                    "names": len(names),
                    "code": code,
                    "ranges": len(counts),
                    "largest_over_ideal": round(max(counts) / (len(names) / len(counts)), 2),
                    "largest_share": round(max(counts) / len(names), 3),
                    "requests": len(requests),
                    "seconds": round(time.monotonic() - started, 2),
                }
            )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.listing_balance", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bulk", type=int, default=5_000_000, help="names in each pattern's bulk")
    parser.add_argument("--tiny", action="store_true", help="small patterns, for the smoke test")
    args = parser.parse_args(argv)
    rows = measure(50_000 if args.tiny else args.bulk)
    print(
        f"{'pattern':<52} {'code':<7} {'ranges':>6} {'largest/ideal':>13} {'largest share':>13} {'requests':>8}"
    )
    for row in rows:
        print(
            f"{row['pattern']:<52} {row['code']:<7} {row['ranges']:>6} {row['largest_over_ideal']:>13.2f} "
            f"{row['largest_share']:>13.3f} {row['requests']:>8}"
        )
    print(json.dumps(rows))
    return rows


if __name__ == "__main__":
    main()
