"""Crops of the stored squares: random ones for training, the center one for evaluation and serving.

A dataset written with stage 1's `--crop-margin` stores `stored x stored`
squares (manifest `image.height`) for a model that sees `crop x crop`
(`image.crop_size`): the "resize to 256, crop 224" convention of the
ImageNet recipes, with the resize done offline.

  random_crop_and_flip  training: a random crop x crop window of each image, mirrored half the time
  center_crop           evaluation and serving: the centered window (geometry.center_crop_offset)

Both work on whole batches with static shapes (XLA compiles one program per
shape) and on any dtype (uint8 pixels or bfloat16/float32 normalized
values): a crop only moves values, so it commutes with the normalization.
"""

import tensorflow as tf

from dataset_contract import geometry


def center_crop(images: tf.Tensor, crop_size: int) -> tf.Tensor:
    """The centered crop_size x crop_size window of [..., H, W, C] images (one image or a batch)."""
    height, width = images.shape[-3], images.shape[-2]
    if height is None or width is None:
        raise ValueError(f"center_crop needs static image sizes, got shape {images.shape}")
    if crop_size > min(height, width):
        raise ValueError(f"cannot crop {crop_size}x{crop_size} out of {height}x{width} images")
    top = geometry.center_crop_offset(height, crop_size)
    left = geometry.center_crop_offset(width, crop_size)
    return images[..., top : top + crop_size, left : left + crop_size, :]


def random_crop_and_flip(images: tf.Tensor, crop_size: int) -> tf.Tensor:
    """A random crop_size x crop_size window of each image of a [B, H, W, C] batch, mirrored left-right
    with probability 1/2.

    Every position is equally likely (top in [0, H - crop], left in
    [0, W - crop]), drawn anew at every call: each pass over the data sees
    other crops. Vectorized over the batch with two gathers (no per-image
    map); the output shape is static.
    """
    batch, height, width, _ = images.shape
    if batch is None or height is None or width is None:
        raise ValueError(f"random_crop_and_flip needs a static batch shape, got {images.shape}")
    if crop_size > min(height, width):
        raise ValueError(f"cannot crop {crop_size}x{crop_size} out of {height}x{width} images")
    top = tf.random.uniform([batch], 0, height - crop_size + 1, dtype=tf.int32)
    left = tf.random.uniform([batch], 0, width - crop_size + 1, dtype=tf.int32)
    window = tf.range(crop_size)
    flip = tf.random.uniform([batch]) < 0.5
    # Mirroring a window is reading its columns backwards: fold the flip into the column gather.
    columns = tf.where(flip[:, None], window[None, ::-1], window[None, :]) + left[:, None]
    rows = top[:, None] + window[None, :]
    images = tf.gather(images, rows, axis=1, batch_dims=1)
    return tf.gather(images, columns, axis=2, batch_dims=1)
