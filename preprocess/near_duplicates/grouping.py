"""Near-duplicate groups at Beam scale: candidates from interleaved signature bands, groups verified whole.

FindNearDuplicateGroups takes one SignedImage per distinct image and returns the groups, the split every
member gets and, in drop mode, the member kept; every decision is a function of the set of images alone, so a
re-run gives the same groups. Its steps (floods, bands, hot buckets, components, centres, the split and drop
rules, the guard): docs/internals.md, "preprocess/near_duplicates/grouping.py"; for users, docs/near_duplicates.md.
"""

import collections
import dataclasses
import itertools
import json
import math

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from preprocess.near_duplicates import signature as signature_lib
from preprocess.near_duplicates import split_counts
from preprocess.near_duplicates.components import LabelComponents
from preprocess.near_duplicates.limits import DEFAULT_MAX_GROUP_SIZE, DEFAULT_MAX_MOVED_SHARE
from preprocess.near_duplicates.signature import CANDIDATE_BITS

# 16-bit bands: a bucket's expected size is N / 2**16 (153 images at 10M).
BITS_PER_BAND = 16
# A bucket with more entries than this is hot: its pairs (up to 2M at this size, about a second) are not checked.
DEFAULT_MAX_BUCKET_SIZE = 2000
# The report's histogram of compared pairs' grey distances goes up to this; near misses are pairs that
# pass every check up to this many bits over the distance, the closest NEAR_MISSES of them listed.
HISTOGRAM_BITS = 16
NEAR_MISS_BITS = 3
NEAR_MISSES = 24
# Rounds of label propagation, one shuffle each (components.py): a chain of 1,000 copies 2 bits apart in the
# worst key order (sorted along the chain) converges in 7, one of 40 at 3 bits in 7 (measured); one to spare.
DEFAULT_ROUNDS = 8
# A component is held whole to be cut into groups; a larger one is left alone (counted).
DEFAULT_MAX_COMPONENT_SIZE = 5000

STATS_KEYS = (
    "groups",
    "images_in_groups",
    "largest_group",
    "groups_with_several_labels",
    "groups_kept_whole",
    "groups_kept_whole_published",
    "groups_across_splits",
    "oversized_groups",
    "images_in_oversized_groups",
    "dropped",
    "split_changes",
    "candidate_pairs",
    "verified_pairs",
    "hot_buckets",
    "hot_bucket_entries",
    "flood_followers",
    "components_too_large",
    "images_in_components_too_large",
    "images_not_converged",
    "images",
    "would_move",
    "changes_withheld",
)
# Not in STATS_KEYS (not plain counts), present when there is something to say: "distance_histogram" (a
# list, index = grey distance), "near_misses" (a list of pairs), "low_information_by_split" ({split: n}).
# Stats combined by max, not by sum.
_MAX_STATS = ("largest_group",)
# The near misses' halves ({(distance, key_a, key_b): {key: (uri, label, split)}}), kept for the NEAR_MISSES
# closest only, made into "near_misses" when the stats are finished.
_NEAR_MISS_HALVES = "near_miss_halves"
# The images per (split, label) before grouping, and the members' changes to them (split_counts.py): summed
# with the stats, the changes counted only when the guard lets them be; the "split_counts" output.
_SPLIT_COUNTS = "split_label_counts"
_SPLIT_MOVES = "split_label_moves"


@dataclasses.dataclass(frozen=True)
class SignedImage:
    key: str  # the image's content key: the hex sha256 of its bytes (the record's `sha256`)
    signature: int
    uri: str
    label: str
    split: str  # its split before grouping
    split_given: bool  # True when the input named the split (manifest column, split folder)
    source_pixels: int = 0  # width * height of the source image (drop mode prefers the largest)
    num_bytes: int = 0  # the source file's size (tie-break after source_pixels)
    locator: tuple = ()  # opaque to grouping, carried through: where the pipeline keeps the decoded image
    published_split: str | None = None  # the split a previous version published it in (published.py)
    # Carried over by an incremental run without being decoded (preprocess/reuse/): no part holds it, and
    # its published split holds, so routing and the split counts pass it by.
    carried: bool = False

    @property
    def held_split(self) -> str | None:
        """The split this image must keep: its published one, else the one the input named, else None."""
        if self.published_split is not None:
            return self.published_split
        return self.split if self.split_given else None


@dataclasses.dataclass(frozen=True)
class GroupMember:
    image: SignedImage
    group: str  # the group's id: the smallest member key
    split: str  # the member's split after grouping
    kept: bool  # False only in drop mode, for every member but one

    @property
    def moved(self) -> bool:
        return self.kept and self.split != self.image.split


