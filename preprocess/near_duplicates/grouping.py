"""Near-duplicate groups at Beam scale: candidate pairs from signature bands, groups as connected components.

FindNearDuplicateGroups takes one SignedImage per distinct image (exact
copies are already gone: preprocess/inputs/content.py) and returns the groups of
images whose signatures are within `max_distance` bits of each other,
transitively, with the split every member gets and, in drop mode, the one
member kept. No step holds more than a bounded amount, whatever the corpus
or however popular a signature, and every decision is a function of the set
of images alone (never of their order, their bundles or which worker saw
what), so a re-run gives the same groups, splits and kept members.

1. Candidates: the signature's candidate bits (`signature.CANDIDATE_BITS`, its
   grey hash) are cut into `bands` contiguous bands (16 bits each by default: 4 bands for a 64-bit signature) and each image
   goes to one bucket per band, keyed by (band, the band's bits). Two images
   are candidates when they share a bucket. Guarantee (pigeonhole): a pair
   within `bands - 1` bits has a band with no differing bit, so it always
   shares a bucket. Beyond that it is found with the probability that at
   least one band is clean (`band_detection_probability`; 4 x 16 bits, if
   the differing bits fall uniformly: 0.90 at 4 bits, 0.74 at 5, 0.58 at
   6, 0.33 at 8, 0.17 at 10; a group of several copies is also joined
   through any of its pairs). Why 16-bit bands: a bucket's expected size is
   N / 2**16, 153 images at 10M images, so a bucket's pairs (153**2 / 2)
   are checked in milliseconds and the whole corpus costs about 3 billion
   XOR-and-popcounts at 10M (0.2 us each); 8-bit bands (8 x 8) would
   guarantee 7 bits but put 39,000 images in every bucket at 10M, 250x
   the pairs, and every bucket would be hot.
2. Hot buckets, first: a bucket of more than `max_bucket_size` images (100k
   near-blank images share their band bits) is hot, and its images are left
   out of grouping altogether, before any pair is checked. A first pass
   groups only the images' keys by bucket and streams a hot bucket's keys
   out (read twice, never held: once to count up to the cap, once to emit);
   the images are then joined with those keys. Why all of a hot image's
   buckets: near-identical images also fill the other bands' buckets just
   under the cap, and their pairs there would form one component of all of
   them, with edges quadratic in the popular signature's count (3,000
   near-blank signatures in the tests gave 47,000 edges; with 60,000 among
   400,000 images one worker reached 5.3 GB, when only the hot buckets
   themselves were skipped). Counted in stats:
   `hot_buckets`, `images_in_hot_buckets` (distinct images). Whether a
   bucket is hot depends on its size alone, so the result does not depend
   on which images arrived first. A hot image keeps its own split (a
   function of its content), and so may straddle splits with its
   near-duplicates: that is the cost of a bounded step, and it is counted.
   At 10M uniformly spread signatures a bucket averages 153 images, so a
   legitimate image lands in a hot bucket (over 2,000) only where
   signatures are popular.
3. Verification: the other images are bucketed again and each pair of a
   bucket (now at most `max_bucket_size` images) is checked,
   `signature.distance <= max_distance`, inside the bucket's one call; only verified
   edges leave it, and an edge found by several bands is kept once.
4. Connected components of the verified edges, in a fixed number of `rounds`
   of min-label propagation with hooking and pointer jumping (Shiloach-Vishkin
   style) over the images that have an edge: each round, every image takes the
   smallest label among itself and its neighbours, the old label's image takes
   it too (hooking), then every image jumps to its label's label. Each round
   is three shuffles of (key, label) pairs; a chain of n images converges in
   about log1.5(n) rounds (measured: 9 rounds for 1,000, 12 for 10,000, 16
   for 100,000 in the worst order, keys sorted along the chain). A component
   converges to its smallest key, which is the group's id. After the rounds,
   a check finds any image whose label would still change (a neighbour with
   a smaller label, or a label that is not a root): those are counted in
   `stats["images_not_converged"]`, never hidden. A group of an unconverged
   component is a connected part of it (never two components merged), so its
   members may then straddle splits: raise `rounds`.
5. Per group, a combine of bounded size decides: the smallest key and its
   split, whether any member's split was given, whether labels or splits
   differ, and the member drop mode keeps (largest source_pixels, then
   largest num_bytes, then smallest key). Then each member streams past its
   group's decision (a group-by of the decision and the members, as in
   content.py) to become a GroupMember.

The split: with no `split_given` member, every member gets the split of the
member with the smallest key (its own pre-grouping split, a function of its
content), so the split stays a function of content alone. With any
`split_given` member, every member keeps its own split (a manifest's split
is never changed), and a group whose splits differ counts in
`groups_across_splits`.

What still grows with a group: its `groups` element lists all its members
(one JSONL line). Groups are connected components of near-duplicates, small
in real data; the popular signatures that would make a huge one are the hot
buckets above, which are skipped.
"""

