"""Device-dependent defaults (mixed precision, XLA, steps per execution): a pure function of the device."""

import pytest

from train import accelerator
from train.accelerator import GPU, TPU, DeviceDescription, choose_defaults
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


def test_an_eight_gpu_mirrored_host_gets_bfloat16_and_xla_by_autoclustering_one_step_per_execution():
    choice = choose_defaults(EIGHT_A100)
    assert choice.policy == "mixed_bfloat16"
    # Keras' jit_compile would compile the all-reduce across GPUs into one program: auto-clustering instead.
    assert choice.xla == accelerator.XLA_AUTOCLUSTERING and not choice.keras_jit_compile
    assert choice.steps_per_execution == 1 and not choice.multi_step_supported
    assert any(accelerator.MULTI_STEP_BLOCKER in note for note in choice.notes)


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
    # An explicit --steps-per-execution is plan_training's to honour; the multi-replica limit still holds.
    choice = choose_defaults(EIGHT_A100, steps_per_execution=16)
    assert not choice.multi_step_supported and any("instead of 16" in note for note in choice.notes)


def test_a_gpu_of_unknown_generation_is_not_assumed_to_have_bfloat16():
    choice = choose_defaults(DeviceDescription(GPU, gpu_compute_capability=None))
    assert choice.policy == "mixed_float16"
