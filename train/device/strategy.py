"""Choosing the tf.distribute strategy, once, and what follows from it (hosts, chief).

`resolve_strategy` is the only place that decides where training runs: a TPU (one VM or a slice), several
GPUs, a TF_CONFIG cluster, or the default strategy. docs/internals.md has the rules.
"""

import glob
import json
import logging
import os

import tensorflow as tf

from train import install_lines
from train.config import STRATEGIES
from train.errors import StrategyError

AUTO, TPU, MIRRORED, MULTIWORKER, DEFAULT = STRATEGIES

# A TPU VM exposes its chips as /dev/accel* (v2-v4) or /dev/vfio/<n> (v5 and later).
_TPU_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*")
LOCAL_TPU = "local"
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")

# The NVIDIA kernel driver's version file: present exactly when the driver is loaded.
# $TRAIN_NVIDIA_DRIVER_FILE replaces the path (tests point it at a file of their own).
NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"
NVIDIA_DRIVER_FILE_ENV = "TRAIN_NVIDIA_DRIVER_FILE"

log = logging.getLogger(__name__)


def _find_tpu() -> str | None:
    """The TPU to use when none was named: $TPU_NAME, or this VM's own chips."""
    if os.environ.get("TPU_NAME"):
        return os.environ["TPU_NAME"]
    if any(glob.glob(pattern) for pattern in _TPU_DEVICE_GLOBS):
        return LOCAL_TPU
    return None


def tpu_cluster_resolver(tpu: str, zone=None, project=None, service=None):
    """The resolver of `tpu`: `local` (this VM's chips) or a TPU name (every worker of the slice).

    `zone`, `project` and `service` (a Cloud TPU API object) default to what
    the resolver finds itself on a Google Cloud VM; tests pass them.
    """
    if tpu == LOCAL_TPU:
        return tf.distribute.cluster_resolver.TPUClusterResolver(tpu=LOCAL_TPU)
    return tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=tpu, zone=zone, project=project, service=service
    )


def tpu_workers(resolver) -> list[str]:
    """The TPU workers' addresses the resolver sees: [] for `local` (the chips of this VM)."""
    spec = resolver.cluster_spec()
    return list(spec.job_tasks(resolver.task_type)) if spec.jobs else []


def initialize_tpu(
    resolver,
    connect=tf.config.experimental_connect_to_cluster,
    initialize=tf.tpu.experimental.initialize_tpu_system,
) -> None:
    """Connect to the slice's workers (a named TPU only), then initialize the TPU system.

    A local TPU VM has its chips attached: there is nothing to connect to.
    A named TPU is reached over gRPC, all of its workers at once, so the
    connection comes before the initialization (which then covers every
    host of the slice).
    """
    if tpu_workers(resolver):
        connect(resolver)
    initialize(resolver)


def _connect_tpu(tpu: str) -> tf.distribute.TPUStrategy:
    try:
        resolver = tpu_cluster_resolver(tpu)
        initialize_tpu(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as exc:
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise StrategyError(
            f"no TPU could be initialized for --tpu {tpu!r}: {reason}. On a single-host TPU VM use --tpu "
            "local; for a multi-host slice run on its worker 0 with --tpu NAME; to train on this machine's "
            "CPU or GPUs use --strategy auto"
        ) from exc
    return tf.distribute.TPUStrategy(resolver)


def nvidia_driver() -> str | None:
    """The NVIDIA driver's version line when this machine has the driver loaded, else None."""
    path = os.environ.get(NVIDIA_DRIVER_FILE_ENV) or NVIDIA_DRIVER_FILE
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.readline().strip() or path
    except OSError:
        return None


def refuse_hidden_gpu(allow_cpu: bool) -> None:
    """Stop when the machine has an NVIDIA GPU that TensorFlow cannot see, unless `allow_cpu`."""
    if allow_cpu or tf.config.list_physical_devices("GPU"):
        return
    driver = nvidia_driver()
    if driver is None:
        return
    raise StrategyError(
        f"this machine has an NVIDIA GPU (driver: {driver}) but TensorFlow {tf.__version__} sees none, so "
        "training would run on the CPU. TensorFlow's CUDA libraries are missing: install the GPU build with "
        f"`{install_lines.GPU_INSTALL_LINE}` (tensorflow[and-cuda]) and check `nvidia-smi`; or pass "
        "--allow-cpu to train on the CPU on purpose"
    )


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


def resolve_strategy(
    name: str = AUTO, tpu: str | None = None, allow_cpu: bool = False
) -> tf.distribute.Strategy:
    """The strategy to build the model, optimizer and metrics in; the rules: docs/internals.md.

    `allow_cpu` lets a machine with an NVIDIA driver but no GPU visible to TensorFlow train on its CPU.
    """
    if name not in STRATEGIES:
        raise StrategyError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
    if name == TPU or (name == AUTO and tpu):
        target = tpu or _find_tpu()
        if target is None:
            raise StrategyError(
                "--strategy tpu: no TPU found (no --tpu flag, no $TPU_NAME, no TPU devices on this machine). "
                "Pass --tpu local (on a single-host TPU VM) or --tpu NAME (a multi-host slice, from its "
                "worker 0), or use --strategy auto"
            )
        return _connect_tpu(target)
    if name == AUTO:
        found = _find_tpu()
        if found is not None:
            try:
                return _connect_tpu(found)
            except StrategyError as exc:
                log.warning("TPU devices seem present but could not be used, continuing without: %s", exc)
        refuse_hidden_gpu(allow_cpu)
        if _tf_config_cluster():
            return tf.distribute.MultiWorkerMirroredStrategy()
        if len(tf.config.list_logical_devices("GPU")) > 1:
            return tf.distribute.MirroredStrategy()
        return tf.distribute.get_strategy()
    refuse_hidden_gpu(allow_cpu)
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


def _cluster_addresses(cluster_spec) -> list[str]:
    jobs = cluster_spec.as_dict() if cluster_spec is not None else {}
    return [address for job in ("chief", "worker") for address in jobs.get(job, [])]


def machine_of(address: str) -> str:
    """The machine part of a `host:port` address; every loopback name is the same machine."""
    host = (address.rpartition(":")[0] or address).strip("[]")
    return "localhost" if host in _LOCAL_HOSTS or host.startswith("127.") else host


def num_machines(strategy: tf.distribute.Strategy) -> int:
    """How many machines run this training, each with its own disk.

    A TPU slice has one VM per host; a multi-worker cluster has one machine
    per distinct host name in TF_CONFIG (workers on localhost share this one).
    """
    kind = strategy_kind(strategy)
    if kind == TPU:
        return int(strategy.extended.num_hosts)
    if kind == MULTIWORKER:
        addresses = _cluster_addresses(strategy.cluster_resolver.cluster_spec())
        return max(1, len({machine_of(address) for address in addresses}))
    return 1


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
