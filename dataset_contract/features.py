"""Feature keys of the TFRecord examples and the image encodings.

Every example in a shard is a `tf.train.Example` with these features:

  image       bytes   the image, encoded per the manifest's `image.encoding`
  label       int64   index into the manifest's `labels`
  class_name  bytes   the class name (UTF-8), equal to labels[label]
  sha256      bytes   hex sha256 of the source file's bytes (the dedup key)
  uri         bytes   where the source file was read from

`image` is one bytes feature for every encoding, so a batch parses with one
`parse_example` and decodes with one vectorized op:

  bfloat16  H*W*3 little-endian bfloat16, already normalized  (decode_raw)
  float32   H*W*3 little-endian float32, already normalized   (decode_raw)
  uint8     H*W*3 raw RGB pixels, normalize with the manifest  (decode_raw)
  jpeg      a baseline JPEG of the HxW RGB image               (decode_jpeg)
"""

IMAGE = "image"
LABEL = "label"
CLASS_NAME = "class_name"
SHA256 = "sha256"
URI = "uri"

BFLOAT16 = "bfloat16"
FLOAT32 = "float32"
UINT8 = "uint8"
JPEG = "jpeg"
ENCODINGS = (BFLOAT16, FLOAT32, UINT8, JPEG)

# The source files of a tree that are images, by extension (any case): Keras' image_dataset_from_directory
# takes .bmp .gif .jpeg .jpg .png; WebP is added as stage 1's decoder reads it. Stage 1 lists with it
# (preprocess/input_rules.py); stage 2 recognises a folder of images given where a dataset belongs.
SOURCE_IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".webp")

# Encodings whose pixels are normalized offline; the others hold 0-255 pixels
# and are normalized at read time with the manifest's mean and std.
NORMALIZED_ENCODINGS = (BFLOAT16, FLOAT32)

CHANNELS = 3


def raw_bytes_per_image(encoding: str, height: int, width: int) -> int | None:
    """Size of the `image` feature for fixed-size encodings, None for jpeg."""
    itemsize = {BFLOAT16: 2, FLOAT32: 4, UINT8: 1}.get(encoding)
    if itemsize is None:
        return None
    return height * width * CHANNELS * itemsize
