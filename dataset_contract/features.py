"""Feature keys of the TFRecord examples and the image encodings."""

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
# (preprocess/inputs/rules.py); stage 2 recognises a folder of images given where a dataset belongs.
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
