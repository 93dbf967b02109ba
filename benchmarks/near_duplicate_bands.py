"""How uniform the grouping's signature bands are on real images, and what that does at 1M and 10M images.

    python -m benchmarks.near_duplicate_bands                 # ~10 min on the shared 2-core machine
    python -m benchmarks.near_duplicate_bands --images 4000   # quicker, coarser

Three corpora of distinct images, signed as stage 1 signs them (signature.source_signature):

- `photos`: random square crops (64-512 px, anywhere) of the 21 photographs
  scikit-image and matplotlib ship (benchmarks/near_duplicate_quality.py);
  crops without structure are left out;
- `products`: product-style images: one object (a textured piece of one of
  those photographs, cut as a box, a disc or a rounded tile, with a soft
  shadow) on white, at a random size and place, as catalogue photos are;
- `second`: a second product generator (`second_product_image`, below;
  of the thresholds, only signature.DETAIL_MAX_DISTANCE was chosen looking
  at it); its collisions are reported, it is not in the emulated population.

Per band, two schemes: `contiguous` (bits 16b..16b+15, the signature's
lowest frequencies in band 0: the grouping before issue 30) and
`interleaved` (bit i in band i mod 4, grouping.band_masks). The collision
rate of a band is the share of pairs of distinct images whose band values are
equal, against 1 / 2**16 for uniform bits.

Emulated scale: an image's bucket in a band at N images holds about
1 + (N - 1) q images, q the share of the corpus that shares its band value;
a bucket over the cap (grouping.DEFAULT_MAX_BUCKET_SIZE) is hot. Reported per
scheme at 1M and 10M images: the share of images left out (contiguous, the
old rule: any hot bucket leaves an image out; interleaved, the new rule: only
an image whose every bucket, hash and mirror, is hot) and the recall of the
planted copies of near_duplicate_quality's held-out corpus (a pair counts as
found when `signature.near` holds and it shares a bucket that is not hot,
and, under the old rule, neither image is left out). q is estimated from the
corpus itself, so it resolves about 1 / images: with 20,000 images, a bucket
is hot at 10M when at least 4 others share its value (q >= 2e-4, 13x
uniform).

Then the product-style images go through the real FindNearDuplicateGroups
(DirectRunner) at a quarter and at the whole of `--images`: a group is false
when two of its members are not the same picture (pieces of different
photos, or non-overlapping pieces of one: the generator draws pieces at
random, so some repeat a region, and those are copies); no false group may
grow with the corpus. The same for the second generator
(`second_product_image`: polygons, discs and boxes on off-white or light
grey, a third of them flat colours, no shadow, other proportions, its own seed).

First (and alone with --copies-only), what the products' signature costs in
recall: `--product-copies` images per generator, each with one altered copy
per kind (PRODUCT_COPY_KINDS: JPEG q70 at 0.75x, a flip, a 0.5x downscale, 4%
cut from each side, brightness x1.2 and x0.8), found when `signature.near`
holds at the default distance.

    python -m benchmarks.near_duplicate_bands --copies-only   # ~20 s
"""

import argparse
import io
import itertools
import json
import random
import sys
import tempfile
import time

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance

from benchmarks import near_duplicate_quality as quality
from preprocess.near_duplicates import signature
from preprocess.near_duplicates.grouping import DEFAULT_MAX_BUCKET_SIZE, band_masks, band_value

BANDS = 4
UNIFORM = 1 / 2**16
SCALES = (1_000_000, 10_000_000)
SCHEMES = {
    "contiguous": [list(range(16 * band, 16 * band + 16)) for band in range(BANDS)],
    "interleaved": band_masks(BANDS),
}


def photo_crops(count: int, seed: int = 1):
    """(signatures, source photo of each) of `count` random structured square crops of the photographs."""
    rng = random.Random(seed)
    photos = [Image.open(path).convert("RGB") for _, path in sorted(quality.photo_paths().items())]
    signed, sources = [], []
    while len(signed) < count:
        source = rng.randrange(len(photos))
        photo = photos[source]
        side = rng.randint(64, min(512, *photo.size))
        left, top = rng.randint(0, photo.width - side), rng.randint(0, photo.height - side)
        crop = photo.crop((left, top, left + side, top + side))
        if quality.has_structure(crop):
            signed.append(signature.source_signature(crop))
            sources.append(source)
    return signed, sources