import dataclasses
import itertools
import json
import math

import apache_beam as beam
from apache_beam.metrics import Metrics

from preprocess.near_duplicates.signature import CANDIDATE_BITS
from preprocess.near_duplicates.signature import distance as signature_distance

# 16-bit bands: see the module docstring (bucket sizes at 10M images).
BITS_PER_BAND = 16
# A bucket larger than this is hot: its pairs (up to 2M at this size, about a second) are not checked.
DEFAULT_MAX_BUCKET_SIZE = 2000
# Rounds of label propagation: chains of up to ~10,000 images converge in 12 (module docstring, 4).
DEFAULT_ROUNDS = 12

STATS_KEYS = (
    "groups",
    "images_in_groups",
    "groups_with_several_labels",
    "groups_across_splits",
    "dropped",
    "split_changes",
    "candidate_pairs",
    "verified_pairs",
    "hot_buckets",
    "images_in_hot_buckets",
    "images_not_converged",
)


@dataclasses.dataclass(frozen=True)
class SignedImage:
    key: str  # the image's content key: the hex sha256 of its bytes (the record's `sha256`)
    signature: int
    uri: str
    label: str
    split: str  # its split before grouping
    split_given: bool  # True when the input named the split (manifest column, split folder): never changed
    source_pixels: int = 0  # width * height of the source image (drop mode keeps the largest)
    num_bytes: int = 0  # the source file's size (tie-break after source_pixels)
    locator: tuple = ()  # opaque to grouping, carried through: where the pipeline keeps the decoded image


@dataclasses.dataclass(frozen=True)
class GroupMember:
    image: SignedImage
    group: str  # the group's id: the smallest member key
    split: str  # the member's split after grouping
    kept: bool  # False only in drop mode, for every member but one


@dataclasses.dataclass(frozen=True)
class NearDuplicateGroup:
    group: str  # the smallest member key
    members: tuple  # tuple[GroupMember, ...], sorted by key
    max_distance: int  # the largest verified distance inside the group's edges

    @property
    def split(self) -> str | None:
        """The split every member has, or None when they differ (only possible with a given split)."""
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
                "uris": [member.image.uri for member in members],
                "labels": [member.image.label for member in members],
                "splits": [member.split for member in members],
                "sha256": [member.image.key for member in members],
                "kept": [member.kept for member in members],
            },
            separators=(",", ":"),
        )


def band_ranges(bands: int, bits: int = CANDIDATE_BITS) -> list[tuple[int, int]]:
    """(shift, width) of each band: `bits` cut into `bands` contiguous bands whose widths differ by at most one."""
    if not 1 <= bands <= bits:
        raise ValueError(f"bands must be between 1 and {bits} (the signature's bits), not {bands}")
    ranges, shift = [], 0
    for band in range(bands):
        width = bits // bands + (1 if band < bits % bands else 0)
        ranges.append((shift, width))
        shift += width
    return ranges


