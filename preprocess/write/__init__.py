"""Writing the run's files: records encoded per encoding, shards sized by bytes, tf.Transform's output.

Design notes: docs/internals.md."""

from preprocess import lazy_entry

__all__, __getattr__ = lazy_entry(
    __name__,
    {
        "encode": ("encode_in_one_pass", "encode_after_transform"),
        "shards": ("WriteShards", "WriteErrorLog", "write_logs", "NEAR_DUPLICATES"),
        "transform_output": ("WriteTransformOutput", "read_label_vocabulary", "read_normalization"),
    },
)
