"""What runs fast on this device: mixed precision, XLA, steps per execution.

`choose_defaults` is a pure function of a DeviceDescription and the flags, so every rule is unit-tested
without a GPU or a TPU; `describe_devices` builds the description from the running TensorFlow.
docs/internals.md says what `auto` means on each device, and why.
"""

import contextlib
import dataclasses

from train.errors import ConfigError
from train.loop.plan import TPU_STEPS_PER_EXECUTION, TrainingPlan

TPU, GPU, CPU = "tpu", "gpu", "cpu"

# What `xla` can be: compiled by the TPU itself, by Keras (jit_compile=True), by TensorFlow's
# auto-clustering (per device, around the all-reduce), or not at all.
XLA_TPU, XLA_KERAS, XLA_AUTOCLUSTERING, XLA_OFF = "tpu", "keras", "autoclustering", "off"
# On the JAX backend every step is one jax.jit program over the process's devices, the cross-device
# reduction included (what Keras' jit_compile cannot do under a tf.distribute strategy); off only on request.
XLA_JAX = "jax"
# DeviceDescription.strategy on the JAX backend (keras.distribution.DataParallel): train.device.devices.
JAX_DATA_PARALLEL = "jax data parallel"
# Who runs several steps per execution: Keras' own loop, or train/loop/multi_step.py's (multi_step.TF_RANGE_LOOP).
KERAS_LOOP, TF_RANGE_LOOP = "keras loop", "tf.range loop"

GPU_STEPS_PER_EXECUTION = 8
BFLOAT16_MIN_COMPUTE_CAPABILITY = (8, 0)
MULTI_STEP_BLOCKER = "keras-team/keras#19246"

_POLICIES = {"bfloat16": "mixed_bfloat16", "float16": "mixed_float16", "off": "float32"}


@dataclasses.dataclass(frozen=True)
class DeviceDescription:
    """What training runs on: the inputs of every device-dependent default."""

    kind: str  # TPU, GPU or CPU
    num_replicas: int = 1
    strategy: str = "default"  # train.device.strategy's kinds: tpu, mirrored, multiworker, default
    gpu_compute_capability: tuple[int, int] | None = None  # the lowest of the GPUs in use


@dataclasses.dataclass(frozen=True)
class AcceleratorChoice:
    """The configuration `choose_defaults` picked, with the reasons (bench_input prints them)."""

    policy: str  # a Keras dtype policy name
    xla: str  # XLA_TPU, XLA_KERAS, XLA_AUTOCLUSTERING or XLA_OFF
    steps_per_execution: int  # the default asked of plan_training (an explicit flag wins there)
    multi_step_supported: bool
    notes: tuple[str, ...] = ()
    multi_step_loop: str = KERAS_LOOP  # KERAS_LOOP or TF_RANGE_LOOP (train/loop/multi_step.py)

    @property
    def keras_jit_compile(self) -> bool:
        return self.xla in (XLA_KERAS, XLA_JAX)

    def describe(self) -> str:
        loop = f" ({self.multi_step_loop})" if self.steps_per_execution > 1 else ""
        return f"policy {self.policy}, XLA {self.xla}, {self.steps_per_execution} step(s) per execution{loop}"


def multi_step_supported(device: DeviceDescription) -> bool:
    """Whether several steps per execution can run there: everywhere, by Keras' loop or multi_step.py's."""
    return True


def multi_step_loop(device: DeviceDescription) -> str:
    """Whose loop runs several steps per execution: multi_step.py's under a multi-replica mirrored strategy."""
    if device.strategy in ("mirrored", "multiworker") and device.num_replicas > 1:
        return TF_RANGE_LOOP
    return KERAS_LOOP


def _policy(device: DeviceDescription, choice: str, notes: list) -> str:
    if choice not in _POLICIES and choice != "auto":
        raise ConfigError(f"unknown --mixed-precision {choice!r}; choose auto, {', '.join(_POLICIES)}")
    if choice == "float16" and device.kind == TPU:
        raise ConfigError(
            "--mixed-precision float16 on a TPU: TPUs compute in bfloat16; use bfloat16 or auto"
        )
    if choice != "auto":
        return _POLICIES[choice]
    if device.kind == TPU:
        return "mixed_bfloat16"
    if device.kind == GPU:
        capability = device.gpu_compute_capability
        if capability is not None and tuple(capability) >= BFLOAT16_MIN_COMPUTE_CAPABILITY:
            notes.append(f"bfloat16: GPU compute capability {capability[0]}.{capability[1]} >= 8.0")
            return "mixed_bfloat16"
        notes.append("float16 with dynamic loss scaling: GPU older than compute capability 8.0")
        return "mixed_float16"
    return "float32"


def _xla(device: DeviceDescription, choice: str, notes: list) -> str:
    if choice not in ("auto", "on", "off"):
        raise ConfigError(f"unknown --jit-compile {choice!r}; choose auto, on or off")
    if device.strategy == JAX_DATA_PARALLEL:
        return XLA_OFF if choice == "off" else XLA_JAX
    if device.kind == TPU:
        return XLA_TPU
    if choice == "off" or (choice == "auto" and device.kind == CPU):
        return XLA_OFF
    if device.num_replicas > 1:
        notes.append(
            "XLA by auto-clustering: Keras' jit_compile cannot compile a step that spans several replicas"
            + (" (on CPU it also needs TF_XLA_FLAGS=--tf_xla_cpu_global_jit)" if device.kind == CPU else "")
        )
        return XLA_AUTOCLUSTERING
    return XLA_KERAS


