"""Device-dependent defaults (mixed precision, XLA, steps per execution): a pure function of the device."""

import pytest

from train.device import accelerator
from train.device.accelerator import GPU, TPU, DeviceDescription, choose_defaults
from train.errors import ConfigError

A100 = DeviceDescription(GPU, num_replicas=1, strategy="default", gpu_compute_capability=(8, 0))
V100 = DeviceDescription(GPU, num_replicas=1, strategy="default", gpu_compute_capability=(7, 0))
EIGHT_A100 = DeviceDescription(GPU, num_replicas=8, strategy="mirrored", gpu_compute_capability=(8, 0))
TPU_V4 = DeviceDescription(TPU, num_replicas=8, strategy="tpu")
LAPTOP = DeviceDescription(accelerator.CPU)


def test_ampere_and_later_gpus_get_bfloat16_xla_and_several_steps_per_execution():
    choice = choose_defaults(A100)
    assert choice.policy == "mixed_bfloat16"
    assert choice.xla == accelerator.XLA_KERAS and choice.keras_jit_compile
    assert choice.steps_per_execution == accelerator.GPU_STEPS_PER_EXECUTION > 1


def test_older_gpus_get_float16_with_loss_scaling():
    choice = choose_defaults(V100)
    assert choice.policy == "mixed_float16"  # Keras wraps the optimizer in a LossScaleOptimizer for it
    assert any("loss scaling" in note for note in choice.notes)


def test_an_eight_gpu_mirrored_host_gets_bfloat16_xla_by_autoclustering_and_several_steps_in_a_tf_range_loop():
    choice = choose_defaults(EIGHT_A100)
    assert choice.policy == "mixed_bfloat16"
    # Keras' jit_compile would compile the all-reduce across GPUs into one program: auto-clustering instead.
    assert choice.xla == accelerator.XLA_AUTOCLUSTERING and not choice.keras_jit_compile
    # Keras' own multi-step loop fails under MirroredStrategy; train/loop/multi_step.py's tf.range loop runs them.
    assert (
        choice.steps_per_execution == accelerator.GPU_STEPS_PER_EXECUTION > 1 and choice.multi_step_supported
    )
    assert choice.multi_step_loop == accelerator.TF_RANGE_LOOP
    assert any(accelerator.MULTI_STEP_BLOCKER in note for note in choice.notes)
    assert "tf.range loop" in choice.describe()
    # One GPU keeps Keras' own loop.
    assert choose_defaults(A100).multi_step_loop == accelerator.KERAS_LOOP


def test_tpus_get_bfloat16_and_many_steps_per_execution_and_refuse_float16():
    choice = choose_defaults(TPU_V4)
    assert (choice.policy, choice.xla, choice.steps_per_execution) == (
        "mixed_bfloat16",
        accelerator.XLA_TPU,
        32,
    )
    with pytest.raises(ConfigError, match="TPUs compute in bfloat16"):
        choose_defaults(TPU_V4, mixed_precision="float16")


def test_cpus_stay_in_float32_without_xla_one_step_at_a_time():
    choice = choose_defaults(LAPTOP)
    assert (choice.policy, choice.xla, choice.steps_per_execution) == ("float32", accelerator.XLA_OFF, 1)


def test_every_default_is_overridable():
    choice = choose_defaults(A100, mixed_precision="off", jit_compile="off")
    assert (choice.policy, choice.xla) == ("float32", accelerator.XLA_OFF)
    choice = choose_defaults(LAPTOP, mixed_precision="bfloat16", jit_compile="on")
    assert (choice.policy, choice.xla) == ("mixed_bfloat16", accelerator.XLA_KERAS)
    # An explicit --steps-per-execution is plan_training's to honour, under several replicas too.
    choice = choose_defaults(EIGHT_A100, steps_per_execution=16)
    assert choice.multi_step_supported and choice.multi_step_loop == accelerator.TF_RANGE_LOOP


def test_a_gpu_of_unknown_generation_is_not_assumed_to_have_bfloat16():
    choice = choose_defaults(DeviceDescription(GPU, gpu_compute_capability=None))
    assert choice.policy == "mixed_float16"


def _tpu_plan(steps_per_epoch: int, steps_per_execution: int | None = None):
    from train.config import TrainConfig
    from train.loop.plan import plan_training

    config = TrainConfig(
        data_dir="d",
        model_dir="m",
        steps_per_epoch=steps_per_epoch,
        global_batch_size=8,
        steps_per_execution=steps_per_execution,
    )
    choice = choose_defaults(TPU_V4)
    plan = plan_training(config, 8000, 8, on_tpu=True, default_steps_per_execution=choice.steps_per_execution)
    return config, choice, plan


def test_a_prime_epoch_length_on_a_tpu_warns_against_the_device_default(caplog):
    from train.trainer import warn_about_steps_per_execution

    config, choice, plan = _tpu_plan(101)  # no --steps-per-execution: the loss is against the default
    with caplog.at_level("WARNING"):
        message = warn_about_steps_per_execution(config, choice, plan)
    assert message in caplog.text
    assert message.startswith("1 step(s) per execution instead of 32 (the device default)")
    assert "the 101 steps of an epoch" in message and "a multiple of 32, e.g. 128" in message


def test_the_warning_names_the_flag_when_the_flag_asked_for_more(caplog):
    from train.trainer import warn_about_steps_per_execution

    config, choice, plan = _tpu_plan(101, steps_per_execution=16)
    message = warn_about_steps_per_execution(config, choice, plan)
    assert message.startswith("1 step(s) per execution instead of 16 (asked for by --steps-per-execution)")


@pytest.mark.parametrize("steps_per_epoch", [96, 100, 74, 20])
def test_no_warning_where_a_divisor_near_the_default_or_the_whole_epoch_runs(steps_per_epoch):
    from train.trainer import warn_about_steps_per_execution

    config, choice, plan = _tpu_plan(steps_per_epoch)
    assert warn_about_steps_per_execution(config, choice, plan) is None
