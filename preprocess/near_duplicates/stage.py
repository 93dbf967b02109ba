"""Stage 1's near-duplicate audit: decoded examples in, the same examples in their final splits out.

The flow (spill, published splits, grouping, routing) and why: docs/internals.md, "preprocess/near_duplicates/".
"""

import apache_beam as beam

from preprocess.near_duplicates import routing, split_counts
from preprocess.near_duplicates.grouping import FindNearDuplicateGroups
from preprocess.near_duplicates.published import WithPublishedSplits


class NearDuplicateAudit(beam.PTransform):
    """Decoded examples (DecodeImagesFn with signatures) -> a dict of PCollections:

    - "examples": the decoded examples, each with its final split (drop mode: one per group)
    - "summary": a singleton {"labels": train's class names, "per_split": {split: images}}
    - "groups": NearDuplicateGroups; "stats": a singleton dict of counts (grouping.py)
    - "dropped": the GroupMembers drop mode left out (none in keep mode)

    `run_id` is the singleton of preprocess.publish.runs.MakeRunId; `published_shards` the previous
    version's (published.published_shards): a group with a published member follows its split.
    `carried_counts`: ((split, label), 1) of each image an incremental run carried over without decoding
    (preprocess/reuse/), counted into the summary; `carried_images`: the same images as SignedImages
    (their ledger's signature, their published split held, no locator), grouped with the decoded ones so
    that a new copy of a published image follows its split (then not in `carried_counts`).
    """

    def __init__(
        self,
        output_dir: str,
        run_id,
        max_distance: int,
        drop: bool,
        max_group_size: int,
        max_moved_share: float,
        published_shards=(),
        carried_counts=None,
        carried_images=None,
    ):
        super().__init__()
        # A list of (split, shard path) to read, or, in an incremental run, a PCollection of (sha256, split).
        self._published_shards = (
            published_shards if isinstance(published_shards, beam.PCollection) else list(published_shards)
        )
        self._carried_counts = carried_counts
        self._carried_images = carried_images
        self._max_group_size = max_group_size
        self._max_moved_share = max_moved_share
        self._output_dir = output_dir
        self._run_id = run_id
        self._max_distance = max_distance
        self._drop = drop

    def expand(self, decoded):
        spilled = decoded | "Spill" >> beam.ParDo(
            routing.SpillDecodedFn(self._output_dir), beam.pvalue.AsSingleton(self._run_id)
        ).with_outputs(routing.PARTS, main="signed")
        signed = spilled.signed | "Published" >> WithPublishedSplits(self._published_shards)
        if self._carried_images is not None:
            signed = (signed, self._carried_images) | "WithCarried" >> beam.Flatten()
        # The split sizes and the vocabulary come from the grouping's counts (the same combine as its stats).
        found = signed | "Group" >> FindNearDuplicateGroups(
            self._max_distance,
            drop=self._drop,
            max_group_size=self._max_group_size,
            max_moved_share=self._max_moved_share,
            more_split_counts=self._carried_counts,
            run_id=self._run_id,
        )
        members = found["members"]
        overrides = members | "Overrides" >> beam.FlatMap(routing.override_of)
        parts = spilled[routing.PARTS] | "KeyParts" >> beam.Map(lambda path: (path, None))
        examples = (
            {routing.PARTS: parts, routing.OVERRIDES: overrides}
            | "OverridesPerPart" >> beam.CoGroupByKey()
            | "Route" >> beam.ParDo(routing.RoutePartFn())
        )
        summary = found["split_counts"] | "Summary" >> beam.Map(
            split_counts.SplitLabelCountsFn().extract_output
        )
        dropped = members | "Dropped" >> beam.Filter(lambda member: not member.kept)
        return {
            "examples": examples,
            "summary": summary,
            "groups": found["groups"],
            "stats": found["stats"],
            "dropped": dropped,
        }