def choose_defaults(
    device: DeviceDescription,
    mixed_precision: str = "auto",
    jit_compile: str = "auto",
    steps_per_execution: int | None = None,
) -> AcceleratorChoice:
    """The fast path for `device`, with explicit flags winning (what auto means: docs/internals.md)."""
    notes: list[str] = []
    policy = _policy(device, mixed_precision, notes)
    xla = _xla(device, jit_compile, notes)
    supported = multi_step_supported(device)
    loop = multi_step_loop(device)
    if device.kind == TPU:
        per_call = TPU_STEPS_PER_EXECUTION
    elif device.kind == GPU:
        per_call = GPU_STEPS_PER_EXECUTION
    else:
        per_call = 1
    if loop == TF_RANGE_LOOP and max(per_call, steps_per_execution or 1) > 1:
        notes.append(
            f"several steps per execution in a tf.range loop around strategy.run (train/loop/multi_step.py): Keras' "
            f"own loop cannot run under a multi-replica {device.strategy} strategy ({MULTI_STEP_BLOCKER})"
        )
    return AcceleratorChoice(
        policy=policy,
        xla=xla,
        steps_per_execution=per_call,
        multi_step_supported=supported,
        notes=tuple(notes),
        multi_step_loop=loop,
    )


def steps_per_execution_warning(wanted: int, asked_by_flag: bool, plan: TrainingPlan) -> str | None:
    """What to warn when `plan` runs far fewer steps per execution than `wanted`; None when it does not.

    `wanted` is --steps-per-execution if given (`asked_by_flag`), else the
    device default (AcceleratorChoice.steps_per_execution). An epoch shorter
    than `wanted` runs whole, and a divisor within half of `wanted` keeps
    nearly all of its gain: neither is worth a warning.
    """
    reachable = min(wanted, plan.steps_per_epoch)
    if 2 * plan.steps_per_execution >= reachable:
        return None
    whose = "asked for by --steps-per-execution" if asked_by_flag else "the device default"
    multiple = -(-plan.steps_per_epoch // wanted) * wanted
    return (
        f"{plan.steps_per_execution} step(s) per execution instead of {wanted} ({whose}): it must divide the "
        f"{plan.steps_per_epoch} steps of an epoch, which have no divisor between {-(-wanted // 2)} and "
        f"{2 * wanted}; every step then costs a host round trip. Choose --steps-per-epoch (or --steps) a "
        f"multiple of {wanted}, e.g. {multiple}, to keep it"
    )


def check_cpu_xla_available(device: DeviceDescription, choice: AcceleratorChoice) -> None:
    """Stop with a ConfigError when XLA is asked of a CPU whose TensorFlow has no XLA:CPU backend.

    The tensorflow-tpu wheel (2.20) compiles for TPUs only: off a TPU, a step
    compiled for the CPU fails at the first step with "could not find registered
    transfer manager for platform Host". A one-op compile here says so before
    anything is built.
    """
    if device.kind != CPU or choice.xla in (XLA_OFF, XLA_JAX):
        return
    import tensorflow as tf

    try:
        tf.function(lambda x: x + 1, jit_compile=True)(tf.constant(1))
    except (tf.errors.NotFoundError, tf.errors.UnimplementedError, tf.errors.InvalidArgumentError) as exc:
        reason = str(exc).strip().splitlines()[0][:200]
        raise ConfigError(
            f"--jit-compile on: this TensorFlow ({tf.__version__}) cannot compile for the CPU with XLA ({reason}); "
            "the tensorflow-tpu build compiles for TPUs only. Train on the CPU with --jit-compile off (the CPU "
            "default), or install the CPU build (pip install '.[train]')"
        ) from exc


def describe_devices(strategy) -> DeviceDescription:
    """The DeviceDescription of the running TensorFlow under `strategy`."""
    import tensorflow as tf

    from train.device import strategy as strategy_lib

    kind = strategy_lib.strategy_kind(strategy)
    if kind == strategy_lib.TPU:
        device = TPU
    elif tf.config.list_logical_devices("GPU"):  # strategy.resolve_strategy mirrors over GPUs when there are
        device = GPU
    else:
        device = CPU
    capability = None
    if device == GPU:
        found = []
        for gpu in tf.config.list_physical_devices("GPU"):
            details = tf.config.experimental.get_device_details(gpu)
            if details.get("compute_capability"):
                found.append(tuple(details["compute_capability"]))
        capability = min(found) if found else None
    return DeviceDescription(
        kind=device,
        num_replicas=strategy.num_replicas_in_sync,
        strategy=kind,
        gpu_compute_capability=capability,
    )


@contextlib.contextmanager
def xla_autoclustering(enabled: bool):
    """TensorFlow's XLA auto-clustering while training runs (it is process-wide), then the previous setting."""
    import tensorflow as tf

    if not enabled:
        yield
        return
    previous = tf.config.optimizer.get_jit()
    tf.config.optimizer.set_jit("autoclustering")
    try:
        yield
    finally:
        tf.config.optimizer.set_jit(previous or False)
