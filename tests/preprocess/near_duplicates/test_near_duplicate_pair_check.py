"""preprocess/near_duplicates/signature.py: the pair check, unpacked once per signature (issue 30's speed fix),
gives what the straightforward per-pair unpacking gave, bit for bit; and grouping.bucket_near_pairs, which
takes each pair's grey distance once (not again in `near`), gives what the per-pair loop gave.

`_reference` below is the pair check as it was before (numpy, every field unpacked for every pair), kept as the
oracle. The pairs are made to reach every branch: copies with a few grey bits flipped, mirrored copies,
colour casts, grayscale copies, jittered thumbnails, low-information and flat-object flags, objects of
other proportions, and unrelated signatures; the test counts that each branch was met.
"""

import itertools
import random

import numpy as np

from preprocess.near_duplicates import grouping, signature
from preprocess.near_duplicates.signature import (
    _ASPECT_SHIFT,
    _CHECK_SHIFT,
    _CHECK_VALUES,
    _COLOUR_SHIFT,
    _COLOUR_VALUES,
    _DETAIL_SHIFT,
    _FLAT_OBJECT_BIT,
    _FRAME_SHIFT,
    _LOW_INFORMATION_BIT,
    _MIRROR_SHIFT,
    _MIRRORED_DETAIL_SHIFT,
    CANDIDATE_BITS,
    DEFAULT_MAX_DISTANCE,
    MAX_COLOUR_CHECKED_DISTANCE,
    SIGNATURE_BITS,
)

# About a second; `compare(200_000)` was run once by hand (benchmarks/RESULTS.md, issue 30).
PAIRS = 8_000