@dataclasses.dataclass(frozen=True)
class NearDuplicateGroup:
    group: str  # the smallest member key
    members: tuple  # tuple[GroupMember, ...], sorted by key
    max_distance: int  # the largest distance of a member to the group's centre
    centre: str = ""  # the centre's key
    flags: tuple = ()  # of "across_splits", "oversized", "kept_whole", "published_outvoted"

    @property
    def split(self) -> str | None:
        """The split every member has, or None when they differ."""
        splits = {member.split for member in self.members}
        return splits.pop() if len(splits) == 1 else None

    def to_json(self) -> str:
        """One line of a near_duplicate_files JSONL file (docs/dataset_format.md)."""
        members = self.members
        return json.dumps(
            {
                "group": self.group,
                "split": self.split,
                "max_distance": self.max_distance,
                "centre": self.centre,
                "flags": list(self.flags),
                "uris": [member.image.uri for member in members],
                "labels": [member.image.label for member in members],
                "splits": [member.split for member in members],
                "splits_before": [member.image.split for member in members],
                "sha256": [member.image.key for member in members],
                "kept": [member.kept for member in members],
            },
            separators=(",", ":"),
        )


def _keep_order(image: SignedImage) -> tuple:
    """Drop mode's preference within one label: a carried (published) record, a named or published split,
    the largest source, file, key. Its first field says whether the label has a carried member at all."""
    return (not image.carried, image.held_split is None, -image.source_pixels, -image.num_bytes, image.key)


@dataclasses.dataclass(frozen=True)
class Flood:
    """What the images of one signature decide with (bounded by the number of labels, not of images)."""

    count: int
    labels: tuple  # ((label, images), ...) sorted by label
    held: tuple  # the distinct splits its images hold (published or named), sorted
    keep: tuple  # ((label, _keep_order of the label's preferred image), ...) sorted by label

    @staticmethod
    def of(image: SignedImage) -> "Flood":
        held = (image.held_split,) if image.held_split is not None else ()
        return Flood(1, ((image.label, 1),), held, ((image.label, _keep_order(image)),))

    @staticmethod
    def merge(floods) -> "Flood":
        count, labels, held, keep = 0, collections.Counter(), set(), {}
        for flood in floods:
            count += flood.count
            labels.update(dict(flood.labels))
            held.update(flood.held)
            for label, order in flood.keep:
                keep[label] = min(order, keep.get(label, order))
        return Flood(count, tuple(sorted(labels.items())), tuple(sorted(held)), tuple(sorted(keep.items())))


@dataclasses.dataclass(frozen=True)
class GroupDecision:
    group: str
    count: int
    target: str | None  # the split members without a held split take; None: no one moves
    keep: str | None  # the key drop mode keeps; None: every member is kept
    several_labels: bool
    flags: tuple

    def split_of(self, image: SignedImage) -> str:
        if image.published_split is not None:
            return image.published_split
        if image.split_given or self.target is None:
            return image.split
        return self.target

    def member(self, image: SignedImage, drop: bool) -> GroupMember:
        # A carried record (preprocess/reuse/) is written as published, whatever the group: never dropped.
        kept = not drop or self.keep is None or image.key == self.keep or image.carried
        return GroupMember(image=image, group=self.group, split=self.split_of(image), kept=kept)


def decide_group(group: str, first_split: str, flood: Flood, max_group_size: int) -> GroupDecision:
    """The decision of one group from its members' merged Flood and its smallest key's split (docs/internals.md, grouping.py 6)."""
    flags = []
    if len(flood.held) == 1:
        target = flood.held[0]
    elif flood.held:
        target = None
        flags.append("across_splits")
    else:
        target = first_split
    if flood.count > max_group_size:
        target = None
        flags.append("oversized")
    counts = sorted((-count, label) for label, count in flood.labels)
    keep = None
    if len(counts) == 1 or counts[0][0] != counts[1][0]:
        majority = counts[0][1]
        keep = dict(flood.keep)[majority][-1]
        if any(not order[0] for _, order in flood.keep) and dict(flood.keep)[majority][0]:
            # A carried record is never dropped (it is written as published), and the majority label has
            # none: the published image and its new copies disagree on the label, a likely label error.
            keep = None
            flags += ["kept_whole", "published_outvoted"]
    else:
        flags.append("kept_whole")
    if "oversized" in flags or "across_splits" in flags:
        keep = None  # no one moves, so no one is dropped either: each member holds its own split
    return GroupDecision(group, flood.count, target, keep, len(counts) > 1, tuple(flags))


def band_masks(bands: int, bits: int = CANDIDATE_BITS) -> list[list[int]]:
    """The bit positions of each band: bit i in band i mod `bands` (interleaved)."""
    if not 1 <= bands <= bits:
        raise ValueError(f"bands must be between 1 and {bits} (the signature's bits), not {bands}")
    return [list(range(band, bits, bands)) for band in range(bands)]


def band_value(value: int, positions) -> int:
    """The bits of `value` at `positions`, packed in order."""
    packed = 0
    for index, position in enumerate(positions):
        packed |= ((value >> position) & 1) << index
    return packed


