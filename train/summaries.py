"""TensorBoard curves without the `tensorboard` package.

keras.callbacks.TensorBoard calls tf.summary.scalar, which lives in the
`tensorboard` pip package; TensorFlow 2.21 no longer installs it, and a TPU
VM or a training container should not need it just to write logs. The
low-level `tf.summary.write` is part of TensorFlow: given the scalars
plugin's metadata it writes the same event files, which any TensorBoard
(`tensorboard --logdir MODEL_DIR/logs`, Vertex AI TensorBoard) displays.
The layout follows Keras's: `logs/train` and `logs/validation`, tags
`epoch_<metric>`, step = epoch number.
"""

import keras
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from dataset_contract import manifest as manifest_lib

_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
).SerializeToString()


class EpochSummaries(keras.callbacks.Callback):
    """Write every epoch's train and validation metrics (and the learning rate) as TensorBoard scalars."""

    def __init__(self, log_dir: str):
        super().__init__()
        self._writers = {
            "train": tf.summary.create_file_writer(manifest_lib.join(log_dir, "train")),
            "validation": tf.summary.create_file_writer(manifest_lib.join(log_dir, "validation")),
        }

    def _write(self, writer_name: str, values: dict, step: int) -> None:
        with self._writers[writer_name].as_default():
            for name, value in values.items():
                tf.summary.write(
                    f"epoch_{name}",
                    tf.constant(float(value), tf.float32),
                    step=step,
                    metadata=_SCALAR_METADATA,
                )
            self._writers[writer_name].flush()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        train = {name: value for name, value in logs.items() if not name.startswith("val_")}
        validation = {name[len("val_") :]: value for name, value in logs.items() if name.startswith("val_")}
        optimizer = self.model.optimizer
        train["learning_rate"] = optimizer.learning_rate  # the schedule's value at the current step
        self._write("train", train, epoch + 1)
        if validation:
            self._write("validation", validation, epoch + 1)

    def on_train_end(self, logs=None):
        for writer in self._writers.values():
            writer.close()
