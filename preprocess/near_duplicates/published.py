"""The splits the previous version of a dataset published its images in, for near-duplicate groups.

`published_shards` is the one place that knows where they come from: docs/internals.md,
"preprocess/near_duplicates/published.py".
"""

import dataclasses
import logging

import apache_beam as beam

from dataset_contract import manifest as manifest_lib


def published_shards(output_dir: str) -> list[tuple[str, str]]:
    """(split, shard path) of every shard the newest published version of `output_dir` lists; [] when none
    was published (a first run) or it cannot be read (then the groups follow the other rules: logged)."""
    from dataset_contract.verification import read_manifest  # noqa: PLC0415 - TensorFlow, only when auditing

    try:
        manifest = read_manifest(output_dir)
    except manifest_lib.ManifestError as exc:
        if "not found" not in str(exc):
            logging.warning("near-duplicates: the previous version's splits are not followed: %s", exc)
        return []
    return [
        (split, manifest_lib.join(output_dir, shard["path"]))
        for split, info in sorted(manifest["splits"].items())
        for shard in info["shards"]
    ]


def shard_keys(element):
    """(split, shard path) -> (sha256, split) of every record of the shard."""
    # TensorFlow, on the workers, only when a previous version exists.
    from dataset_contract.verification import read_identities  # noqa: PLC0415

    split, path = element
    for sha256, _, _ in read_identities(path):
        yield sha256, split


class ReadPublishedSplits(beam.PTransform):
    """PBegin -> (sha256, split) of every image the previous version published (`published_shards`)."""

    def __init__(self, shards: list[tuple[str, str]]):
        super().__init__()
        self._shards = shards

    def expand(self, pbegin):
        return (
            pbegin
            | "Shards" >> beam.Create(self._shards)
            | "Spread" >> beam.Reshuffle()
            | "Keys" >> beam.FlatMap(shard_keys)
        )


def _attach(element):
    """(key, {"images": [...], "published": [split...]}) -> the images, each with its published split."""
    _, grouped = element
    splits = sorted(set(grouped["published"]))
    for image in grouped["images"]:
        # One image published in two splits cannot happen in one version; the smallest is deterministic.
        yield image if not splits else dataclasses.replace(image, published_split=splits[0])


class WithPublishedSplits(beam.PTransform):
    """SignedImages -> the same, each with `published_split` set when the previous version published it."""

    def __init__(self, shards: list[tuple[str, str]]):
        super().__init__()
        self._shards = shards

    def expand(self, images):
        if isinstance(self._shards, beam.PCollection):
            published = self._shards  # an incremental run's, from the ledger (preprocess/reuse/)
        elif not self._shards:
            return images
        else:
            published = images.pipeline | "ReadPublished" >> ReadPublishedSplits(self._shards)
        keyed = images | "ByKey" >> beam.Map(lambda image: (image.key, image))
        return (
            {"images": keyed, "published": published}
            | "Join" >> beam.CoGroupByKey()
            | "Attach" >> beam.FlatMap(_attach)
        )
