"""How the peak learning rate follows the global batch (--learning-rate-scaling); no TensorFlow here.

    linear  base x batch / 256. The rule for SGD with momentum (Goyal et al. 2017, "Accurate, Large
            Minibatch SGD: Training ImageNet in 1 Hour"): their ResNet-50 trains at 0.1 x batch / 256
            up to a batch of 8192 (peak 3.2) with a gradual warmup, which recipe.py's warmup gives.
    sqrt    base x sqrt(batch / 256). For adaptive optimizers the square-root rule is the one that
            keeps the training dynamics (Malladi et al. 2022, "On the SDEs and Scaling Rules for
            Adaptive Gradient Algorithms", NeurIPS; Krizhevsky 2014 and Hoffer et al. 2017 proposed
            it earlier). Linear scaling of AdamW's base 1e-3 per 256 would give 0.032 at the 8192 of
            a v5litepod-64 at 128 per chip; the AdamW recipes published for ImageNet stay near
            4e-3 at 4096 (ConvNeXt: 4e-3 at 4096; DeiT: 5e-4 x batch / 512, 8e-3 at 8192), and
            the square root gives 1e-3 x sqrt(32) = 5.7e-3 there.
    auto    (default) linear for SGD; for AdamW linear up to 256 images, the batch the base rate is
            stated for, and the square root above it: small batches keep the learning rate they
            always had, large ones get the square root.

The plan prints which rule gave the peak (recipe.describe), and metrics.json records it.
"""

import math

from train.errors import ConfigError

# The batch size the base learning rates are stated for (recipe.DEFAULTS).
REFERENCE_BATCH = 256
AUTO, LINEAR, SQRT = "auto", "linear", "sqrt"
SCALINGS = (AUTO, LINEAR, SQRT)
_ADAPTIVE = ("adamw",)


def effective_scaling(choice: str, optimizer: str, global_batch_size: int) -> str:
    """LINEAR or SQRT: what `choice` (--learning-rate-scaling) means for `optimizer` at `global_batch_size`."""
    if choice not in SCALINGS:
        raise ConfigError(f"unknown --learning-rate-scaling {choice!r}; choose one of {', '.join(SCALINGS)}")
    if choice != AUTO:
        return choice
    if optimizer in _ADAPTIVE and global_batch_size > REFERENCE_BATCH:
        return SQRT
    return LINEAR


def scaled_learning_rate(base: float, global_batch_size: int, scaling: str) -> float:
    """The peak learning rate: `base` (per REFERENCE_BATCH images) scaled to `global_batch_size` by `scaling`."""
    ratio = global_batch_size / REFERENCE_BATCH
    return base * (math.sqrt(ratio) if scaling == SQRT else ratio)


def describe(base: float, scaling: str) -> str:
    """How the peak was computed, e.g. `base 0.001 x sqrt(batch / 256)`."""
    if scaling == SQRT:
        return f"base {base:g} x sqrt(batch / {REFERENCE_BATCH}), square-root scaling"
    return f"base {base:g} x batch / {REFERENCE_BATCH}, linear scaling"