def product_image(rng: random.Random, photos, source: int, size: int = 256, pieces=None) -> Image.Image:
    """One object on white, as catalogue photos are: a textured piece of a photograph, cut as a box, a
    disc or a rounded tile, at a random size and place, with a soft grey shadow. `pieces`, a list, gets
    (source, the piece's box in the photo)."""
    image = Image.new("RGB", (size, size), (255, 255, 255))
    width, height = rng.randint(size // 4, size * 3 // 4), rng.randint(size // 4, size * 3 // 4)
    left, top = rng.randint(8, size - width - 8), rng.randint(8, size - height - 8)
    photo = photos[source]
    scale = rng.uniform(0.5, 2.0)
    source_w, source_h = min(photo.width, round(width * scale)), min(photo.height, round(height * scale))
    x, y = rng.randint(0, photo.width - source_w), rng.randint(0, photo.height - source_h)
    piece = photo.crop((x, y, x + source_w, y + source_h)).resize((width, height))
    if pieces is not None:
        pieces.append((source, (x, y, x + source_w, y + source_h)))
    mask = Image.new("L", (width, height), 0)
    shape = rng.choice(("box", "disc", "tile"))
    draw = ImageDraw.Draw(mask)
    if shape == "box":
        draw.rectangle((0, 0, width, height), fill=255)
    elif shape == "disc":
        draw.ellipse((0, 0, width - 1, height - 1), fill=255)
    else:
        draw.rounded_rectangle((0, 0, width - 1, height - 1), radius=min(width, height) // 5, fill=255)
    shadow = Image.new("RGB", (width, height), (215, 215, 215))
    image.paste(shadow, (left + 5, top + 5), mask)
    image.paste(piece, (left, top), mask)
    return image


def second_product_image(
    rng: random.Random, photos, source: int, size: int = 320, pieces=None
) -> Image.Image:
    """Another generator, which no threshold but signature.DETAIL_MAX_DISTANCE was tuned on: a polygon, a disc or a box on an off-white or
    light grey background, filled with a piece of a photograph (two thirds of them) or a flat colour
    with a faint gradient, no shadow, at a random place; not square. `pieces` as for product_image (a flat
    object's piece is (-1 - its colour index, its box on the canvas): two are the same picture only when
    they are of one colour and overlap)."""
    height = rng.randint(size * 3 // 4, size)
    background = (rng.randint(236, 255),) * 3
    image = Image.new("RGB", (size, height), background)
    width, tall = rng.randint(size // 5, size * 2 // 3), rng.randint(height // 5, height * 2 // 3)
    left, top = rng.randint(4, size - width - 4), rng.randint(4, height - tall - 4)
    if rng.random() < 2 / 3:
        photo = photos[source]
        scale = rng.uniform(0.4, 1.6)
        source_w, source_h = min(photo.width, round(width * scale)), min(photo.height, round(tall * scale))
        x, y = rng.randint(0, photo.width - source_w), rng.randint(0, photo.height - source_h)
        fill = photo.crop((x, y, x + source_w, y + source_h)).resize((width, tall))
        piece = (source, (x, y, x + source_w, y + source_h))
    else:
        colour = rng.randrange(len(FLAT_COLOURS))
        ramp = np.linspace(-12, 12, width)[None, :, None]
        fill = Image.fromarray(
            np.clip(np.array(FLAT_COLOURS[colour]) + ramp + np.zeros((tall, 1, 1)), 0, 255).astype(np.uint8)
        )
        piece = (-1 - colour, (left, top, left + width, top + tall))
    if pieces is not None:
        pieces.append(piece)
    mask = Image.new("L", (width, tall), 0)
    draw = ImageDraw.Draw(mask)
    shape = rng.choice(("polygon", "disc", "box"))
    if shape == "polygon":
        corners = rng.randint(3, 7)
        draw.polygon(
            [
                (
                    width / 2 * (1 + np.cos(2 * np.pi * k / corners)),
                    tall / 2 * (1 + np.sin(2 * np.pi * k / corners)),
                )
                for k in range(corners)
            ],
            fill=255,
        )
    elif shape == "disc":
        draw.ellipse((0, 0, width - 1, tall - 1), fill=255)
    else:
        draw.rectangle((0, 0, width, tall), fill=255)
    image.paste(fill, (left, top), mask)
    return image


# The second generator's flat colours: catalogue-like plain objects.
FLAT_COLOURS = [(200, 30, 30), (30, 60, 150), (40, 40, 40), (230, 200, 40), (30, 140, 70), (150, 150, 155)]


def products(count: int, seed: int = 2, pieces=None, generator=None):
    """(signatures, source photo of each) of `count` product-style images; `pieces` as for product_image."""
    rng = random.Random(seed)
    photos = [Image.open(path).convert("RGB") for _, path in sorted(quality.photo_paths().items())]
    sources = [rng.randrange(len(photos)) for _ in range(count)]
    make = generator or product_image
    signed = [signature.source_signature(make(rng, photos, source, pieces=pieces)) for source in sources]
    return signed, sources


# Copies of a product-style image, each altered once, as shops re-post them (`product_copies`).
PRODUCT_COPY_KINDS = (
    "jpeg q70 0.75x",
    "flip",
    "downscale 0.5x",
    "crop 4%",
    "brightness x1.2",
    "brightness x0.8",
)


def _product_copy(kind: str, image: Image.Image) -> Image.Image:
    """The decoded file of one altered copy of a product-style image."""
    width, height = image.size
    if kind == "jpeg q70 0.75x":
        altered, quality_ = image.resize((round(width * 0.75), round(height * 0.75))), 70
    elif kind == "flip":
        altered, quality_ = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT), 90
    elif kind == "downscale 0.5x":
        altered, quality_ = image.resize((width // 2, height // 2)), 90
    elif kind == "crop 4%":
        altered, quality_ = quality._cropped(image, (0.04,) * 4), 90
    else:
        factor = float(kind.removeprefix("brightness x"))
        altered, quality_ = ImageEnhance.Brightness(image).enhance(factor), 90
    return Image.open(io.BytesIO(quality._encode(altered, quality=quality_))).convert("RGB")


def product_copies(count: int, generator=None, seed: int = 5) -> dict:
    """{kind: the share of `count` product-style images whose altered copy is near (`signature.near` at the
    default distance)}: what the products' false groups must not cost in recall."""
    rng = random.Random(seed)
    photos = [Image.open(path).convert("RGB") for _, path in sorted(quality.photo_paths().items())]
    make = generator or product_image
    found = dict.fromkeys(PRODUCT_COPY_KINDS, 0)
    for _ in range(count):
        original = make(rng, photos, rng.randrange(len(photos)))
        original = Image.open(io.BytesIO(quality._encode(original, quality=90))).convert("RGB")
        signed = signature.source_signature(original)
        for kind in PRODUCT_COPY_KINDS:
            copy = signature.source_signature(_product_copy(kind, original))
            found[kind] += signature.near(signed, copy, signature.DEFAULT_MAX_DISTANCE) is not None
    return {kind: hits / count for kind, hits in found.items()}


def same_picture(a, b) -> bool:
    """Two products show the same picture when their pieces come from one photo and overlap by more than a
    third of the smaller one (the generator draws pieces at random: some repeat a region)."""
    (source_a, box_a), (source_b, box_b) = a, b
    if source_a != source_b:
        return False
    width = min(box_a[2], box_b[2]) - max(box_a[0], box_b[0])
    height = min(box_a[3], box_b[3]) - max(box_a[1], box_b[1])
    if width <= 0 or height <= 0:
        return False
    smaller = min((box[2] - box[0]) * (box[3] - box[1]) for box in (box_a, box_b))
    return width * height > smaller / 3


def band_values(signatures, positions, mirrored=False) -> np.ndarray:
    take = signature.mirrored_grey_hash if mirrored else signature.grey_hash
    return np.array([band_value(take(value), positions) for value in signatures], dtype=np.int64)


def shares(values: np.ndarray) -> np.ndarray:
    """Per image: the share of the other images whose value equals its own."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    return (counts[inverse] - 1) / max(1, len(values) - 1)


def collision_rate(values: np.ndarray, sources) -> tuple[float, float]:
    """(the share of all pairs with equal values, the share among pairs from different source photos: two
    crops of one photo's region are more alike than two photos, and there are only 21 photos)."""
    _, counts = np.unique(values, return_counts=True)
    pairs = len(values) * (len(values) - 1) / 2
    every = float((counts * (counts - 1) / 2).sum() / pairs)
    sources = np.asarray(sources)
    _, per_source = np.unique(sources, return_counts=True)
    same_source_pairs = (per_source * (per_source - 1) / 2).sum()
    equal_same_source = 0
    for source in np.unique(sources):
        _, c = np.unique(values[sources == source], return_counts=True)
        equal_same_source += (c * (c - 1) / 2).sum()
    across = ((counts * (counts - 1) / 2).sum() - equal_same_source) / (pairs - same_source_pairs)
    return every, float(across)


def _hot(population, others, scheme: str, scale: int) -> dict:
    """{(band, mirrored): bool per image of population + others}: whether its bucket is hot at `scale`.

    q is the share of the population with the image's band value (itself left out for a population image).
    """
    hot = {}
    for band, positions in enumerate(SCHEMES[scheme]):
        for mirrored in (False, True):
            values = band_values(population, positions, mirrored)
            lookup = dict(zip(*np.unique(values, return_counts=True), strict=True))
            own = np.array([lookup[value] - 1 for value in values.tolist()], dtype=np.float64)
            other = band_values(others, positions, mirrored)
            more = np.array([lookup.get(value, 0) for value in other.tolist()], dtype=np.float64)
            q = np.concatenate([own, more]) / max(1, len(population) - 1)
            hot[band, mirrored] = 1 + (scale - 1) * q > DEFAULT_MAX_BUCKET_SIZE
    return hot


def _left_out(hot: dict, scheme: str) -> np.ndarray:
    if scheme == "contiguous":  # the old grouping: hash buckets only, any hot bucket leaves the image out
        return np.any([hot[band, False] for band in range(BANDS)], axis=0)
    return np.all(list(hot.values()), axis=0)  # the new one: out only when every bucket is hot


def emulate(population, scheme: str, scale: int) -> float:
    """The share of the population left out of grouping at `scale` images."""
    return float(_left_out(_hot(population, [], scheme, scale), scheme).mean())


def emulated_recall(pairs, population, scheme: str, scale: int) -> float:
    """Planted pairs found at `scale`: near, and sharing a bucket that is not hot (old rule: neither image
    left out). A pair's images are placed in buckets as big as the population's share makes them."""
    members = [value for pair in pairs for value in pair]
    hot = _hot(population, members, scheme, scale) if population else None
    offset = len(population)
    left_out = _left_out(hot, scheme) if hot else None
    found = 0
    for index, (a, b) in enumerate(pairs):
        ia, ib = offset + 2 * index, offset + 2 * index + 1
        if signature.near(a, b, signature.DEFAULT_MAX_DISTANCE) is None:
            continue
        if hot and scheme == "contiguous" and (left_out[ia] or left_out[ib]):
            continue
        grey_a, grey_b = signature.grey_hash(a), signature.grey_hash(b)
        mirror_b = signature.mirrored_grey_hash(b)
        for band, positions in enumerate(SCHEMES[scheme]):
            straight = band_value(grey_a, positions) == band_value(grey_b, positions)
            mirrored = scheme == "interleaved" and band_value(grey_a, positions) == band_value(
                mirror_b, positions
            )
            if (straight or mirrored) and (not hot or not hot[band, False][ia]):
                found += 1
                break
    return found / len(pairs)


def planted_pairs(tiny: bool = False):
    """(original, copy) signature pairs of near_duplicate_quality's held-out half, every kind."""
    photos, scales, tuning = (
        (quality.TINY_PHOTOS, quality.TINY_SCALES, quality.TINY_TUNING_PHOTOS)
        if tiny
        else (None, quality.SCALES, quality.TUNING_PHOTOS)
    )
    files, _, _, _ = quality.build_corpus(quality.photo_paths(photos), scales, quality.Signer())
    held_out = [f for f in files if f.photo not in tuning]
    originals = {f.tile: f.signature for f in held_out if f.kind == quality.ORIGINAL}
    return [(originals[f.tile], f.signature) for f in held_out if f.kind in quality.ALL_KINDS]


def product_groups(signatures, pieces, sizes, workdir: str) -> dict:
    """{size: counts}: the real FindNearDuplicateGroups (DirectRunner) over the first `size` product-style
    images. A group is false when two of its members are not the same picture (same_picture): none should
    grow with the corpus."""
    result = {}
    for size in sizes:
        files = [
            quality.SignedFile(f"product/{index}", "products", quality.ORIGINAL, value, f"{index:064x}")
            for index, value in enumerate(signatures[:size])
        ]
        groups, stats = quality.group_with_beam(files, signature.DEFAULT_MAX_DISTANCE, workdir)
        false = [
            group
            for group in groups
            if any(not same_picture(pieces[a], pieces[b]) for a, b in itertools.combinations(group, 2))
        ]
        result[size] = {
            "groups": len(groups),
            "images_in_groups": sum(len(group) for group in groups),
            "false_groups": len(false),
            "images_in_false_groups": sum(len(group) for group in false),
            "largest_false_group": max((len(group) for group in false), default=0),
            "hot_buckets": stats.get("hot_buckets", 0),
        }
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.near_duplicate_bands", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--images", type=int, default=20_000, help="distinct images per corpus (default 20000)"
    )
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument(
        "--tiny", action="store_true", help="the planted pairs of 2 photos at one scale (smoke test)"
    )
    parser.add_argument(
        "--product-copies",
        type=int,
        default=300,
        help="product-style images per generator whose altered copies are checked (default 300; 0: none)",
    )
    parser.add_argument(
        "--copies-only",
        action="store_true",
        help="only the product copies' recall (seconds; no bands, no scale, no Beam run)",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    copies = {}
    if args.product_copies:
        copies = {
            "products": product_copies(args.product_copies),
            "second": product_copies(args.product_copies, second_product_image),
        }
        print(
            f"copies of {args.product_copies} product-style images per generator, found by `near` at the default"
        )
        print(f"{'generator':<10} " + " ".join(f"{kind:>16}" for kind in PRODUCT_COPY_KINDS))
        for name, found in copies.items():
            print(f"{name:<10} " + " ".join(f"{found[kind]:>16.3f}" for kind in PRODUCT_COPY_KINDS))
    if args.copies_only:
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"product_copies": copies}, handle, indent=1)
        return {"product_copies": copies}
    pieces, second_pieces = [], []
    made = {
        "photos": photo_crops(args.images),
        "products": products(args.images, pieces=pieces),
        # The second generator (second_product_image, its own seed).
        "second": products(args.images, seed=11, pieces=second_pieces, generator=second_product_image),
    }
    corpora = {name: signed for name, (signed, _) in made.items()}
    print(f"signed {3 * args.images:,} distinct images in {time.perf_counter() - start:.0f} s")
    report = {"images": args.images, "collisions": {}, "emulated": {}, "product_copies": copies}
    print(
        "\ncollision rate per band of the grey hash, as a multiple of uniform (1 / 65,536): all pairs / pairs "
        "from different source photos"
    )
    print(f"{'corpus':<10} {'scheme':<12} " + " ".join(f"{'band ' + str(b):>13}" for b in range(BANDS)))
    for name, (signed, sources) in made.items():
        for scheme, masks in SCHEMES.items():
            rates = [collision_rate(band_values(signed, positions), sources) for positions in masks]
            report["collisions"][f"{name}/{scheme}"] = [
                [every / UNIFORM, across / UNIFORM] for every, across in rates
            ]
            print(
                f"{name:<10} {scheme:<12} "
                + " ".join(f"{every / UNIFORM:>6.1f} / {across / UNIFORM:<4.1f}" for every, across in rates)
            )
    pairs = planted_pairs(args.tiny)
    population = corpora["photos"] + corpora["products"]
    second = corpora.pop("second")
    print(
        f"\nemulated scale: {len(population):,} distinct images as the population, {len(pairs):,} planted pairs"
    )
    print(f"{'scheme':<12} {'images':>11} {'left out':>9} {'recall':>7}")
    base = emulated_recall(pairs, [], "interleaved", 0)
    print(f"{'(no scale)':<12} {'':>11} {'':>9} {base:>7.3f}")
    report["recall_small"] = base
    for scheme in SCHEMES:
        for scale in SCALES:
            left_out = emulate(population, scheme, scale)
            recall = emulated_recall(pairs, population, scheme, scale)
            report["emulated"][f"{scheme}/{scale}"] = {"left_out": left_out, "recall": recall}
            print(f"{scheme:<12} {scale:>11,} {left_out:>9.4f} {recall:>7.3f}")
    sizes = (args.images // 4, args.images)
    report["product_groups"], report["second_product_groups"] = {}, {}
    with tempfile.TemporaryDirectory(prefix="near-duplicate-bands-") as workdir:
        report["product_groups"] = product_groups(corpora["products"], pieces, sizes, workdir)
        report["second_product_groups"] = product_groups(second, second_pieces, sizes, workdir)
    print(
        "\nproduct-style images through FindNearDuplicateGroups: groups, and false ones (two members that are"
    )
    print("not the same picture: pieces of different photos, or of one photo that do not overlap)")
    print(
        f"{'generator':<10} {'images':>8} {'groups':>7} {'in groups':>10} {'false':>6} {'in false':>9} "
        f"{'largest false':>14}"
    )
    for name, key in (("products", "product_groups"), ("second", "second_product_groups")):
        for size, found in report[key].items():
            print(
                f"{name:<10} {size:>8,} {found['groups']:>7} {found['images_in_groups']:>10} "
                f"{found['false_groups']:>6} {found['images_in_false_groups']:>9} {found['largest_false_group']:>14}"
            )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    sys.stdout.flush()
    return report


if __name__ == "__main__":
    main()
