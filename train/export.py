"""The serving SavedModel: encoded image bytes in, class probabilities and names out.

    MODEL_DIR/export/      signature `serving_default`:
        image_bytes   tf.string [None]              JPEG/PNG/GIF/BMP/WebP file contents
        -> probabilities  float32 [None, num_classes]
           label          tf.string [None]          the most probable class name

The signature runs the same steps as stage 1 + the evaluation pipeline:
decode by content, turn upright by EXIF orientation, RGB, resize with the
shared geometry (train/serving_image.py) to uint8 pixels, the center crop
of a dataset with a crop margin (augment.center_crop), then what the
training pipeline gives the model: for the bfloat16 / float32 encodings the
pixels normalized with the manifest's mean and std (dataset.normalize) in
the model's input dtype; for uint8 / jpeg the pixels themselves (the model
normalizes them in its first layer, as in training). Then the model.
It needs only TensorFlow to load: `tf.saved_model.load(path).signatures['serving_default']`.
"""

import keras
import tensorflow as tf

from dataset_contract import manifest as manifest_lib
from train import augment, dataset, serving_image

EXPORT_DIR = "export"
SIGNATURE = "serving_default"
INPUT_KEY = "image_bytes"


def export_serving_model(model: keras.Model, manifest: dict, export_dir: str) -> str:
    """Write `model` with a bytes-in signature to `export_dir`; returns the path.

    Called outside the training strategy's scope: the model is rebuilt there
    from its config and given the trained weights, so the SavedModel holds
    plain variables whatever strategy trained it (TPU, mirrored or
    multi-worker variables do not save into a serving graph as they are).
    The layers keep their dtype policy, so a mixed-precision model serves
    in the precision it was trained in; its outputs are float32.
    """
    serving_model = keras.Model.from_config(model.get_config())
    serving_model.set_weights(model.get_weights())
    image_format = dataset.ImageFormat.from_manifest(manifest)
    resize_method = manifest["image"]["resize_method"]
    class_names = tf.constant(manifest["labels"], tf.string)

    def serve(image_bytes):
        images = serving_model_input(image_bytes, image_format, resize_method)
        probabilities = tf.cast(serving_model(images, training=False), tf.float32)
        label = tf.gather(class_names, tf.argmax(probabilities, axis=-1))
        return {"probabilities": probabilities, "label": label}

    archive = keras.export.ExportArchive()
    archive.track(serving_model)
    archive.add_endpoint(
        name=SIGNATURE, fn=serve, input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_KEY)]
    )
    archive.write_out(export_dir, verbose=False)
    return export_dir


def serving_model_input(image_bytes: tf.Tensor, image_format: dataset.ImageFormat, resize_method: str):
    """A batch of encoded images -> what the evaluation pipeline feeds the model for the same images.

    Decode and resize to the stored size as stage 1 does, take the center
    crop when the dataset has a crop margin (as evaluation does), and
    normalize for the encodings stage 1 normalized. The model's own first
    layers do the rest (its input convention, models.py).
    """
    pixels = serving_image.decode_and_resize_batch(image_bytes, image_format.height, resize_method)
    if image_format.has_crop_margin:
        pixels = augment.center_crop(pixels, image_format.input_shape[0])
    if image_format.normalized_offline:
        return tf.cast(dataset.normalize(pixels, image_format.mean, image_format.std), image_format.dtype)
    return pixels


def export_path(model_dir: str) -> str:
    return manifest_lib.join(model_dir, EXPORT_DIR)
