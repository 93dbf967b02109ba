"""Choosing the tf.distribute strategy and the mixed-precision policy, once.

`resolve_strategy` is the only place that decides where training runs:

  a TPU (--tpu NAME|local, $TPU_NAME, or TPU devices on this VM) -> TPUStrategy
  TF_CONFIG naming a cluster                                     -> MultiWorkerMirroredStrategy
  more than one GPU                                              -> MirroredStrategy
  otherwise                                                      -> the default strategy (one device)

`--strategy tpu|mirrored|multiworker|default` forces a choice; asking for
something this machine does not have stops with a StrategyError.
"""

import glob
import json
import logging
import os

import tensorflow as tf

from train.errors import StrategyError

AUTO = "auto"
TPU = "tpu"
MIRRORED = "mirrored"
MULTIWORKER = "multiworker"
DEFAULT = "default"
STRATEGIES = (AUTO, TPU, MIRRORED, MULTIWORKER, DEFAULT)

MIXED_PRECISION_CHOICES = ("auto", "bfloat16", "float16", "off")

# A TPU VM exposes its chips as /dev/accel* (v2-v4) or /dev/vfio/<n> (v5 and later).
_TPU_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*")

log = logging.getLogger(__name__)


def _find_tpu() -> str | None:
    """The TPU to use when none was named: $TPU_NAME, or this VM's own chips."""
    if os.environ.get("TPU_NAME"):
        return os.environ["TPU_NAME"]
    if any(glob.glob(pattern) for pattern in _TPU_DEVICE_GLOBS):
        return "local"
    return None


def _connect_tpu(tpu: str) -> tf.distribute.TPUStrategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        if tpu != "local":  # a TPU VM's chips are attached; a TPU node is reached over gRPC
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as exc:
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise StrategyError(
            f"no TPU could be initialized for --tpu {tpu!r}: {reason}. On a TPU VM use --tpu local, for a "
            "TPU node --tpu NAME; to train on this machine's CPU or GPUs use --strategy auto"
        ) from exc
    return tf.distribute.TPUStrategy(resolver)


def _tf_config_cluster() -> dict:
    try:
        return json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    except json.JSONDecodeError as exc:
        raise StrategyError(f"TF_CONFIG is not valid JSON: {exc}") from exc


def _mirrored() -> tf.distribute.MirroredStrategy:
    if tf.config.list_logical_devices("GPU"):
        return tf.distribute.MirroredStrategy()
    # No GPU: mirror over the logical CPU devices if someone configured more
    # than one; that is how the multi-replica path is exercised on a laptop or CI.
    cpus = [device.name for device in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(devices=cpus)


def resolve_strategy(name: str = AUTO, tpu: str | None = None) -> tf.distribute.Strategy:
    """The strategy to build the model, optimizer and metrics in; see the module docstring."""
    if name not in STRATEGIES:
        raise StrategyError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
    if name == TPU or (name == AUTO and tpu):
        target = tpu or _find_tpu()
        if target is None:
            raise StrategyError(
                "--strategy tpu: no TPU found (no --tpu flag, no $TPU_NAME, no TPU devices on this machine). "
                "Pass --tpu NAME (a TPU node) or --tpu local (on a TPU VM), or use --strategy auto"
            )
        return _connect_tpu(target)
    if name == AUTO:
        found = _find_tpu()
        if found is not None:
            try:
                return _connect_tpu(found)
            except StrategyError as exc:
                log.warning("TPU devices seem present but could not be used, continuing without: %s", exc)
        if _tf_config_cluster():
            return tf.distribute.MultiWorkerMirroredStrategy()
        if len(tf.config.list_logical_devices("GPU")) > 1:
            return tf.distribute.MirroredStrategy()
        return tf.distribute.get_strategy()
    if name == MIRRORED:
        return _mirrored()
    if name == MULTIWORKER:
        if not _tf_config_cluster():
            raise StrategyError(
                "--strategy multiworker needs TF_CONFIG describing the cluster "
                '(e.g. {"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": "worker", "index": 0}})'
            )
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def strategy_kind(strategy: tf.distribute.Strategy) -> str:
    """TPU, MULTIWORKER, MIRRORED or DEFAULT: what kind of strategy this is."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return TPU
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return MULTIWORKER
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return MIRRORED
    return DEFAULT


def mixed_precision_policy(choice: str, strategy: tf.distribute.Strategy) -> str:
    """The Keras dtype policy for `--mixed-precision choice` under `strategy`.

    `auto` is bfloat16 on a TPU, where the MXU computes in bfloat16 anyway and
    it needs no loss scaling; elsewhere it is off, because float16 on a GPU is
    a trade (loss scaling, overflow) that the user should opt into.
    """
    if choice not in MIXED_PRECISION_CHOICES:
        raise StrategyError(f"unknown --mixed-precision {choice!r}; choose one of {MIXED_PRECISION_CHOICES}")
    if choice == "auto":
        return "mixed_bfloat16" if strategy_kind(strategy) == TPU else "float32"
    return {"bfloat16": "mixed_bfloat16", "float16": "mixed_float16", "off": "float32"}[choice]


def worker_name(strategy: tf.distribute.Strategy) -> str | None:
    """`worker-3` on a non-chief multi-worker host, None where this process is the chief."""
    if strategy_kind(strategy) != MULTIWORKER:
        return None
    resolver = strategy.cluster_resolver
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type in (None, "chief"):
        return None
    if task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().jobs:
        return None
    return f"{task_type}-{task_id}"


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes the model dir's shared outputs (checkpoints, logs, export)."""
    return worker_name(strategy) is None