class _Reference:
    """The pair check before the fields were cached (signature.py at 2f440fe), on the same constants; with
    version 6's detail hashes of two objects on a background, and brighter copies of coloured flat objects."""

    grid, cells = 4, 16

    @staticmethod
    def grey_distance(a, b):
        mask = (1 << CANDIDATE_BITS) - 1
        straight = ((a ^ b) & mask).bit_count()
        mirrored = ((a ^ (b >> _MIRROR_SHIFT)) & mask).bit_count()
        return (mirrored, True) if mirrored < straight else (straight, False)

    @staticmethod
    def frame(value, mirrored=False):
        left, top, right, bottom = ((value >> _FRAME_SHIFT) & 0xFFFFFFFF).to_bytes(4, "little")
        size = signature.BASE_SIZE
        return (size - right, top, size - left, bottom) if mirrored else (left, top, right, bottom)

    @classmethod
    def objects_agree(cls, a, b, mirrored=False):
        frame_a, frame_b = cls.frame(a), cls.frame(b, mirrored)
        if signature._is_object(frame_a) and signature._is_object(frame_b):
            aspect_a, aspect_b = (value >> _ASPECT_SHIFT & 0xFFFF for value in (a, b))
            if 1000 * abs(aspect_a - aspect_b) > signature.ASPECT_TOLERANCE_PER_MILLE * min(
                aspect_a, aspect_b
            ):
                return False
            mask = (1 << CANDIDATE_BITS) - 1
            detail_b = b >> (_MIRRORED_DETAIL_SHIFT if mirrored else _DETAIL_SHIFT) & mask
            if ((a >> _DETAIL_SHIFT & mask) ^ detail_b).bit_count() > signature.DETAIL_MAX_DISTANCE:
                return False
        return True

    @staticmethod
    def colours(value):
        raw = ((value >> _COLOUR_SHIFT) & ((1 << (8 * _COLOUR_VALUES)) - 1)).to_bytes(
            _COLOUR_VALUES, "little"
        )
        return np.frombuffer(raw, dtype=np.uint8).astype(np.int64) - signature._CHROMA_OFFSET

    @staticmethod
    def check_thumbnail(value):
        raw = ((value >> _CHECK_SHIFT) & ((1 << (8 * _CHECK_VALUES)) - 1)).to_bytes(_CHECK_VALUES, "little")
        return np.frombuffer(raw, dtype=np.uint8).astype(np.int64).reshape(8, 8)

    mirrored_cells = np.arange(16).reshape(4, 4)[:, ::-1].reshape(-1)
    mirrored_colours = np.concatenate([mirrored_cells, mirrored_cells + 16])

    @classmethod
    def colour_difference(cls, a, b, mirrored=False):
        colours_b = cls.colours(b)
        if mirrored:
            colours_b = colours_b[cls.mirrored_colours]
        return int(np.abs(cls.colours(a) - colours_b).sum())

    @classmethod
    def cast_difference(cls, a, b, mirrored=False):
        colours_a, colours_b = cls.colours(a), cls.colours(b)
        if mirrored:
            colours_b = colours_b[cls.mirrored_colours]
        if (
            np.abs(colours_a).max() <= signature.GREY_CHROMA
            or np.abs(colours_b).max() <= signature.GREY_CHROMA
        ):
            return 0
        total = 0
        for channel in (slice(0, 16), slice(16, 32)):
            deviation_a = colours_a[channel] * 16 - colours_a[channel].sum()
            deviation_b = colours_b[channel] * 16 - colours_b[channel].sum()
            total += int(np.abs(deviation_a - deviation_b).sum())
        return total // 16

    @classmethod
    def thumbnails_agree(cls, a, b, mirrored=False, min_per_mille=signature.MIN_CORRELATION_PER_MILLE):
        first, second = cls.check_thumbnail(a), cls.check_thumbnail(b)
        if mirrored:
            second = second[:, ::-1]
        if signature.is_low_information(a) or signature.is_low_information(b):
            return int(np.abs(first - second).max()) <= signature.LOW_INFORMATION_TOLERANCE
        if signature.is_flat_object(a) or signature.is_flat_object(b):
            difference = np.abs(first - second)
            if (
                int(difference.sum()) <= signature.FLAT_OBJECT_TOLERANCE * 64
                and int(difference.max()) <= signature.FLAT_OBJECT_MAX_DIFFERENCE
            ):
                return True
            # A brighter or darker copy of a coloured one: the same box, whole thumbnails correlated, the
            # slope within the gain.
            if any(np.abs(cls.colours(value)).max() <= signature.GREY_CHROMA for value in (a, b)):
                return False
            box_a, box_b = np.array(cls.frame(a)), np.array(cls.frame(b, mirrored))
            if int(np.abs(box_a - box_b).max()) > signature.FLAT_OBJECT_FRAME_TOLERANCE:
                return False
            x, y = first.reshape(-1), second.reshape(-1)
            count = x.size
            covariance = count * int((x * y).sum()) - int(x.sum()) * int(y.sum())
            variance_a = count * int((x * x).sum()) - int(x.sum()) ** 2
            variance_b = count * int((y * y).sum()) - int(y.sum()) ** 2
            if variance_a == 0 or variance_b == 0 or covariance <= 0:
                return False
            most, least = signature.FLAT_OBJECT_GAIN
            correlation = signature.FLAT_OBJECT_MIN_CORRELATION_PER_MILLE
            return (
                1000**2 * covariance**2 >= correlation**2 * variance_a * variance_b
                and least * variance_a <= most * covariance
                and least * covariance <= most * variance_a
            )
        first, second = first[1:-1, 1:-1], second[1:-1, 1:-1]
        count = first.size
        sum_a, sum_b = int(first.sum()), int(second.sum())
        covariance = count * int((first * second).sum()) - sum_a * sum_b
        variance_a = count * int((first * first).sum()) - sum_a * sum_a
        variance_b = count * int((second * second).sum()) - sum_b * sum_b
        if variance_a == 0 or variance_b == 0:
            return int(np.abs(first - second).max()) <= signature.LOW_INFORMATION_TOLERANCE
        return (
            covariance > 0 and 1000**2 * covariance * covariance >= min_per_mille**2 * variance_a * variance_b
        )

    @classmethod
    def near(cls, a, b, max_distance):
        grey, mirrored = cls.grey_distance(a, b)
        if grey > max_distance or not cls.objects_agree(a, b, mirrored):
            return None
        if cls.colour_difference(a, b, mirrored) <= signature.COLOUR_TOLERANCE:
            minimum = (
                signature.MIRRORED_MIN_CORRELATION_PER_MILLE
                if mirrored
                else signature.MIN_CORRELATION_PER_MILLE
            )
            return grey if cls.thumbnails_agree(a, b, mirrored, minimum) else None
        if (
            grey <= max_distance // 2
            and cls.cast_difference(a, b, mirrored) <= signature.COLOUR_TOLERANCE
            and cls.thumbnails_agree(a, b, mirrored, signature.RECOLOURED_MIN_CORRELATION_PER_MILLE)
        ):
            return grey
        return None

    @classmethod
    def distance(cls, a, b):
        grey, _ = cls.grey_distance(a, b)
        if grey > MAX_COLOUR_CHECKED_DISTANCE:
            return grey
        return grey if cls.near(a, b, grey) is not None else signature.COLOUR_MISMATCH