def default_bands(bits: int = CANDIDATE_BITS) -> int:
    return max(1, bits // BITS_PER_BAND)


def band_detection_probability(distance: int, bands: int, bits: int = CANDIDATE_BITS) -> float:
    """The chance that a pair `distance` bits apart shares a bucket, if its differing bits are placed uniformly.

    1.0 up to `bands - 1` bits (pigeonhole). Inclusion-exclusion over the sets of clean bands.
    """
    widths = [width for _, width in band_ranges(bands, bits)]
    total = math.comb(bits, distance)
    probability = 0  # an exact integer count of placements, divided once
    for size in range(1, bands + 1):
        for chosen in itertools.combinations(widths, size):
            probability += (-1) ** (size + 1) * math.comb(bits - sum(chosen), distance)
    return probability / total


def _band_entries(image: SignedImage, ranges):
    point = (image.key, image.signature)
    for band, (shift, width) in enumerate(ranges):
        yield (band, (image.signature >> shift) & ((1 << width) - 1)), point


def _band_keys(image: SignedImage, ranges):
    for bucket, (key, _) in _band_entries(image, ranges):
        yield bucket, key


class FindHotImagesFn(beam.DoFn):
    """((band, bits), [key, ...]) -> the keys of a hot bucket (more than `max_bucket_size` images), streamed.

    The bucket is read twice, never held: once to count (up to the cap + 1),
    once to stream its keys out if it is hot. Its count goes to the 'stats'
    output as ("hot_buckets", 1).
    """

    def __init__(self, max_bucket_size: int):
        self._max_bucket_size = max_bucket_size
        self._hot = Metrics.counter("near_duplicates", "hot_buckets")

    def process(self, element):
        _, keys = element
        if sum(1 for _ in itertools.islice(keys, self._max_bucket_size + 1)) <= self._max_bucket_size:
            return
        self._hot.inc()
        yield beam.pvalue.TaggedOutput("stats", ("hot_buckets", 1))
        yield from keys


# Declared, because Beam infers a union with TaggedOutput from a DoFn that yields tagged outputs too.
@beam.typehints.with_output_types(tuple[tuple[str, str], int])
class VerifyBucketFn(beam.DoFn):
    """((band, bits), [(key, signature), ...]) -> verified edges ((key_a, key_b), distance), key_a < key_b.

    The buckets here hold no image of a hot bucket (FindHotImagesFn ran
    first on the same buckets), so at most `max_bucket_size` images: they are
    held and every pair is checked. The count of pairs checked goes to the
    'stats' output.
    """

    def __init__(self, max_distance: int):
        self._max_distance = max_distance
        self._candidates = Metrics.counter("near_duplicates", "candidate_pairs")

    def process(self, element):
        _, points = element
        held = sorted(points)
        if len(held) < 2:
            return
        candidates = len(held) * (len(held) - 1) // 2
        self._candidates.inc(candidates)
        yield beam.pvalue.TaggedOutput("stats", ("candidate_pairs", candidates))
        limit = self._max_distance
        for index, (key_a, signature_a) in enumerate(held):
            for key_b, signature_b in held[index + 1 :]:
                if key_a == key_b:
                    continue  # one image listed twice: not a pair
                pair_distance = signature_distance(signature_a, signature_b)
                if pair_distance <= limit:
                    yield (key_a, key_b), pair_distance


# Every reduction per key below is a group-by and then a fold of the streamed values, never a lifted
# CombinePerKey: a lifted combine pre-combines in each worker in a table of up to 1,000,000 keys (builtin
# min/max/sum) or 100,000 (other CombineFns) per bundle (Beam's PGBKCVOperation): with keys of two
# sha256 hex strings, a table of a million pairs is hundreds of MB in one worker. The keys here (pairs,
# images, groups) are nearly all distinct, so pre-combining would save little shuffle anyway.
class _FoldPerKey(beam.PTransform):
    """(key, value) -> (key, `combine_fn` over the key's values): GroupByKey, then CombineValues (not lifted)."""

    def __init__(self, combine_fn: beam.CombineFn):
        super().__init__()
        self._combine_fn = combine_fn

    def expand(self, pairs):
        return pairs | "Group" >> beam.GroupByKey() | "Fold" >> beam.CombineValues(self._combine_fn)


class _SmallestPerKey(beam.PTransform):
    """(key, value) -> (key, the smallest value), without a pre-combining table (see _FoldPerKey)."""

    def expand(self, pairs):
        return (
            pairs
            | "Group" >> beam.GroupByKey()
            | "Smallest" >> beam.MapTuple(lambda key, values: (key, min(values)))
        )


class _Distinct(beam.PTransform):
    """Elements -> each distinct one once, without a pre-combining table (see _FoldPerKey)."""

    def expand(self, elements):
        return (
            elements
            | "AsKeys" >> beam.Map(lambda element: (element, None))
            | "Group" >> beam.GroupByKey()
            | "Keys" >> beam.MapTuple(lambda element, _: element)
        )


# Tags of what is grouped under one key in the joins below.
_OWN = 0  # the key's own label (or image, or decision)
_OTHER = 1  # a neighbour, a proposed label, a child, a member


def _tagged(pcollection, tag, label):
    return pcollection | label >> beam.MapTuple(lambda key, value: (key, (tag, value)))


def _join(label, own, other):
    """(key, own value) and (key, other value) -> (key, [(tag, value), ...]), grouped by key, values streamed."""
    return (
        (_tagged(own, _OWN, f"{label}TagOwn"), _tagged(other, _OTHER, f"{label}TagOther"))
        | f"{label}Flatten" >> beam.Flatten()
        | f"{label}Group" >> beam.GroupByKey()
    )


def _own(tagged):
    """The value tagged _OWN, or None (the key has none)."""
    return next((value for tag, value in tagged if tag == _OWN), None)


def _others(tagged):
    return (value for tag, value in tagged if tag == _OTHER)


def _send_label_to_neighbours(element):
    """(node, [own label, neighbours (key, distance)...]) -> (neighbour, the node's label) for each neighbour."""
    _, tagged = element
    label = _own(tagged)
    for neighbour, _ in _others(tagged):
        yield neighbour, label


def _propose_and_hook(element):
    """(node, [own label, neighbours' labels...]) -> (node, smallest) and, if smaller, (own label, smallest).

    The second one hooks the node's old root under the smaller label, so that
    whole stars merge in one round instead of one hop at a time.
    """
    node, tagged = element
    label = _own(tagged)
    smallest = min(_others(tagged), default=label)
    yield node, min(label, smallest)
    if smallest < label:
        yield label, smallest


def _jump(element):
    """(node, [own label, children...]) -> (child, the node's label) for each child: pointer jumping."""
    _, tagged = element
    label = _own(tagged)
    for child in _others(tagged):
        yield child, label


class _LabelRound(beam.PTransform):
    """(node, label) -> (node, label): one round of propagation, hooking and pointer jumping."""

    def __init__(self, adjacency):
        super().__init__()
        self._adjacency = adjacency

    def expand(self, labels):
        received = _join("Neighbours", labels, self._adjacency) | "SendLabels" >> beam.FlatMap(
            _send_label_to_neighbours
        )
        proposed = (
            _join("Proposals", labels, received)
            | "ProposeAndHook" >> beam.FlatMap(_propose_and_hook)
            | "Smallest" >> _SmallestPerKey()
        )
        children = proposed | "ToParent" >> beam.MapTuple(lambda node, label: (label, node))
        return _join("Jump", proposed, children) | "JumpToRoot" >> beam.FlatMap(_jump)


@beam.typehints.with_output_types(tuple[str, str])
class SendLabelsAndDistancesFn(beam.DoFn):
    """(node, [own label, neighbours...]) -> (neighbour, node's label); 'distances': (label, distance)."""

    def process(self, element):
        _, tagged = element
        label = _own(tagged)
        for neighbour, distance in _others(tagged):
            yield neighbour, label
            yield beam.pvalue.TaggedOutput("distances", (label, distance))


def _check_node(element):
    """(node, [own label, ("label", a neighbour's label)..., ("child", an image labelled node)...])
    -> the keys of images whose label would still change.

    Converged: no neighbour has a smaller label than the node's, and every
    image's label is a root (labelled by itself), so a node that is not a
    root has no child.
    """
    node, tagged = element
    label = _own(tagged)
    is_root = label == node
    smallest_neighbour_label = None
    for kind, value in _others(tagged):
        if kind == "label":
            if smallest_neighbour_label is None or value < smallest_neighbour_label:
                smallest_neighbour_label = value
        elif not is_root:
            yield value  # a child pointing at a node that is not a root
    if smallest_neighbour_label is not None and smallest_neighbour_label < label:
        yield node


class _CheckConvergence(beam.PTransform):
    """(node, label) -> 'not_converged': one element per image whose label would still change; 'distances'."""

    def __init__(self, adjacency):
        super().__init__()
        self._adjacency = adjacency

    def expand(self, labels):
        sent = _join("Neighbours", labels, self._adjacency) | "SendLabels" >> beam.ParDo(
            SendLabelsAndDistancesFn()
        ).with_outputs("distances", main="labels")
        neighbour_labels = sent.labels | "AsLabels" >> beam.MapTuple(
            lambda node, label: (node, ("label", label))
        )
        children = labels | "ToParent" >> beam.MapTuple(lambda node, label: (label, ("child", node)))
        others = (neighbour_labels, children) | "Others" >> beam.Flatten()
        not_converged = _join("Check", labels, others) | "CheckNodes" >> beam.FlatMap(_check_node)
        return {"not_converged": not_converged, "distances": sent.distances}


@dataclasses.dataclass(frozen=True)
class GroupDecision:
    """What one group's members decide together, in space bounded whatever the group's size."""

    count: int
    first: tuple  # (key, split) of the member with the smallest key
    split_given: bool  # whether any member's split was given
    splits: tuple  # the (at most two) smallest distinct member splits before grouping
    labels: tuple  # the (at most two) smallest distinct labels
    keep: tuple  # (-source_pixels, -num_bytes, key) of the member drop mode keeps: the smallest

    @property
    def several_labels(self) -> bool:
        return len(self.labels) > 1

    @property
    def across_splits(self) -> bool:
        """Members end in different splits: only when a split was given (they then keep their own)."""
        return self.split_given and len(self.splits) > 1

    def split_of(self, image: SignedImage) -> str:
        return image.split if self.split_given else self.first[1]


def _keep_order(image: SignedImage) -> tuple:
    return (-image.source_pixels, -image.num_bytes, image.key)


def _two_smallest(values) -> tuple:
    return tuple(sorted(set(values))[:2])


class DecideGroupFn(beam.CombineFn):
    """SignedImages of one group -> GroupDecision: O(1) per member, an accumulator of bounded size."""

    def create_accumulator(self):
        return None

    def add_input(self, accumulator, image):
        decision = GroupDecision(
            1, (image.key, image.split), image.split_given, (image.split,), (image.label,), _keep_order(image)
        )
        return decision if accumulator is None else self.merge_accumulators([accumulator, decision])

    def merge_accumulators(self, accumulators):
        accumulators = [a for a in accumulators if a is not None]
        if not accumulators:
            return None
        return GroupDecision(
            count=sum(a.count for a in accumulators),
            first=min(a.first for a in accumulators),
            split_given=any(a.split_given for a in accumulators),
            splits=_two_smallest(s for a in accumulators for s in a.splits),
            labels=_two_smallest(label for a in accumulators for label in a.labels),
            keep=min(a.keep for a in accumulators),
        )

    def extract_output(self, accumulator):
        return accumulator


def _images_by_label(element):
    """(key, [images..., label]) -> (label, image): the images of a key that has an edge."""
    _, tagged = element
    images, label = [], None
    for tag, value in tagged:
        if tag == _OWN:
            images.append(value)
        else:
            label = value
    if label is not None:
        for image in images:
            yield label, image


@beam.typehints.with_output_types(GroupMember)
class AssignMembersFn(beam.DoFn):
    """(group, [decision, images...]) -> GroupMembers, each image streamed past its group's decision.

    A lone image (a group of one: only possible when a component did not
    converge) is in no group.
    """

    def __init__(self, drop: bool):
        self._drop = drop

    def process(self, element):
        group, tagged = element
        decision = _own(tagged)
        if decision is None or decision.count < 2:
            return
        for image in _others(tagged):
            split = decision.split_of(image)
            if split != image.split:
                yield beam.pvalue.TaggedOutput("stats", ("split_changes", 1))
            kept = not self._drop or _keep_order(image) == decision.keep
            yield GroupMember(image=image, group=group, split=split, kept=kept)


def _group_stats(decision: GroupDecision, drop: bool):
    if decision.count < 2:
        return
    yield "groups", 1
    yield "images_in_groups", decision.count
    yield "groups_with_several_labels", int(decision.several_labels)
    yield "groups_across_splits", int(decision.across_splits)
    yield "dropped", decision.count - 1 if drop else 0


class ListGroupFn(beam.CombineFn):
    """("member", GroupMember) and ("distance", int) of one group -> (members sorted by key, largest distance).

    The one step whose accumulator grows with a group: a group is listed whole, as one JSONL line.
    """

    def create_accumulator(self):
        return [], 0

    def add_input(self, accumulator, value):
        members, distance = accumulator
        kind, item = value
        if kind == "member":
            members.append(item)
            return members, distance
        return members, max(distance, item)

    def merge_accumulators(self, accumulators):
        members, distance = [], 0
        for more, more_distance in accumulators:
            members.extend(more)
            distance = max(distance, more_distance)
        return members, distance

    def extract_output(self, accumulator):
        members, distance = accumulator
        return tuple(sorted(members, key=lambda member: member.image.key)), distance


def _to_group(group, listed):
    members, distance = listed
    if len(members) >= 2:
        yield NearDuplicateGroup(group=group, members=members, max_distance=distance)


class SumStatsFn(beam.CombineFn):
    """(name, count) pairs -> {name: total} with every STATS_KEYS name (0 when nothing was counted)."""

    def create_accumulator(self):
        return dict.fromkeys(STATS_KEYS, 0)

    def add_input(self, accumulator, pair):
        name, count = pair
        accumulator[name] = accumulator.get(name, 0) + count
        return accumulator

    def merge_accumulators(self, accumulators):
        total = self.create_accumulator()
        for accumulator in accumulators:
            for name, count in accumulator.items():
                total[name] = total.get(name, 0) + count
        return total

    def extract_output(self, accumulator):
        return dict(accumulator)


def _cool_images(element):
    """(key, [hot marks..., images...]) -> the images, unless the key is in a hot bucket."""
    _, tagged = element
    if _own(tagged) is None:
        yield from _others(tagged)


def _count_distinct(keys, name: str, label: str):
    return keys | f"{label}Distinct" >> _Distinct() | f"{label}Count" >> beam.Map(lambda _: (name, 1))


class FindNearDuplicateGroups(beam.PTransform):
    """PCollection[SignedImage] -> {"members": GroupMember, "groups": NearDuplicateGroup, "stats": one dict}.

    `max_distance`: the largest Hamming distance of a pair of near-duplicates.
    `drop`: keep one member per group (kept=False for the others).
    `bands`: how many bands the signature's bits are cut into (default: 16 bits
    each); a pair within `bands - 1` bits is always a candidate.
    `max_bucket_size`: a bucket with more images is hot and skipped (counted).
    `rounds`: rounds of label propagation (unconverged images are counted).
    See the module docstring.
    """

    def __init__(
        self,
        max_distance: int,
        drop: bool = False,
        *,
        bands: int | None = None,
        max_bucket_size: int = DEFAULT_MAX_BUCKET_SIZE,
        rounds: int = DEFAULT_ROUNDS,
        signature_bits: int = CANDIDATE_BITS,
    ):
        super().__init__()
        if max_distance < 0:
            raise ValueError(f"max_distance must be 0 or more, not {max_distance}")
        if max_bucket_size < 2:
            raise ValueError(f"max_bucket_size must be at least 2, not {max_bucket_size}")
        if rounds < 0:
            raise ValueError(f"rounds must be 0 or more, not {rounds}")
        self._max_distance = max_distance
        self._drop = drop
        self._ranges = band_ranges(default_bands(signature_bits) if bands is None else bands, signature_bits)
        self._max_bucket_size = max_bucket_size
        self._rounds = rounds

    def expand(self, images):
        hot = (
            images
            | "BandKeys" >> beam.FlatMap(_band_keys, self._ranges)
            | "BucketSizes" >> beam.GroupByKey()
            | "FindHot"
            >> beam.ParDo(FindHotImagesFn(self._max_bucket_size)).with_outputs("stats", main="keys")
        )
        hot_marks = hot.keys | "MarkHot" >> beam.Map(lambda key: (key, True))
        keyed_images = images | "ByKey" >> beam.Map(lambda image: (image.key, image))
        cool_images = _join("Hot", hot_marks, keyed_images) | "NotHot" >> beam.FlatMap(_cool_images)
        verified = (
            cool_images
            | "Bands" >> beam.FlatMap(_band_entries, self._ranges)
            | "Buckets" >> beam.GroupByKey()
            | "Verify" >> beam.ParDo(VerifyBucketFn(self._max_distance)).with_outputs("stats", main="edges")
        )
        edges = verified.edges | "OncePerPair" >> _SmallestPerKey()
        adjacency = edges | "BothWays" >> beam.FlatMapTuple(
            lambda pair, distance: ((pair[0], (pair[1], distance)), (pair[1], (pair[0], distance)))
        )
        labels = (
            edges
            | "OwnAndSmaller" >> beam.FlatMapTuple(lambda pair, _: ((pair[0], pair[0]), (pair[1], pair[0])))
            | "FirstLabels" >> _SmallestPerKey()
        )
        for round_number in range(1, self._rounds + 1):
            labels = labels | f"Round{round_number}" >> _LabelRound(adjacency)
        checked = labels | "CheckConvergence" >> _CheckConvergence(adjacency)

        grouped_images = _join("Images", keyed_images, labels) | "ByGroup" >> beam.FlatMap(_images_by_label)
        decisions = grouped_images | "Decide" >> _FoldPerKey(DecideGroupFn())
        assigned = _join("Members", decisions, grouped_images) | "Assign" >> beam.ParDo(
            AssignMembersFn(self._drop)
        ).with_outputs("stats", main="members")
        members = assigned.members

        listed = (
            members | "MemberByGroup" >> beam.Map(lambda member: (member.group, ("member", member))),
            checked["distances"]
            | "DistanceByGroup" >> beam.MapTuple(lambda group, d: (group, ("distance", d))),
        ) | "MembersAndDistances" >> beam.Flatten()
        groups = (
            listed | "ListGroups" >> _FoldPerKey(ListGroupFn()) | "ToGroups" >> beam.FlatMapTuple(_to_group)
        )

        drop = self._drop
        counts = (
            hot.stats,
            verified.stats,
            assigned.stats,
            decisions | "GroupStats" >> beam.FlatMapTuple(lambda _, decision: _group_stats(decision, drop)),
            edges | "VerifiedPairs" >> beam.Map(lambda _: ("verified_pairs", 1)),
            _count_distinct(hot.keys, "images_in_hot_buckets", "HotImages"),
            _count_distinct(checked["not_converged"], "images_not_converged", "NotConverged"),
        ) | "AllCounts" >> beam.Flatten()
        stats = counts | "Stats" >> beam.CombineGlobally(SumStatsFn())
        return {"members": members, "groups": groups, "stats": stats}
