"""EXIF orientation, in-graph: read the tag from a TIFF block, turn an image upright.

Stage 1 (PIL's exif_transpose) reads the orientation from the EXIF block
only; so does this. Where the TIFF block sits in each format is found by the
header walk (train/serving/image_header.py). Missing or garbage metadata means
upright, never an error.
"""

import tensorflow as tf

from train.serving import graph_bytes

_EXIF_ORIENTATION_TAG = 0x0112
_MAX_IFD_ENTRIES = 64


def exif_orientation(data, tiff_offset):
    """The orientation tag (1-8) of IFD0 of the TIFF block at tiff_offset; 1 if absent or invalid."""
    head = graph_bytes.read_bytes(data, tiff_offset, 8)
    little = graph_bytes.matches(head[:2], b"II")
    big = graph_bytes.matches(head[:2], b"MM")
    magic_ok = (graph_bytes.matches(head[2:4], b"*\x00") | graph_bytes.matches(head[2:4], b"\x00*")) & (
        little | big
    )

    def to_int(byte_values):
        return tf.where(little, graph_bytes.little_endian(byte_values), graph_bytes.big_endian(byte_values))

    ifd = tiff_offset + to_int(head[4:8])
    entry_count = to_int(graph_bytes.read_bytes(data, ifd, 2))
    entries = tf.reshape(graph_bytes.read_bytes(data, ifd + 2, 12 * _MAX_IFD_ENTRIES), [_MAX_IFD_ENTRIES, 12])
    tags = _to_int_rows(entries[:, 0:2], little)
    types = _to_int_rows(entries[:, 2:4], little)
    counts = _to_int_rows(entries[:, 4:8], little)
    # The value sits in the entry itself when it fits in 4 bytes; its width depends on the type.
    values = tf.where(
        types == 1,
        entries[:, 8],
        tf.where(types == 3, _to_int_rows(entries[:, 8:10], little), _to_int_rows(entries[:, 8:12], little)),
    )
    entry_indices = tf.range(_MAX_IFD_ENTRIES, dtype=tf.int64)
    is_orientation = (
        (entry_indices < entry_count)
        & (tags == _EXIF_ORIENTATION_TAG)
        & ((types == 1) | (types == 3) | (types == 4))
        & (counts == 1)
    )
    # PIL keeps the last of repeated tags.
    last = tf.reduce_max(tf.where(is_orientation, entry_indices, tf.constant(-1, tf.int64)))
    value = tf.gather(values, tf.maximum(last, 0))
    valid = (tiff_offset >= 0) & magic_ok & (last >= 0) & (value >= 1) & (value <= 8)
    return tf.where(valid, value, tf.constant(1, tf.int64))


def swaps_axes(orientation):
    """Orientations 5-8 transpose the image."""
    return orientation >= 5


def flips_left_right(orientation):
    """Whether the upright image is mirrored left-right after the transpose (2, 3, 6, 7)."""
    return tf.reduce_any(orientation == tf.constant([2, 3, 6, 7], tf.int64))


def flips_top_bottom(orientation):
    """Whether the upright image is mirrored top-bottom after the transpose (3, 4, 7, 8)."""
    return tf.reduce_any(orientation == tf.constant([3, 4, 7, 8], tf.int64))


def apply_orientation(image, orientation):
    """Turn a stored image upright, as PIL's exif_transpose does for orientations 1-8."""
    image = tf.cond(swaps_axes(orientation), lambda: tf.transpose(image, [1, 0, 2]), lambda: image)
    image = tf.cond(flips_left_right(orientation), lambda: tf.reverse(image, [1]), lambda: image)
    return tf.cond(flips_top_bottom(orientation), lambda: tf.reverse(image, [0]), lambda: image)


def _to_int_rows(byte_rows, little):
    """Unsigned integers from rows of bytes, in the TIFF block's byte order."""
    width = byte_rows.shape[1]
    little_values = tf.reduce_sum(byte_rows * tf.constant([256**i for i in range(width)], tf.int64), axis=1)
    big_values = tf.reduce_sum(
        byte_rows * tf.constant([256**i for i in reversed(range(width))], tf.int64), axis=1
    )
    return tf.where(little, little_values, big_values)