def _pack(
    grey, mirror, colours, thumbnail, low_information, frame, aspect, flat_object, detail, mirrored_detail
) -> int:
    return (
        grey
        | mirror << _MIRROR_SHIFT
        | int.from_bytes(bytes(colours), "little") << _COLOUR_SHIFT
        | int.from_bytes(bytes(thumbnail), "little") << _CHECK_SHIFT
        | int(low_information) << _LOW_INFORMATION_BIT
        | int.from_bytes(bytes(frame), "little") << _FRAME_SHIFT
        | aspect << _ASPECT_SHIFT
        | int(flat_object) << _FLAT_OBJECT_BIT
        | detail << _DETAIL_SHIFT
        | mirrored_detail << _MIRRORED_DETAIL_SHIFT
    )


def _clip(value):
    return max(0, min(255, value))


def _original(rng: random.Random) -> dict:
    spread = rng.choice((0, 2, 6, 20, 60))  # 0: a flat thumbnail (zero variance)
    centre = rng.randrange(40, 216)
    chroma = rng.choice((1, 4, 12))  # 1: a grey layout
    framed = rng.random() < 0.3
    return dict(
        grey=rng.getrandbits(CANDIDATE_BITS),
        mirror=rng.getrandbits(CANDIDATE_BITS),
        colours=[_clip(128 + rng.randint(-chroma, chroma)) for _ in range(32)],
        thumbnail=[_clip(centre + rng.randint(-spread, spread)) for _ in range(64)],
        low_information=rng.random() < 0.1,
        frame=(rng.randint(1, 30), rng.randint(1, 30), rng.randint(98, 127), rng.randint(98, 127))
        if framed
        else rng.choice(((0, 0, 128, 128), (0, 12, 128, 116))),
        aspect=rng.randrange(300, 3000),
        flat_object=rng.random() < 0.1,
        detail=rng.getrandbits(CANDIDATE_BITS),
        mirrored_detail=rng.getrandbits(CANDIDATE_BITS),
    )


def _copy(rng: random.Random, fields: dict) -> dict:
    """An altered copy of `fields`: each part changed or not, by a little or a lot."""
    copy = dict(fields)
    flips = rng.sample(range(CANDIDATE_BITS), rng.choice((0, 1, 2, 3, 4, 6, 8, 10, 14, 20)))
    grey = fields["grey"] ^ sum(1 << bit for bit in flips)
    detail_flips = rng.sample(range(CANDIDATE_BITS), rng.choice((0, 4, 12, 16, 17, 24)))
    detail = fields["detail"] ^ sum(1 << bit for bit in detail_flips)
    copy["detail"] = detail
    if rng.random() < 0.25:  # a mirrored copy: its mirror hash is near the original's grey hash
        copy["grey"], copy["mirror"] = fields["mirror"], grey
        copy["detail"], copy["mirrored_detail"] = fields["mirrored_detail"], detail
        copy["thumbnail"] = [v for row in range(8) for v in fields["thumbnail"][row * 8 : row * 8 + 8][::-1]]
        left, top, right, bottom = fields["frame"]
        copy["frame"] = (signature.BASE_SIZE - right, top, signature.BASE_SIZE - left, bottom)
        colours = fields["colours"]
        order = [r * 4 + c for r in range(4) for c in (3, 2, 1, 0)]
        copy["colours"] = [colours[i] for i in order] + [colours[16 + i] for i in order]
    else:
        copy["grey"] = grey
    kind = rng.random()
    if kind < 0.2:  # a colour cast
        copy["colours"] = [_clip(v + rng.randint(2, 12)) for v in copy["colours"]]
    elif kind < 0.35:  # grayscale
        copy["colours"] = [_clip(128 + rng.randint(-2, 2)) for _ in range(32)]
    elif kind < 0.5:  # other colours
        copy["colours"] = [_clip(128 + rng.randint(-12, 12)) for _ in range(32)]
    if rng.random() < 0.2:  # brighter or darker: each cell's distance from white scaled
        gain = rng.choice((0.5, 0.7, 0.85, 1.2, 1.5, 2.0))
        copy["thumbnail"] = [_clip(round(255 - (255 - v) * gain)) for v in copy["thumbnail"]]
    jitter = rng.choice((0, 1, 3, 6, 10, 40))
    copy["thumbnail"] = [_clip(v + rng.randint(-jitter, jitter)) for v in copy["thumbnail"]]
    if rng.random() < 0.1:
        copy["low_information"] = not copy["low_information"]
    if rng.random() < 0.1:
        copy["flat_object"] = not copy["flat_object"]
    if rng.random() < 0.2:
        copy["aspect"] = max(1, copy["aspect"] + rng.randint(-300, 300))
    return copy


