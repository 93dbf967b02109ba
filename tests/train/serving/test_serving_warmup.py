"""The warmup records, written without tensorflow-serving-api, are what its protos serialize.

train/serving/warmup.py writes PredictionLog records as wire format by hand
(tensorflow-serving-api would pull generic TensorFlow over tensorflow-tpu).
These tests hold the bytes to the real protos, which the development
environment has.
"""

import pytest
import tensorflow as tf

# Not skipped when missing: requirements.txt keeps tensorflow-serving-api in the test environment for this.
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from train.serving import warmup


def real_prediction_log(signature_name, inputs):
    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = signature_name
    for name, tensor in inputs.items():
        request.inputs[name].CopyFrom(tensor)
    return prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))


@pytest.mark.parametrize("batch_index", range(4))
def test_each_warmup_record_is_byte_identical_to_the_real_protos(batch_index):
    # The batches run from one small PNG to eight JPEGs (multi-byte lengths at every level).
    batch = warmup.warmup_batches()[batch_index]
    inputs = {"image_bytes": tf.make_tensor_proto(batch, dtype=tf.string)}
    ours = warmup.prediction_log_bytes("serving_default", inputs)
    assert ours == real_prediction_log("serving_default", inputs).SerializeToString()


def test_several_inputs_parse_back_to_the_same_request():
    inputs = {
        "a": tf.make_tensor_proto([b"x" * 300], dtype=tf.string),
        "b": tf.make_tensor_proto([[1.0, 2.0]], dtype=tf.float32),
    }
    parsed = prediction_log_pb2.PredictionLog.FromString(warmup.prediction_log_bytes("sig", inputs))
    assert parsed == real_prediction_log("sig", inputs)
    assert parsed.WhichOneof("log_type") == "predict_log"


def test_the_written_file_is_read_back_by_the_real_protos(tmp_path):
    path = str(tmp_path / warmup.WARMUP_FILE)
    warmup.write_warmup_requests(path, "serving_default", "image_bytes")
    requests = warmup.read_warmup_requests(path)
    assert [list(tf.make_ndarray(r.inputs["image_bytes"])) for r in requests] == warmup.warmup_batches()
    assert {r.model_spec.signature_name for r in requests} == {"serving_default"}
