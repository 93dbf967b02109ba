"""The label vocabulary analyzer: the train split's distinct class names, sorted, as a vocabulary file."""

import uuid

import apache_beam as beam
import numpy as np
import tensorflow_transform.beam as tft_beam
from apache_beam.io.filesystems import FileSystems

from dataset_contract import manifest as manifest_lib
from preprocess import errors


class SortedLabelVocabulary(tft_beam.experimental.PTransformAnalyzer):
    """Analyzer: the distinct labels of the analyzed data, sorted, as a vocabulary file named `file_name`."""

    def __init__(self, file_name: str):
        super().__init__()
        self.file_name = file_name

    def expand(self, batches):
        return (
            batches
            | "Labels" >> beam.FlatMap(lambda batch: {value for value in np.asarray(batch[0]).reshape(-1)})
            | "Distinct" >> beam.Distinct()
            | "ToList" >> beam.combiners.ToList()
            | "Write" >> beam.Map(self._write_vocabulary)
        )

    def _write_vocabulary(self, labels):
        if not labels:
            # tf.Transform would go on to fail on the empty vocabulary file with an OutOfRangeError
            # deep in its graph; the launcher names this error and tells the failures by reason.
            raise errors.EmptyTrainSplitError(
                "no image reached the train split: tf.Transform has nothing to analyze"
            )
        directory = manifest_lib.join(self.base_temp_dir, uuid.uuid4().hex)
        path = manifest_lib.join(directory, self.file_name)
        names = sorted(label.decode("utf-8") if isinstance(label, bytes) else str(label) for label in labels)
        with FileSystems.create(path) as handle:
            handle.write("".join(f"{name}\n" for name in names).encode("utf-8"))
        return path.encode("utf-8")
