"""TF Serving's warmup file: a few real requests it replays when it loads the model.

TF Serving reads `assets.extra/tf_serving_warmup_requests`, a TFRecord file
of `PredictionLog` protos, and runs each request before it marks the model
available, so the first clients do not pay for lazy initialization (graph
optimization, kernel and thread-pool setup, tf.data function instantiation).
The requests here go through every path the signature has: a JPEG (DCT
scaling and crop), a PNG, a batch of both with a file that is not an image
(the per-image error path), and a batch of eight (a typical server batch).
The images are made with TensorFlow's own encoders (a gradient with a block),
so the file is the same wherever it is written.

The records are written as protobuf wire format by hand (`prediction_log_bytes`)
rather than with tensorflow-serving-api's classes: that package requires generic
`tensorflow`, which would replace tensorflow-tpu on a TPU VM (train/install_lines.py).
Only the tensor inside is a real proto (TensorFlow's own TensorProto); the four
envelopes around it are a field number and a length each. tests/train/
test_serving_warmup.py holds the bytes equal to what the real protos serialize.
"""

import tensorflow as tf

WARMUP_FILE = "tf_serving_warmup_requests"

# Field numbers in tensorflow_serving/apis/{prediction_log,predict,model}.proto.
_PREDICTION_LOG_PREDICT_LOG = 6  # PredictionLog.predict_log (PredictLog)
_PREDICT_LOG_REQUEST = 1  # PredictLog.request (PredictRequest)
_PREDICT_REQUEST_MODEL_SPEC = 1  # PredictRequest.model_spec (ModelSpec)
_PREDICT_REQUEST_INPUTS = 2  # PredictRequest.inputs (map<string, TensorProto>)
_MODEL_SPEC_SIGNATURE_NAME = 3  # ModelSpec.signature_name (string)
_MAP_KEY, _MAP_VALUE = 1, 2  # a map entry is a message {key = 1; value = 2}
_LENGTH_DELIMITED = 2  # the wire type of strings, bytes and embedded messages


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited field: key (number, wire type 2), length, payload."""
    return _varint(number << 3 | _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def prediction_log_bytes(signature_name: str, inputs: dict) -> bytes:
    """A serialized PredictionLog holding one PredictRequest for `signature_name`.

    `inputs` maps input names to TensorProtos (tf.make_tensor_proto). Fields are
    written in field-number order and map entries in the order given, as
    protobuf's own serializer writes them.
    """
    model_spec = _field(_MODEL_SPEC_SIGNATURE_NAME, signature_name.encode())
    request = _field(_PREDICT_REQUEST_MODEL_SPEC, model_spec)
    for name, tensor in inputs.items():
        entry = _field(_MAP_KEY, name.encode()) + _field(_MAP_VALUE, tensor.SerializeToString())
        request += _field(_PREDICT_REQUEST_INPUTS, entry)
    return _field(_PREDICTION_LOG_PREDICT_LOG, _field(_PREDICT_LOG_REQUEST, request))


def warmup_batches() -> list[list[bytes]]:
    """The batches of encoded images the warmup requests carry."""
    rows, columns = tf.meshgrid(tf.range(480), tf.range(640), indexing="ij")
    image = tf.stack([columns * 255 // 640, rows * 255 // 480, (rows + columns) * 255 // 1120], axis=-1)
    image = tf.tensor_scatter_nd_update(
        tf.cast(image, tf.uint8),
        tf.reshape(tf.stack(tf.meshgrid(tf.range(60, 180), tf.range(80, 240), indexing="ij"), -1), [-1, 2]),
        tf.fill([120 * 160, 3], tf.constant(200, tf.uint8)),
    )
    jpeg = tf.io.encode_jpeg(image, quality=90).numpy()
    png = tf.io.encode_png(image[:240, :320]).numpy()
    return [[jpeg], [png], [jpeg, png, b"not an image"], [jpeg] * 8]


def write_warmup_requests(path: str, signature_name: str, input_key: str) -> None:
    """Write the warmup requests for `signature_name` (input `input_key`) to `path`."""
    with tf.io.TFRecordWriter(path) as writer:
        for batch in warmup_batches():
            tensor = tf.make_tensor_proto(batch, dtype=tf.string)
            writer.write(prediction_log_bytes(signature_name, {input_key: tensor}))


def read_warmup_requests(path: str) -> list:
    """The requests of a warmup file (PredictRequest protos), as TF Serving parses them.

    Needs tensorflow-serving-api (the development environment has it; a
    training install does not, and does not need to read the file back).
    """
    from tensorflow_serving.apis import prediction_log_pb2

    requests = []
    for record in tf.data.TFRecordDataset(path):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        requests.append(log.predict_log.request)
    return requests
