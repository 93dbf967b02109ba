"""Writing the run's files: records encoded per encoding, shards sized by bytes, tf.Transform's output.

Design notes: docs/internals.md."""
