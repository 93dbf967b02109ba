"""Defaults per device: the batch per replica, the learning rate that follows it, the files read at once.

Pure functions of the device kind, the model, the image size and the replica
count: no accelerator is needed to hold them (and none is reachable here).
"""

import math

import pytest

from pipelines.tpu import launch as tpu_launch
from pipelines.tpu import runtime as tpu_runtime
from train.config import RESNET50, SMALL_CNN, TrainConfig
from train.device import device_defaults
from train.device.device_defaults import CPU, GPU, TPU
from train.loop.plan import plan_training
from train.model import lr_scaling, recipe

BIG_SPLIT = 10_000_000


def plan_for(kind, replicas, model=RESNET50, image_size=224, examples=BIG_SPLIT, **overrides):
    config = TrainConfig(data_dir="d", model_dir="m", model=model, **overrides)
    defaults = device_defaults.device_defaults(kind, model, image_size)
    return config, plan_training(config, examples, replicas, on_tpu=kind == TPU, defaults=defaults)


@pytest.mark.parametrize(
    "kind,model,image_size,per_replica",
    [
        (TPU, RESNET50, 224, 128),  # tensorflow/models' TPU reference: 128 per replica
        (GPU, RESNET50, 224, 128),
        (CPU, RESNET50, 224, 32),  # the CPU stays small
        (TPU, RESNET50, 448, 32),  # 4x the pixels, a quarter of the batch
        (TPU, RESNET50, 256, 96),  # 128 x (224/256)^2 = 98, rounded down to a multiple of 8
        (TPU, SMALL_CNN, 32, 128),  # smaller images keep the 224 figure
        (GPU, "efficientnetb0", 224, 64),  # its GPU reference runs half of ResNet-50's batch
        (TPU, "efficientnetb0", 224, 128),  # its TPU reference does not
        (TPU, RESNET50, 2048, 1),  # too large for 8: no rounding to zero
    ],
)
def test_the_batch_per_replica_follows_the_device_the_model_and_the_pixels(
    kind, model, image_size, per_replica
):
    assert device_defaults.default_per_replica_batch(kind, model, image_size).per_replica == per_replica


@pytest.mark.parametrize(
    "kind,replicas,batch",
    [(TPU, 8, 1024), (TPU, 64, 8192), (GPU, 1, 128), (GPU, 8, 1024), (CPU, 1, 32), (CPU, 2, 64)],
)
def test_the_default_global_batch_is_the_batch_per_replica_times_the_replicas(kind, replicas, batch):
    _, plan = plan_for(kind, replicas)
    assert (plan.global_batch_size, plan.per_replica_batch_size) == (batch, batch // replicas)
    assert f"x {replicas} replica" in plan.describe_batch() and f"on {kind}" in plan.describe_batch()


def test_an_explicit_global_batch_wins_and_the_plan_line_says_so():
    _, plan = plan_for(TPU, 8, global_batch_size=256)
    assert plan.global_batch_size == 256 and plan.per_replica_batch_size == 32
    assert "--global-batch-size" in plan.describe_batch()


def test_a_default_larger_than_the_train_split_is_lowered_to_fit_it_but_a_flag_is_not():
    _, plan = plan_for(CPU, 2, model=SMALL_CNN, image_size=32, examples=48)
    assert (plan.global_batch_size, plan.per_replica_batch_size) == (48, 24)
    assert "to fit the train split's 48 examples" in plan.describe_batch()
    with pytest.raises(Exception, match="fewer than one global batch"):
        plan_for(CPU, 2, model=SMALL_CNN, image_size=32, examples=48, global_batch_size=64)


def test_the_learning_rate_follows_the_default_batch_per_replica_count():
    for replicas in (1, 2):
        config, plan = plan_for(CPU, replicas)
        run = recipe.resolve_recipe(config, plan)
        assert run.peak_learning_rate == pytest.approx(1e-3 * 32 * replicas / 256)  # AdamW, linear below 256


def test_a_v5litepod_64_gets_8192_images_and_a_sane_adamw_peak_by_the_square_root():
    tpu = tpu_runtime.parse_accelerator_type("v5litepod-64")
    assert tpu_launch.tpu_replicas(tpu) == 64
    assert tpu_launch.default_global_batch_size(RESNET50, 224, tpu) == 8192
    config, plan = plan_for(TPU, 64, epochs=30)
    assert plan.global_batch_size == 8192
    adamw = recipe.resolve_recipe(config, plan)
    # Linear scaling gave 1e-3 x 32 = 0.032, about 10x the AdamW recipes at this batch; the square root 5.7e-3.
    assert adamw.peak_learning_rate == pytest.approx(1e-3 * math.sqrt(32))
    assert adamw.peak_learning_rate < 0.01
    assert adamw.learning_rate_scaling == lr_scaling.SQRT
    assert "square-root scaling" in recipe.describe(adamw)
    # SGD keeps Goyal et al.'s linear rule: 0.1 x 8192 / 256 = 3.2, their 8k figure, with the warmup.
    config, plan = plan_for(TPU, 64, epochs=30, optimizer="sgd")
    sgd = recipe.resolve_recipe(config, plan)
    assert sgd.peak_learning_rate == pytest.approx(3.2) and sgd.learning_rate_scaling == lr_scaling.LINEAR
    assert sgd.warmup_steps > 0 and "linear scaling" in recipe.describe(sgd)


def test_the_launcher_passes_the_batch_python_m_train_would_pick():
    for accelerator_type, replicas in (("v5litepod-8", 8), ("v4-32", 16), ("v3-8", 8)):
        tpu = tpu_runtime.parse_accelerator_type(accelerator_type)
        _, plan = plan_for(TPU, replicas)
        assert tpu_launch.default_global_batch_size(RESNET50, 224, tpu) == plan.global_batch_size


@pytest.mark.parametrize("kind,files", [(TPU, 64), (GPU, 32), (CPU, 16)])
def test_the_files_read_at_once_are_sized_for_the_host_and_a_flag_wins(kind, files):
    _, plan = plan_for(kind, 1)
    assert plan.parallel_files == files
    assert plan.parallel_files >= 64 or kind != TPU
    _, plan = plan_for(kind, 1, parallel_files=7)
    assert plan.parallel_files == 7


def test_the_command_line_takes_the_new_flags():
    from train.__main__ import build_parser, config_from_args

    args = build_parser().parse_args(
        ["--data", "d", "--model-dir", "m", "--parallel-files", "96", "--learning-rate-scaling", "linear"]
    )
    config = config_from_args(args)
    assert (config.parallel_files, config.learning_rate_scaling, config.global_batch_size) == (
        96,
        "linear",
        None,
    )