def default_bands(bits: int = CANDIDATE_BITS) -> int:
    return max(1, bits // BITS_PER_BAND)


def band_detection_probability(distance: int, bands: int, bits: int = CANDIDATE_BITS) -> float:
    """The chance that a pair `distance` bits apart shares a bucket, if its differing bits are placed uniformly.

    1.0 up to `bands - 1` bits (pigeonhole). Inclusion-exclusion over the sets of clean bands.
    """
    widths = [len(positions) for positions in band_masks(bands, bits)]
    total = math.comb(bits, distance)
    probability = 0  # an exact integer count of placements, divided once
    for size in range(1, bands + 1):
        for chosen in itertools.combinations(widths, size):
            probability += (-1) ** (size + 1) * math.comb(bits - sum(chosen), distance)
    return probability / total


def signature_bytes(value: int) -> bytes:
    """A signature as the bytes it crosses a shuffle in: Beam's default coder pickles an int wider than 64
    bits (the signature has about 1,070), and codes bytes as they are, 3x faster (`signature_of` undoes it)."""
    return value.to_bytes((value.bit_length() + 7) // 8, "little")


def signature_of(data: bytes) -> int:
    return int.from_bytes(data, "little")


class _BandTables:
    """`band_value` of every band of a 64-bit grey hash at once, from a table per byte of the hash: each byte
    value's bits in every band, each band in a lane of its own (`_width` bits); 8 look-ups per hash, where
    `band_value` took a shift per bit (the Bands step's largest cost per image). The same values."""

    def __init__(self, masks):
        self._bands = len(masks)
        self._width = max(len(positions) for positions in masks)
        self._lane = (1 << self._width) - 1
        self._bytes = max(max(positions) for positions in masks) // 8 + 1
        self._mask = (1 << 8 * self._bytes) - 1  # bits past the masks' are in no band
        self._tables = [[0] * 256 for _ in range(self._bytes)]
        for band, positions in enumerate(masks):
            for index, position in enumerate(positions):
                byte, bit = divmod(position, 8)
                for value in range(256):
                    if value >> bit & 1:
                        self._tables[byte][value] |= 1 << (index + band * self._width)

    def values(self, grey: int) -> list[int]:
        """[band_value(grey, positions) for positions in masks]."""
        lanes = 0
        for table, byte in zip(
            self._tables, (grey & self._mask).to_bytes(self._bytes, "little"), strict=True
        ):
            lanes |= table[byte]
        return [lanes >> (band * self._width) & self._lane for band in range(self._bands)]

    def bucket(self, band: int, value: int) -> int:
        """One int per (band, value): what the Buckets shuffle groups by (Beam codes an int faster than a tuple)."""
        return band << self._width | value


def _band_entries(image: SignedImage, tables: _BandTables):
    """(bucket, (key, signature bytes)) for the grey hash and for its mirror (the same bucket when equal):
    the key and the signature, nothing else of the image (the hot pass carries 8 entries per image)."""
    point = (image.key, signature_bytes(image.signature))
    straight = tables.values(signature_lib.grey_hash(image.signature))
    mirrored = tables.values(signature_lib.mirrored_grey_hash(image.signature))
    for band, (value, mirror) in enumerate(zip(straight, mirrored, strict=True)):
        yield tables.bucket(band, min(value, mirror)), point
        if mirror != value:
            yield tables.bucket(band, max(value, mirror)), point


class CollapseFloodFn(beam.DoFn):
    """(signature, [SignedImage, ...]) -> the representative (smallest key) with its Flood (main), and
    ("followers", (representative key, image)) for the others. The images are read twice, never held."""

    def process(self, element):
        _, images = element
        firsts = list(itertools.islice(images, 2))
        if len(firsts) == 1:  # nearly every image: a flood of one, nothing to merge
            yield firsts[0], Flood.of(firsts[0])
            return
        representative = min(images, key=lambda image: image.key)
        floods = []
        for image in images:
            floods.append(Flood.of(image))
            if len(floods) >= 64:
                floods = [Flood.merge(floods)]
            if image.key != representative.key:
                yield beam.pvalue.TaggedOutput("followers", (representative.key, image))
        flood = Flood.merge(floods)
        if flood.count > 1:
            yield beam.pvalue.TaggedOutput("stats", ("flood_followers", flood.count - 1))
        yield representative, flood


class _SpanningForest:
    """Union-find over one bucket's verified pairs, fed one pair at a time: a bucket at the cap has up to 2M
    pairs, and a list of them was a worker's largest hold (140 MiB of Python heap at 20,000 images in
    benchmarks/near_duplicate_grouping_memory.py; 25 without it). The root of a set is its smallest key."""

    def __init__(self):
        self._parent = {}

    def _root(self, key):
        parent = self._parent
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    def join(self, a, b):
        ra, rb = self._root(a), self._root(b)
        if ra != rb:
            self._parent[max(ra, rb)] = min(ra, rb)

    def edges(self):
        """(key, its root) for every key not a root, in key order."""
        return [(key, self._root(key)) for key in sorted(self._parent) if self._root(key) != key]


# Declared, because Beam infers a union with TaggedOutput from a DoFn that yields tagged outputs too.
@beam.typehints.with_output_types(tuple[str, str])
def bucket_near_pairs(held, reach: int, histogram: list[int]):
    """[(key, signature), ...] of one bucket (sorted, distinct) -> (distance, key_a, key_b) of every pair of two
    keys that is near at `reach` (`signature.near`). Each pair's grey distance is computed once, from each
    signature's grey hashes taken once, and counted in `histogram` (up to its last index)."""
    hashes = [signature_lib.grey_hashes(value) for _, value in held]
    for (index_a, (key_a, signature_a)), (index_b, (key_b, signature_b)) in itertools.combinations(
        enumerate(held), 2
    ):
        if key_a == key_b:
            continue
        grey, mirrored = signature_lib.hashes_distance(hashes[index_a], hashes[index_b])
        if grey < len(histogram):
            histogram[grey] += 1
        if grey > reach:
            continue
        found = signature_lib.near_at(signature_a, signature_b, grey, mirrored, reach)
        if found is not None:
            yield found, key_a, key_b


class VerifyBucketFn(beam.DoFn):
    """(bucket, [(key, signature bytes), ...]) -> edges (key, root key) of a spanning forest of the bucket's
    verified pairs (`signature.near`). A bucket of more than `max_bucket_size` entries is hot: counted, not
    compared (read once: the cap's worth held, the rest counted).

    For the report, on the 'stats' output: a histogram of the grey distances of the pairs compared (up to
    HISTOGRAM_BITS; a pair sharing several buckets counts in each), per bundle; on 'near_misses':
    (distance, key_a, key_b) of the pairs that pass every check but are up to NEAR_MISS_BITS over the
    distance.
    """

    def __init__(self, max_distance: int, max_bucket_size: int):
        self._max_distance = max_distance
        self._max_bucket_size = max_bucket_size
        self._candidates = Metrics.counter("near_duplicates", "candidate_pairs")
        self._hot = Metrics.counter("near_duplicates", "hot_buckets")

    def start_bundle(self):
        self._histogram = [0] * (HISTOGRAM_BITS + 1)

    def finish_bundle(self):
        if any(self._histogram):
            yield beam.pvalue.TaggedOutput(
                "stats", GlobalWindows.windowed_value(("distance_histogram", tuple(self._histogram)))
            )

    def process(self, element):
        _, points = element
        points = iter(points)  # read once: up to the cap held, a hot bucket's rest only counted
        held = list(itertools.islice(points, self._max_bucket_size + 1))
        if len(held) < 2:  # nearly every bucket
            return
        if len(held) > self._max_bucket_size:
            self._hot.inc()
            yield beam.pvalue.TaggedOutput("stats", ("hot_buckets", 1))
            yield beam.pvalue.TaggedOutput(
                "stats", ("hot_bucket_entries", len(held) + sum(1 for _ in points))
            )
            return
        held = [(key, signature_of(data)) for key, data in sorted(set(held))]
        if len(held) < 2:
            return
        candidates = len(held) * (len(held) - 1) // 2
        self._candidates.inc(candidates)
        yield beam.pvalue.TaggedOutput("stats", ("candidate_pairs", candidates))
        forest = _SpanningForest()
        for found, key_a, key_b in bucket_near_pairs(
            held, self._max_distance + NEAR_MISS_BITS, self._histogram
        ):
            if found <= self._max_distance:
                forest.join(key_a, key_b)
            else:
                yield beam.pvalue.TaggedOutput("near_misses", (found, key_a, key_b))
        yield from forest.edges()


class _FoldPerKey(beam.PTransform):
    """(key, value) -> (key, `combine_fn` over the key's values): GroupByKey, then CombineValues (not lifted)."""

    def __init__(self, combine_fn: beam.CombineFn):
        super().__init__()
        self._combine_fn = combine_fn

    def expand(self, pairs):
        return pairs | "Group" >> beam.GroupByKey() | "Fold" >> beam.CombineValues(self._combine_fn)


# Tags of what is grouped under one key in the followers' join below.
_OWN = 0  # the representative's decision
_OTHER = 1  # a follower

# What `_follow` yields: a group's member, or its centre for the group's listing.
_MEMBER = "member"
_CENTRE = "centre"


def _tagged(pcollection, tag, label):
    return pcollection | label >> beam.MapTuple(lambda key, value: (key, (tag, value)))


def _join(label, own, other):
    """(key, own value) and (key, other value) -> (key, [(tag, value), ...]), grouped by key, values streamed."""
    return (
        (_tagged(own, _OWN, f"{label}TagOwn"), _tagged(other, _OTHER, f"{label}TagOther"))
        | f"{label}Flatten" >> beam.Flatten()
        | f"{label}Group" >> beam.GroupByKey()
    )


# Rows of the grey prefilter taken at once: its uint64 temporaries are rows x n (at the component cap, 5,000,
# 10 MB each, where the whole n x n took 200 MB each).
_PREFILTER_ROWS = 256


def _near_matrix(signatures, max_distance: int) -> np.ndarray:
    """int16 [n, n]: `signature.near` of every pair (-1 where not near), a vectorized grey prefilter first,
    taken _PREFILTER_ROWS rows at a time."""
    count = len(signatures)
    grey = np.array([signature_lib.grey_hash(value) for value in signatures], dtype=np.uint64)
    mirrored = np.array([signature_lib.mirrored_grey_hash(value) for value in signatures], dtype=np.uint64)
    result = np.full((count, count), -1, dtype=np.int16)
    for start in range(0, count, _PREFILTER_ROWS):
        rows = slice(start, min(start + _PREFILTER_ROWS, count))
        close = (
            np.minimum(
                np.bitwise_count(grey[rows, None] ^ grey[None, :]),
                np.bitwise_count(grey[rows, None] ^ mirrored[None, :]),
            )
            <= max_distance
        )
        for row, j in zip(*np.nonzero(np.triu(close, start + 1)), strict=True):
            i = start + int(row)
            found = signature_lib.near(signatures[i], signatures[j], max_distance)
            if found is not None:
                result[i, j] = result[j, i] = found
    np.fill_diagonal(result, 0)
    return result


def cut_into_groups(keys, signatures, max_distance: int) -> list[tuple[int, list[int], int]]:
    """A component -> its groups as (centre index, member indexes, largest distance to the centre).

    Centres in order of most near members, then smallest key; each takes every not yet grouped member
    near it. Lone members are left out (a caller adds a lone image with flood followers).
    """
    matrix = _near_matrix(signatures, max_distance)
    near = matrix >= 0
    degree = near.sum(axis=1)
    order = sorted(range(len(keys)), key=lambda index: (-int(degree[index]), keys[index]))
    grouped = np.zeros(len(keys), dtype=bool)
    groups = []
    for centre in order:
        if grouped[centre]:
            continue
        members = [index for index in np.flatnonzero(near[centre] & ~grouped).tolist()]
        grouped[members] = True
        grouped[centre] = True
        if len(members) > 1:
            groups.append(
                (centre, sorted(members, key=lambda index: keys[index]), int(matrix[centre, members].max()))
            )
    return groups


class GroupComponentFn(beam.DoFn):
    """(component, [(representative, Flood), ...]) -> (representative key, (GroupDecision, representative,
    the group's centre (key, distance, flags) or None)) per grouped representative, its followers joined to
    it next (the representative's member, the centre and the followers all leave `_follow`: one stage, where
    three outputs met in two Flattens); tagged 'stats'. A component over `max_component_size` is left alone
    (read once, counted)."""

    def __init__(self, max_distance: int, max_group_size: int, max_component_size: int, drop: bool):
        self._max_distance = max_distance
        self._max_group_size = max_group_size
        self._max_component_size = max_component_size
        self._drop = drop

    def process(self, element):
        _, entries = element
        held = list(itertools.islice(entries, self._max_component_size + 1))
        if len(held) > self._max_component_size:
            yield beam.pvalue.TaggedOutput("stats", ("components_too_large", 1))
            images = sum(flood.count for _, flood in entries)
            yield beam.pvalue.TaggedOutput("stats", ("images_in_components_too_large", images))
            return
        held.sort(key=lambda entry: entry[0].key)
        keys = [image.key for image, _ in held]
        if len(held) == 1:
            groups = [(0, [0], 0)] if held[0][1].count > 1 else []
        else:
            groups = cut_into_groups(keys, [image.signature for image, _ in held], self._max_distance)
            in_groups = {index for _, members, _ in groups for index in members}
            groups += [
                (index, [index], 0)
                for index in range(len(held))
                if index not in in_groups and held[index][1].count > 1
            ]
        for centre, members, distance in groups:
            yield from self._decide(held, centre, members, distance)

    def _decide(self, held, centre, members, distance):
        first, _ = held[members[0]]  # members are in key order
        flood = Flood.merge(held[index][1] for index in members)
        decision = decide_group(first.key, first.split, flood, self._max_group_size)
        for name, value in _group_stats(decision):
            yield beam.pvalue.TaggedOutput("stats", (name, value))
        listed = (held[centre][0].key, distance, decision.flags)
        for index in members:  # the centre is one of them
            image, _ = held[index]
            yield image.key, (decision, image, listed if index == centre else None)


def _group_stats(decision: GroupDecision):
    yield "groups", 1
    yield "images_in_groups", decision.count
    yield "largest_group", decision.count
    yield "groups_with_several_labels", int(decision.several_labels)
    yield "groups_kept_whole", int("kept_whole" in decision.flags)
    yield "groups_kept_whole_published", int("published_outvoted" in decision.flags)
    yield "groups_across_splits", int("across_splits" in decision.flags)
    oversized = "oversized" in decision.flags
    yield "oversized_groups", int(oversized)
    yield "images_in_oversized_groups", decision.count if oversized else 0


def _follow(element, drop: bool):
    """(representative key, [(decision, representative, centre), followers...]) -> ("member", GroupMember)
    of the representative and of each follower, and ("centre", (group, (key, distance, flags))) when the
    representative is its group's centre; nothing without a group."""
    _, tagged = element
    own = next((value for tag, value in tagged if tag == _OWN), None)
    if own is None:
        return
    decision, representative, centre = own
    yield _MEMBER, decision.member(representative, drop)
    if centre is not None:
        yield _CENTRE, (decision.group, centre)
    for tag, image in tagged:
        if tag == _OTHER:
            yield _MEMBER, decision.member(image, drop)


@beam.typehints.with_output_types(GroupMember)
class GuardFn(beam.DoFn):
    """("member", GroupMember) or ("centre", (group, centre)), and the finished stats (side input) ->
    the member as the guard leaves it (main), and (group, ("member", member) or ("centre", centre)) on
    'listed', for ListGroupFn: the guard and the groups' listing in one stage (no Flatten before it)."""

    def process(self, item, stats):
        kind, value = item
        if kind == _CENTRE:
            group, centre = value
            yield beam.pvalue.TaggedOutput("listed", (group, ("centre", centre)))
            return
        member = _guarded(value, stats)
        yield member
        yield beam.pvalue.TaggedOutput("listed", (member.group, ("member", member)))


class ListGroupFn(beam.CombineFn):
    """("member", GroupMember) and ("centre", (key, distance, flags)) of one group -> a NearDuplicateGroup's
    fields. The one step whose accumulator grows with a group: a group is listed whole, as one JSONL line."""

    def create_accumulator(self):
        return [], None

    def add_input(self, accumulator, value):
        members, centre = accumulator
        kind, item = value
        if kind == "member":
            members.append(item)
            return members, centre
        return members, item

    def merge_accumulators(self, accumulators):
        members, centre = [], None
        for more, more_centre in accumulators:
            members.extend(more)
            centre = more_centre or centre
        return members, centre

    def extract_output(self, accumulator):
        members, centre = accumulator
        return tuple(sorted(members, key=lambda member: member.image.key)), centre


def _to_group(group, listed):
    members, centre = listed
    if len(members) >= 2 and centre is not None:
        key, distance, flags = centre
        yield NearDuplicateGroup(group=group, members=members, max_distance=distance, centre=key, flags=flags)


class SumStatsFn(beam.CombineFn):
    """(name, value) pairs -> {name: total} with every STATS_KEYS name (0 when nothing was counted). Ints
    add up, tuples (histograms) add up element by element, dicts add up per key, lists are joined; the names
    of _MAX_STATS take the largest value instead; the near misses' halves keep the NEAR_MISSES closest, and
    the split counts add up per (split, label) (split_counts.SplitLabelCountsFn). `_finish_stats` follows."""

    def create_accumulator(self):
        return dict.fromkeys(STATS_KEYS, 0)

    def add_input(self, accumulator, pair):
        name, value = pair
        old = accumulator.get(name, 0)
        if name == _NEAR_MISS_HALVES:
            accumulator[name] = _closest_halves(old or {}, value)
        elif name in (_SPLIT_COUNTS, _SPLIT_MOVES):
            counts = split_counts.SplitLabelCountsFn()
            more = value if isinstance(value, dict) else counts.add_input({}, value)
            accumulator[name] = counts.merge_accumulators([old or {}, more])
        elif name in _MAX_STATS:
            accumulator[name] = max(old, value)
        elif isinstance(value, tuple):
            old = old or (0,) * len(value)
            accumulator[name] = tuple(a + b for a, b in zip(old, value, strict=True))
        elif isinstance(value, dict):
            merged = dict(old or {})
            for key, count in value.items():
                merged[key] = merged.get(key, 0) + count
            accumulator[name] = dict(sorted(merged.items()))
        elif isinstance(value, list):
            accumulator[name] = sorted((old or []) + value, key=json.dumps)
        else:
            accumulator[name] = old + value
        return accumulator

    def merge_accumulators(self, accumulators):
        total = self.create_accumulator()
        for accumulator in accumulators:
            for pair in accumulator.items():
                self.add_input(total, pair)
        return total

    def extract_output(self, accumulator):
        output = dict(accumulator)
        if isinstance(output.get("distance_histogram"), tuple):
            output["distance_histogram"] = list(output["distance_histogram"])
        return output


def _near_miss_half(pair, entry) -> tuple:
    """A near miss (distance, key_a, key_b) and one member's entry -> its stat: the pair with that member's
    uri, label and split (the pair's other member sends the other half)."""
    image = entry[0]
    return _NEAR_MISS_HALVES, {tuple(pair): {image.key: (image.uri, image.label, image.split)}}


def _closest_halves(old: dict, new: dict) -> dict:
    """{near miss: {key: member}} of both -> of the NEAR_MISSES smallest near misses (bounded)."""
    merged = {pair: dict(halves) for pair, halves in old.items()}
    for pair, halves in new.items():
        merged.setdefault(pair, {}).update(halves)
    return {pair: merged[pair] for pair in sorted(merged)[:NEAR_MISSES]}


def _finish_stats(stats: dict, max_moved_share: float) -> dict:
    """The summed stats -> the grouping's stats: the guard's decision (`changes_withheld`, and then no
    split change and no drop: `_guarded`), and the near misses with their members."""
    stats = dict(stats)
    stats["changes_withheld"] = int(stats["would_move"] > max_moved_share * stats["images"])
    if stats["changes_withheld"]:
        stats["split_changes"] = stats["dropped"] = 0
    counts = split_counts.SplitLabelCountsFn()
    moves = [] if stats["changes_withheld"] else [stats.pop(_SPLIT_MOVES, None) or {}]
    stats.pop(_SPLIT_MOVES, None)
    stats[_SPLIT_COUNTS] = counts.merge_accumulators([stats.pop(_SPLIT_COUNTS, None) or {}, *moves])
    halves = stats.pop(_NEAR_MISS_HALVES, None) or {}
    listed = []
    for (distance, key_a, key_b), members in sorted(halves.items()):
        if key_a in members and key_b in members:
            (uri_a, label_a, split_a), (uri_b, label_b, split_b) = members[key_a], members[key_b]
            listed.append(
                {
                    "distance": distance,
                    "uris": [uri_a, uri_b],
                    "labels": [label_a, label_b],
                    "splits": [split_a, split_b],
                }
            )
    if listed:
        stats["near_misses"] = listed
    return stats


def _member_stats(item):
    """A `_follow` item -> a member's counts before the guard (none for a centre): would it move (kept or
    not: the guard trips alike in keep and drop mode), does it move (kept, to another split), is it dropped.
    `_finish_stats` zeroes the last two when the guard withholds the changes."""
    kind, member = item
    if kind != _MEMBER:
        return
    moves = member.split != member.image.split
    yield "would_move", int(moves)
    yield "split_changes", int(moves and member.kept)
    yield "dropped", int(not member.kept)
    for delta in split_counts.member_deltas(member):
        yield _SPLIT_MOVES, delta


def _guarded(member: GroupMember, stats: dict) -> GroupMember:
    """The member as the guard leaves it: in its own split, and kept, when changes are withheld."""
    if not stats["changes_withheld"]:
        return member
    return dataclasses.replace(member, split=member.image.split, kept=True)


class FindNearDuplicateGroups(beam.PTransform):
    """PCollection[SignedImage] -> {"members": GroupMember, "groups": NearDuplicateGroup, "stats": one dict,
    "split_counts": one {(split, label): images} after grouping (split_counts.py)}.

    `max_distance`: the largest grey distance of a pair of near-duplicates (signature.near).
    `drop`: keep one member per group (kept=False for the others).
    `bands`: how many interleaved bands the grey hash is cut into (default: 16 bits each).
    `max_bucket_size`: a bucket with more entries is hot and skipped (counted).
    `rounds`: rounds of label propagation (unconverged images are counted).
    `max_group_size`: a larger group moves no one. `max_component_size`: a larger component is left alone.
    `max_moved_share`: when more of the images would move, none moves and none is dropped.
    `more_split_counts`: ((split, label), n) of images not grouped, added to "split_counts" (the same
    combine as the stats: one shuffle).
    `run_id`: a PCollection of one element (stage 1's run id), counted as nothing: the stats' combine never
    sees an empty input, so it needs no default, whose step is a stage of its own (up to about 0.1 CPU s per
    job in worker processes). Without it the combine has its default.
    How: docs/internals.md, "preprocess/near_duplicates/grouping.py".
    """

    def __init__(
        self,
        max_distance: int,
        drop: bool = False,
        *,
        bands: int | None = None,
        max_bucket_size: int = DEFAULT_MAX_BUCKET_SIZE,
        rounds: int = DEFAULT_ROUNDS,
        max_group_size: int = DEFAULT_MAX_GROUP_SIZE,
        max_component_size: int = DEFAULT_MAX_COMPONENT_SIZE,
        max_moved_share: float = DEFAULT_MAX_MOVED_SHARE,
        signature_bits: int = CANDIDATE_BITS,
        more_split_counts=None,
        run_id=None,
    ):
        super().__init__()
        if max_distance < 0:
            raise ValueError(f"max_distance must be 0 or more, not {max_distance}")
        if max_bucket_size < 2:
            raise ValueError(f"max_bucket_size must be at least 2, not {max_bucket_size}")
        if rounds < 0:
            raise ValueError(f"rounds must be 0 or more, not {rounds}")
        if max_group_size < 2:
            raise ValueError(f"max_group_size must be at least 2, not {max_group_size}")
        self._max_distance = max_distance
        self._drop = drop
        self._masks = band_masks(default_bands(signature_bits) if bands is None else bands, signature_bits)
        self._max_bucket_size = max_bucket_size
        self._rounds = rounds
        self._max_group_size = max_group_size
        self._max_component_size = max_component_size
        self._max_moved_share = max_moved_share
        self._more_split_counts = more_split_counts
        self._run_id = run_id

    def expand(self, images):
        collapsed = (
            images
            | "BySignature" >> beam.Map(lambda image: (signature_bytes(image.signature), image))
            | "Floods" >> beam.GroupByKey()
            | "Collapse"
            >> beam.ParDo(CollapseFloodFn()).with_outputs("followers", "stats", main="representatives")
        )
        representatives = collapsed.representatives
        verified = (
            representatives
            | "Bands"
            >> beam.FlatMap(lambda entry, tables: _band_entries(entry[0], tables), _BandTables(self._masks))
            | "Buckets" >> beam.GroupByKey()
            | "Verify"
            >> beam.ParDo(VerifyBucketFn(self._max_distance, self._max_bucket_size)).with_outputs(
                "stats", "near_misses", main="edges"
            )
        )
        keyed = representatives | "ByKey" >> beam.Map(lambda entry: (entry[0].key, entry))
        # The near misses the report lists, sent to both members' keys: the components' last step, which
        # joins each key to its representative, gives their uris, labels and splits.
        near_miss_members = verified.near_misses | "NearMissMembers" >> beam.FlatMap(
            lambda pair: ((pair[1], pair), (pair[2], pair))
        )
        components = verified.edges | "Components" >> LabelComponents(keyed, self._rounds, near_miss_members)
        grouped = (
            components["entries"]
            | "ComponentGroup" >> beam.GroupByKey()
            | "CutIntoGroups"
            >> beam.ParDo(
                GroupComponentFn(
                    self._max_distance, self._max_group_size, self._max_component_size, self._drop
                )
            ).with_outputs("stats", main="decisions")
        )
        # Every member and centre leaves this one step (each stage costs up to about 0.1 CPU s per job in worker
        # processes: no Flatten of members made in two stages).
        decided = _join("Followers", grouped.decisions, collapsed.followers) | "Follow" >> beam.FlatMap(
            _follow, self._drop
        )

        low_information = images | "LowInformation" >> beam.FlatMap(
            lambda image: (
                [("low_information_by_split", {image.split: 1})]
                if signature_lib.is_low_information(image.signature)
                else []
            )
        )
        # Every count in one combine, the guard's among them: the members are counted before it, and
        # `_finish_stats` decides it (one shuffle, where a guard of its own and the stats were two).
        counts = (
            collapsed.stats,
            verified.stats,
            *components["stats"],
            grouped.stats,
            low_information,
            components["along"] | "NearMissHalves" >> beam.MapTuple(_near_miss_half),
            images
            | "CountImages"
            >> beam.FlatMap(lambda image: (("images", 1), (_SPLIT_COUNTS, split_counts.image_count(image)))),
            decided | "MemberStats" >> beam.FlatMap(_member_stats),
        )
        if self._more_split_counts is not None:
            counts += (
                self._more_split_counts | "MoreSplitCounts" >> beam.Map(lambda pair: (_SPLIT_COUNTS, pair)),
            )
        combine = beam.CombineGlobally(SumStatsFn())
        if self._run_id is not None:
            counts += (self._run_id | "NeverEmpty" >> beam.Map(lambda _: ("images", 0)),)
            combine = combine.without_defaults()
        counts = counts | "AllCounts" >> beam.Flatten()
        finished = (
            counts | "Stats" >> combine | "FinishStats" >> beam.Map(_finish_stats, self._max_moved_share)
        )
        stats = finished | "WithoutSplitCounts" >> beam.Map(
            lambda stats: {name: value for name, value in stats.items() if name != _SPLIT_COUNTS}
        )
        after_grouping = finished | "SplitCounts" >> beam.Map(lambda stats: stats[_SPLIT_COUNTS])
        guarded = decided | "ApplyGuard" >> beam.ParDo(
            GuardFn(), beam.pvalue.AsSingleton(finished)
        ).with_outputs("listed", main="members")
        groups = (
            guarded.listed
            | "ListGroups" >> _FoldPerKey(ListGroupFn())
            | "ToGroups" >> beam.FlatMapTuple(_to_group)
        )
        return {"members": guarded.members, "groups": groups, "stats": stats, "split_counts": after_grouping}
