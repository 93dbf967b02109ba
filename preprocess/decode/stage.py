"""The per-image step of the job: read, decode, orient, to RGB, resize; an error record with a reason for
an image that cannot be used. Design notes: docs/internals.md."""

import hashlib

import apache_beam as beam
from apache_beam.metrics import Metrics

from preprocess import errors
from preprocess.decode.failure_budget import FailureBudget, known_outcomes
from preprocess.decode.image import load_image_and_source_size, load_image_with_source
from preprocess.inputs.content import UniqueInput
from preprocess.inputs.reading import read_file_bytes
from preprocess.launch.progress import ProgressCounter
from preprocess.publish.superseded import StopIfSupersededFn
from preprocess.reuse.ledger import input_facts
from preprocess.transform import image_moments


class DecodeImagesFn(beam.DoFn):
    """UniqueInput -> raw example dict, or an ErrorRecord on the 'errors' output."""

    def __init__(
        self,
        image_size: int,
        resize_method: str,
        max_pixels: int,
        max_file_bytes: int | None = None,
        max_failed_fraction: float | None = None,
        signatures: bool = False,
    ):
        self._signatures = signatures
        self._image_size = image_size
        self._resize_method = resize_method
        self._max_pixels = max_pixels
        # Files over it were refused before (content.py) by their size; a file that grew since is cut
        # off at the limit, not read whole.
        self._max_file_bytes = max_file_bytes
        self._decoded = Metrics.counter("preprocess", "decoded")
        self._failed = {}
        self._progress = ProgressCounter("decoded")
        self._progress_failed = ProgressCounter("failed")
        # Fails the job early when --max-failed-fraction is sure to be crossed (failure_budget.py);
        # it needs the known outcomes as the side input `known`.
        self._budget = FailureBudget(max_failed_fraction)

    def start_bundle(self):
        self._budget.start_bundle()

    def finish_bundle(self):
        self._budget.finish_bundle()

    def _count_failure(self, reason: str):
        if reason not in self._failed:
            self._failed[reason] = Metrics.counter("preprocess", f"failed_{reason}")
        self._failed[reason].inc()
        self._progress_failed.inc()

    def _load(self, data: bytes | bytearray):
        """(resized pixels, source (width, height), the perceptual signature of the source or None)."""
        try:
            if not self._signatures:
                pixels, size = load_image_and_source_size(
                    data, size=self._image_size, method=self._resize_method, max_pixels=self._max_pixels
                )
                return pixels, size, None
            from preprocess.near_duplicates.signature import source_signature  # noqa: PLC0415 - only when on

            pixels, size, source = load_image_with_source(
                data, size=self._image_size, method=self._resize_method, max_pixels=self._max_pixels
            )
            return pixels, size, source_signature(source, size)
        except (errors.ImageError, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001 - the bytes are in memory: a decoder that fails on them always will
            raise errors.ImageError(errors.DECODE_ERROR, f"{type(exc).__name__}: {exc}") from exc

    def process(self, item: UniqueInput, known: dict | None = None):
        # Reading raises what a retry might not meet again (reading.py); decoding bytes already in
        # memory fails the same way every time, whatever it raises (a truncated image is an OSError).
        try:
            data = read_file_bytes(item.uri, self._max_file_bytes, getattr(item, "size", None))
            pixels, (width, height), signature = self._load(data)
        except errors.ImageError as exc:
            self._count_failure(exc.reason)
            self._budget.record(exc.reason, known)
            # With its input: a re-run carries a failure of the bytes over (preprocess/reuse/ledger.py).
            error = errors.ErrorRecord(item.uri, exc.reason, exc.detail, input=item)
            yield beam.pvalue.TaggedOutput("errors", error)
            return
        self._budget.record(None, known)
        self._decoded.inc()
        self._progress.inc()
        image_raw = pixels.tobytes()
        example = {
            "image_raw": image_raw,
            # What the version's ledger keeps of it (preprocess/reuse/): its content key and its moments.
            "key": getattr(item, "key", None) or "",
            "moments": image_moments(image_raw),
            "label": item.label,
            "sha256": hashlib.sha256(data).hexdigest(),
            "uri": item.uri,
            "split": item.split,
            "source_width": width,
            "source_height": height,
            # Its file's size and mtime, its source size: what the ledger keeps beside the key (reuse/ledger.py).
            "input": input_facts(item, (width, height)),
        }
        if self._signatures:
            example["signature"] = signature
            example["num_bytes"] = len(data)
            example["split_given"] = bool(getattr(item, "split_given", False))
        yield example


def decode_images(
    to_decode, listed, sampled, errors_before_decoding: list, run_id, output_dir: str, args, signatures
):
    """The decode step of the graph: `to_decode` (UniqueInputs) -> DecodeImagesFn's outputs, "examples" and
    "errors". `listed` (ListedInputs), `sampled` (the inputs to decode, in an incremental run not those
    carried over) and `errors_before_decoding` are what is settled before decoding: the decoding fails the
    job early once --max-failed-fraction is sure to be crossed (failure_budget.py). `signatures`: with the
    near-duplicate audit."""
    known = known_outcomes(
        listed.records,
        listed.errors,
        sampled,
        errors_before_decoding | "ErrorsBeforeDecoding" >> beam.Flatten(),
    )
    return (
        to_decode
        | "SpreadDecoding" >> beam.Reshuffle()
        # A run that a newer one superseded stops here rather than decode for hours (superseded.py).
        | "StopIfSuperseded" >> beam.ParDo(StopIfSupersededFn(output_dir), beam.pvalue.AsSingleton(run_id))
        | "Decode"
        >> beam.ParDo(
            DecodeImagesFn(
                args.stored_size,
                args.resize_method,
                args.max_pixels,
                args.max_file_bytes,
                args.max_failed_fraction,
                signatures=signatures,
            ),
            known=beam.pvalue.AsSingleton(known),
        ).with_outputs("errors", main="examples")
    )