def compare(count: int, seed: int = 30) -> dict:
    """Asserts that `count` pairs get the same answers from signature.py and `_Reference`; returns how many
    pairs passed each branch."""
    rng = random.Random(seed)
    originals = [_original(rng) for _ in range(600)]
    signatures = [_pack(**fields) for fields in originals]
    pairs = []
    for _ in range(count):
        index = rng.randrange(len(originals))
        if rng.random() < 0.85:
            pairs.append((signatures[index], _pack(**_copy(rng, originals[index]))))
        else:
            pairs.append((signatures[index], rng.choice(signatures)))
    met = {
        "near": 0,
        "not near": 0,
        "mirrored": 0,
        "recoloured": 0,
        "low information": 0,
        "flat object": 0,
        "flat object, brighter": 0,
        "objects, detail too far": 0,
    }
    for a, b in pairs:
        for max_distance in (DEFAULT_MAX_DISTANCE, DEFAULT_MAX_DISTANCE + 3):
            found = signature.near(a, b, max_distance)
            assert found == _Reference.near(a, b, max_distance), (hex(a), hex(b), max_distance)
        assert signature.distance(a, b) == _Reference.distance(a, b)
        for mirrored in (False, True):
            assert signature.objects_agree(a, b, mirrored) == _Reference.objects_agree(a, b, mirrored)
            assert signature.colour_difference(a, b, mirrored) == _Reference.colour_difference(a, b, mirrored)
            assert signature.cast_difference(a, b, mirrored) == _Reference.cast_difference(a, b, mirrored)
            assert signature.thumbnails_agree(a, b, mirrored) == _Reference.thumbnails_agree(a, b, mirrored)
        assert signature.grey_distance(a, b) == _Reference.grey_distance(a, b)
        grey, mirrored = signature.grey_distance(a, b)
        met["near" if found is not None else "not near"] += 1
        met["objects, detail too far"] += not signature.objects_agree(
            a, b, mirrored
        ) and _Reference.objects_agree(
            a & ~((1 << SIGNATURE_BITS) - (1 << _DETAIL_SHIFT)),
            b & ~((1 << SIGNATURE_BITS) - (1 << _DETAIL_SHIFT)),
            mirrored,
        )
        if found is not None:
            met["mirrored"] += mirrored
            met["recoloured"] += signature.colour_difference(a, b, mirrored) > signature.COLOUR_TOLERANCE
            met["low information"] += signature.is_low_information(a) or signature.is_low_information(b)
            flat = signature.is_flat_object(a) or signature.is_flat_object(b)
            met["flat object"] += flat
            if flat and not (signature.is_low_information(a) or signature.is_low_information(b)):
                first, second = _Reference.check_thumbnail(a), _Reference.check_thumbnail(b)
                if mirrored:
                    second = second[:, ::-1]
                met["flat object, brighter"] += (
                    int(np.abs(first - second).sum()) > signature.FLAT_OBJECT_TOLERANCE * 64
                )
    return met


def test_the_cached_pair_check_gives_what_the_per_pair_unpacking_gave():
    met = compare(PAIRS)
    # Every branch was met by pairs that pass it, not only by pairs turned away before it.
    assert min(met.values()) >= 20, met


def test_a_bucket_takes_each_pair_grey_distance_once_and_finds_what_the_per_pair_loop_found(monkeypatch):
    rng = random.Random(31)
    originals = [_original(rng) for _ in range(60)]
    held = []
    for index, fields in enumerate(originals):
        held.append((f"{index:03d}a", _pack(**fields)))
        held.extend((f"{index:03d}{copy}", _pack(**_copy(rng, fields))) for copy in "bc")
    held = sorted(held)
    reach = DEFAULT_MAX_DISTANCE + grouping.NEAR_MISS_BITS
    expected, expected_histogram = [], [0] * (grouping.HISTOGRAM_BITS + 1)
    for (key_a, a), (key_b, b) in itertools.combinations(held, 2):
        if key_a == key_b:
            continue
        grey, _ = _Reference.grey_distance(a, b)
        if grey <= grouping.HISTOGRAM_BITS:
            expected_histogram[grey] += 1
        found = _Reference.near(a, b, reach)
        if found is not None:
            expected.append((found, key_a, key_b))
    assert len(expected) >= 20, len(expected)

    # Every grey distance the bucket takes, counted (signature's own functions, wrapped).
    taken = []
    for name in ("grey_distance", "hashes_distance"):
        if hasattr(signature, name):
            original = getattr(signature, name)
            monkeypatch.setattr(
                signature, name, lambda *args, _original=original: taken.append(1) or _original(*args)
            )
    histogram = [0] * (grouping.HISTOGRAM_BITS + 1)
    assert list(grouping.bucket_near_pairs(held, reach, histogram)) == expected
    assert histogram == expected_histogram
    pairs = sum(1 for (key_a, _), (key_b, _) in itertools.combinations(held, 2) if key_a != key_b)
    assert len(taken) == pairs
