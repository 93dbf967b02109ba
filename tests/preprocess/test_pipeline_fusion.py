"""No decoded image crosses a stage boundary of the local runner, which holds such a PCollection in memory.

The stages are those of the real pipeline, fused as the local runner (the
FnApiRunner) fuses them. A decoded example carries its pixels (150 KB at
224 px): had one PCollection of them crossed a boundary, the runner's process
would have held every image of the corpus (issue 30: 9.7 GB of peak RSS at
7,500 photos, growing with the corpus; benchmarks/RESULTS.md).
"""

import pytest
from apache_beam.runners.worker import bundle_processor

from benchmarks.worker_memory import fused_stages

# The steps whose outputs are decoded examples with their pixels: the decoding, and with the
# near-duplicate audit the reading back of its spill.
_DECODED_EXAMPLES = ("Decode/ParDo(DecodeImagesFn)", "NearDuplicates/Route")


@pytest.mark.slow  # builds and fuses the whole pipeline three times (about 20 s each on a loaded 2-core machine)
@pytest.mark.parametrize(
    "encoding,near_duplicates", [("uint8", "keep"), ("uint8", "off"), ("bfloat16", "drop")]
)
def test_decoded_examples_stay_in_the_stage_that_makes_them(encoding, near_duplicates):
    """Unlike test_pipeline_e2e's test_no_decoded_image_crosses_a_stage_boundary, which holds the steps that
    take the pixels to disk in the decoding stage, this also holds that no other consumer takes them out."""
    components, stages = fused_stages(encoding, ["--near-duplicates", near_duplicates])
    decoded = {
        pcollection
        for transform in components.transforms.values()
        if transform.unique_name in _DECODED_EXAMPLES
        for tag, pcollection in transform.outputs.items()
        if tag != "errors"
    }
    assert decoded, "the pipeline's decoding step was renamed: update _DECODED_EXAMPLES"
    crossing = [
        components.pcollections[pcollection].unique_name
        for stage in stages
        for transform in stage.transforms
        if transform.spec.urn == bundle_processor.DATA_OUTPUT_URN
        for pcollection in transform.inputs.values()
        if pcollection in decoded
    ]
    assert crossing == []
