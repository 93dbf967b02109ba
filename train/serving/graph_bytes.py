"""Reading integers out of, and splicing bytes into, a scalar string tensor, in-graph.

The serving signature parses image headers with TensorFlow ops only (no
Python at serving time), from bytes a stranger sent. Every read here is
bounds-safe: a position outside the data reads as zeros, never raises, so a
header that lies about its own lengths cannot fail the batch it came in.
"""

import tensorflow as tf

# Every byte value as a one-byte string, so computed bytes can be spliced into a string tensor.
_ALL_BYTES = bytes(range(256))


def length(data):
    """The length of `data` in bytes, int64."""
    return tf.cast(tf.strings.length(data), tf.int64)


def read_bytes(data, position, count: int):
    """`count` bytes of `data` from `position` as int64 [count]; zeros where out of range."""
    size = length(data)
    position = tf.cast(position, tf.int64)
    position = tf.where((position >= 0) & (position <= size), position, size)
    raw = tf.io.decode_raw(tf.strings.substr(data, position, tf.constant(count, tf.int64)), tf.uint8)
    raw = tf.pad(raw, [[0, count - tf.shape(raw)[0]]])
    return tf.cast(tf.reshape(raw, [count]), tf.int64)


def read_byte(data, position):
    """One byte of `data` as an int64 scalar; 0 when out of range."""
    return read_bytes(data, position, 1)[0]


def big_endian(byte_values):
    """The unsigned integer of a [k] int64 tensor of bytes, most significant first."""
    weights = tf.constant([256**i for i in reversed(range(byte_values.shape[0]))], tf.int64)
    return tf.reduce_sum(byte_values * weights)


def little_endian(byte_values):
    """The unsigned integer of a [k] int64 tensor of bytes, least significant first."""
    weights = tf.constant([256**i for i in range(byte_values.shape[0])], tf.int64)
    return tf.reduce_sum(byte_values * weights)


def signed_32(value):
    """An unsigned 32-bit value read as two's complement."""
    return tf.where(value >= 2**31, value - 2**32, value)


def matches(byte_values, expected: bytes):
    """Whether the [k] int64 bytes equal `expected` (k == len(expected))."""
    return tf.reduce_all(tf.equal(byte_values, tf.constant(list(expected), tf.int64)))


def substring(data, start, end):
    """data[start:end], with start and end clamped into the data (never an error)."""
    size = length(data)
    start = tf.clip_by_value(tf.cast(start, tf.int64), 0, size)
    end = tf.clip_by_value(tf.cast(end, tf.int64), start, size)
    return tf.strings.substr(data, start, end - start)


def replace_bytes(data, position, replacement):
    """`data` with the bytes at `position` overwritten by `replacement` (same length, in range)."""
    end = tf.cast(position, tf.int64) + length(replacement)
    return tf.strings.join([substring(data, 0, position), replacement, substring(data, end, length(data))])


def byte_string(value):
    """The one-byte string of an integer tensor 0-255."""
    return tf.strings.substr(_ALL_BYTES, tf.clip_by_value(tf.cast(value, tf.int64), 0, 255), 1)


def little_endian_string(value, count: int):
    """`value` as `count` little-endian bytes, a string tensor."""
    value = tf.cast(value, tf.int64)
    return tf.strings.join([byte_string(tf.bitwise.right_shift(value, 8 * i) % 256) for i in range(count)])


_HEX_DIGITS = tuple(f"{value:02x}" for value in range(256))


def hex_prefix(data, count: int):
    """The first `count` bytes of `data` in hex (for error messages)."""
    shown = tf.minimum(length(data), count)
    digits = tf.gather(tf.constant(_HEX_DIGITS), read_bytes(data, 0, count))[:shown]
    return tf.strings.reduce_join(digits)
