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
"""

import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

WARMUP_FILE = "tf_serving_warmup_requests"


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
            request = predict_pb2.PredictRequest()
            request.model_spec.signature_name = signature_name
            request.inputs[input_key].CopyFrom(tf.make_tensor_proto(batch, dtype=tf.string))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


def read_warmup_requests(path: str) -> list[predict_pb2.PredictRequest]:
    """The requests of a warmup file, as TF Serving parses them."""
    requests = []
    for record in tf.data.TFRecordDataset(path):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        requests.append(log.predict_log.request)
    return requests
