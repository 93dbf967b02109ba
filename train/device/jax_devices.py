"""The JAX backend's devices: keras.distribution.DataParallel over the devices of every process.

One process per host: every TPU chip of the host (or GPU, or, in tests, several host devices from
XLA_FLAGS=--xla_force_host_platform_device_count) is a replica. On several hosts every worker runs
the same `python -m train`, after keras.distribution.initialize() (jax.distributed: on a Cloud TPU
slice it finds the other workers itself; elsewhere KERAS_DISTRIBUTION_JOB_ADDRESSES,
KERAS_DISTRIBUTION_NUM_PROCESSES and KERAS_DISTRIBUTION_PROCESS_ID name them).

The input is the TensorFlow backend's own tf.data pipeline (train/data/dataset.py), one per process
over its own share of the files, batched to the process's part of the global batch; Keras assembles
the processes' batches into the global one (jax.make_array_from_process_local_data), so the dataset
is not sharded again (auto_shard_dataset=False). TensorFlow only reads files here, on the CPU
(train/console.py keeps it off the TPU and the GPUs).

Process 0 is the chief: it writes the checkpoints, logs and outputs; a collective over the
processes (WorkerAgreement, as under MultiWorkerMirroredStrategy) makes them stop for a signal at
the same step.
"""

import logging
import os
import subprocess
import sys
import tempfile

import jax
import keras
import numpy as np
import tensorflow as tf

from train.config import TrainConfig
from train.data import dataset
from train.device import accelerator
from train.device.devices import Devices
from train.device.strategy import LOCAL_TPU
from train.errors import ConfigError
from train.loop import checkpoints as checkpoints_lib
from train.loop import metrics

# keras.distribution.initialize() reads these (and jax.distributed those of a Cloud TPU slice).
CLUSTER_ENV = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES")

log = logging.getLogger(__name__)


def _platform_kind(platform: str) -> str:
    return {"tpu": accelerator.TPU, "gpu": accelerator.GPU, "cuda": accelerator.GPU}.get(
        platform, accelerator.CPU
    )


def initialize_processes(config: TrainConfig) -> None:
    """keras.distribution.initialize() when this run spans several processes (see the docstring)."""
    multi_host_slice = config.tpu is not None and config.tpu != LOCAL_TPU
    if not (multi_host_slice or any(os.environ.get(name) for name in CLUSTER_ENV)):
        return
    if jax.distributed.is_initialized():
        return
    keras.distribution.initialize()


