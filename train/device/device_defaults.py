"""What a run trains with when the flags do not say: the batch per replica and the files each host reads at once.

A pure function of the device kind, the model and the image size (no TensorFlow here);
train.loop.plan.plan_training applies it. docs/internals.md has the references behind each figure.
"""

import dataclasses

from train.config import EFFICIENTNET_B0

TPU, GPU, CPU = "tpu", "gpu", "cpu"  # train.device.accelerator's device kinds

REFERENCE_IMAGE_SIZE = 224
PER_REPLICA_BATCH = {TPU: 128, GPU: 128, CPU: 32}
# (model, device kind) -> the model's reference batch over ResNet-50's on that device (docs/internals.md).
MODEL_BATCH_FACTOR = {(EFFICIENTNET_B0, GPU): 0.5}
BATCH_MULTIPLE = 8

# Files each host reads at once (--parallel-files), per device kind. Each file in flight is one
# sequential read stream from GCS, so a host's read bandwidth is at most N x (one stream's rate).
# Issue 26 works with about 100 MB/s per stream: 16 files (the former fixed value) cap a host at
# about 1.6 GB/s, 1.6e9 / 196,608 bytes = about 8,100 images/s of 256x256 uint8 records, which the
# issue's review found below what a v4 or v5e host takes for ResNet-50 (a figure not measured
# here: no TPU is reachable). 64 files raise that ceiling fourfold. The cost is host memory: each
# open file holds a read-ahead buffer of dataset.READ_BUFFER_BYTES (8 MiB), so 64 files hold
# 512 MiB. GPU hosts read 32 at once (twice the former value, 256 MiB of buffers); CPUs keep 16.
# A split with fewer shards reads them all at once (dataset.py takes the smaller of the two).
PARALLEL_FILES = {TPU: 64, GPU: 32, CPU: 16}


@dataclasses.dataclass(frozen=True)
class BatchDefault:
    """The per-replica batch a device gets without --global-batch-size, and the rule that gave it."""

    per_replica: int
    reason: str  # for the plan line: "128 at 224x224 on tpu x 224^2/256^2 pixels"


def default_per_replica_batch(kind: str, model: str, image_size: int) -> BatchDefault:
    """The batch per replica for `model` on `image_size` squares on a device of `kind` (docs/internals.md)."""
    base = PER_REPLICA_BATCH.get(kind, PER_REPLICA_BATCH[CPU])
    factor = MODEL_BATCH_FACTOR.get((model, kind), 1.0)
    scale = min(1.0, (REFERENCE_IMAGE_SIZE / image_size) ** 2)
    exact = base * factor * scale
    per_replica = (
        int(exact) // BATCH_MULTIPLE * BATCH_MULTIPLE if exact >= BATCH_MULTIPLE else max(1, int(exact))
    )
    how = [f"{base} at {REFERENCE_IMAGE_SIZE}x{REFERENCE_IMAGE_SIZE} on {kind}"]
    if factor != 1.0:
        how.append(f"x {factor:g} for {model}")
    if scale < 1.0:
        how.append(f"x {REFERENCE_IMAGE_SIZE}^2/{image_size}^2 pixels")
    return BatchDefault(per_replica=per_replica, reason=" ".join(how))


def default_parallel_files(kind: str) -> int:
    """How many files each host reads at once without --parallel-files (the table above)."""
    return PARALLEL_FILES.get(kind, PARALLEL_FILES[CPU])


@dataclasses.dataclass(frozen=True)
class DeviceDefaults:
    """What plan_training fills in for flags left unset: the batch per replica and the files read at once."""

    batch: BatchDefault
    parallel_files: int


def device_defaults(kind: str, model: str, image_size: int) -> DeviceDefaults:
    """The defaults of a run of `model` on `image_size` squares on a device of `kind`."""
    return DeviceDefaults(
        batch=default_per_replica_batch(kind, model, image_size),
        parallel_files=default_parallel_files(kind),
    )


def for_manifest(kind: str, model: str, manifest: dict) -> DeviceDefaults:
    """device_defaults for the square the model sees in a dataset (its crop size: dataset_contract.manifest)."""
    from dataset_contract import manifest as manifest_lib

    return device_defaults(kind, model, manifest_lib.crop_size(manifest["image"]))