class JaxDevices(Devices):
    """keras.distribution.DataParallel over every device of every process (set as Keras' distribution)."""

    backend = "jax"
    kind = accelerator.JAX_DATA_PARALLEL

    def __init__(self, devices: list | None = None):
        self.devices = list(devices or jax.devices())
        self.distribution = keras.distribution.DataParallel(devices=self.devices, auto_shard_dataset=False)
        keras.distribution.set_distribution(self.distribution)

    @classmethod
    def resolve(cls, config: TrainConfig) -> "JaxDevices":
        if config.strategy not in ("auto", "default"):
            raise ConfigError(
                f"--strategy {config.strategy} is a tf.distribute strategy; on --backend jax every device of every "
                "process is a replica (keras.distribution.DataParallel): leave --strategy auto"
            )
        if config.freeze_backbone_epochs:
            # Keras' JAX optimizer applies its update to every variable it was built with (stateless_apply),
            # so a backbone made untrainable mid-run cannot be left out of it.
            raise ConfigError(
                "--freeze-backbone-epochs is not supported on --backend jax yet (Keras' JAX optimizer updates "
                "every variable it was built for); train the head first with --backend tensorflow, or leave "
                "the flag out (the warmup protects the backbone)"
            )
        initialize_processes(config)
        return cls()

    def describe(self) -> accelerator.DeviceDescription:
        first = self.devices[0]
        kind = _platform_kind(first.platform)
        capability = None
        if kind == accelerator.GPU and getattr(first, "compute_capability", None):
            capability = tuple(int(part) for part in str(first.compute_capability).split(".")[:2])
        return accelerator.DeviceDescription(
            kind=kind, num_replicas=len(self.devices), strategy=self.kind, gpu_compute_capability=capability
        )

    @property
    def num_replicas(self) -> int:
        return len(self.devices)

    @property
    def num_processes(self) -> int:
        return jax.process_count()

    @property
    def process_index(self) -> int:
        return jax.process_index()

    def num_machines(self) -> int:
        return self.num_processes

    def worker_name(self) -> str | None:
        return None if self.process_index == 0 else f"process-{self.process_index}"

    def _input_context(self) -> tf.distribute.InputContext:
        # One pipeline per process, each yielding the process's part of the global batch.
        return tf.distribute.InputContext(
            num_input_pipelines=self.num_processes,
            input_pipeline_id=self.process_index,
            num_replicas_in_sync=self.num_processes,
        )

    def _process_batch(self, global_batch_size: int) -> int:
        if global_batch_size % self.num_processes:
            raise ConfigError(
                f"global batch {global_batch_size} does not divide among {self.num_processes} processes"
            )
        return global_batch_size // self.num_processes

    def train_input(self, data_dir: str, manifest: dict, global_batch_size: int, **kwargs):
        return dataset.make_train_dataset(
            data_dir,
            manifest,
            self._process_batch(global_batch_size),
            input_context=self._input_context(),
            **kwargs,
        )

    def eval_input(self, data_dir: str, manifest: dict, split: str, global_batch_size: int):
        batch = self._process_batch(global_batch_size)
        steps = dataset.eval_steps(manifest, split, batch, self.num_processes, self.num_processes)
        data = dataset.make_eval_dataset(
            data_dir, manifest, split, batch, input_context=self._input_context()
        )
        return data, steps

    def worker_agreement(self, every, start_step: int):
        if self.num_processes == 1:
            return checkpoints_lib.WorkerAgreement(None, every, start_step)
        from jax.experimental import multihost_utils  # noqa: PLC0415

        chief = self.process_index == 0

        def combine(values: list[float]) -> list[float]:
            # The flags of every process; the step time of the chief only (a sum with zeros is exact).
            mine = np.asarray(values[:-1] + [values[-1] if chief else 0.0], np.float32)
            gathered = np.asarray(multihost_utils.process_allgather(mine))
            log.debug("agreement: %s gathered as %s", values, gathered.tolist())
            return [float(total) for total in gathered.reshape(self.num_processes, -1).sum(axis=0)]

        return checkpoints_lib.WorkerAgreement(combine, every, start_step)

    def confusion_matrix(self, model: keras.Model, eval_data, steps: int, num_classes: int):
        counter = keras.Model(model.inputs, model.outputs, name=f"{model.name}_confusion")
        counter.compile(weighted_metrics=[metrics.ConfusionCounts(num_classes)], jit_compile=True)
        results = counter.evaluate(eval_data, steps=steps, return_dict=True, verbose=0)
        return np.rint(np.asarray(results["confusion_counts"], np.float64)).astype(np.int64)

    def export(
        self,
        model: keras.Model,
        manifest: dict,
        model_dir: str,
        lineage: dict,
        model_name: str,
        publish: bool,
    ) -> dict:
        """The same SavedModel and model.keras as the TensorFlow backend's, written by a TensorFlow process.

        (train/serving/handoff.py.) Every process saves the weights (Keras' saving runs a collective on
        several processes); the chief's TensorFlow process writes the export.
        """
        from train.serving import handoff  # noqa: PLC0415

        with tempfile.TemporaryDirectory(prefix="export-handoff-") as scratch:
            handoff.write_handoff(scratch, model, manifest, model_dir, lineage, model_name)
            if not publish:
                return {}
            command = [sys.executable, "-m", "train.serving.handoff", scratch]
            environment = {**os.environ, "KERAS_BACKEND": "tensorflow", "CUDA_VISIBLE_DEVICES": ""}
            finished = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
            if finished.returncode != 0:
                raise RuntimeError(
                    f"the serving export (a TensorFlow process: {' '.join(command)}) failed with status "
                    f"{finished.returncode}:\n{finished.stderr[-4000:]}"
                )
            return handoff.read_result(scratch)
