"""The TPU launch commands pipelines.dataflow prints and writes, for single-host VMs and multi-host slices."""

import shlex

import pytest

from pipelines import dataflow
from pipelines.workflow import WorkflowPaths


def spec_for(accelerator_type, *extra):
    args = dataflow.build_parser().parse_args(
        ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "us-central2",
         "--tpu", "my-tpu", "--zone", "us-central2-b", "--accelerator-type", accelerator_type, *extra]
    )  # fmt: skip
    return dataflow.training_job_spec(args, WorkflowPaths(args.workdir))


def flag(argv, name):
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize(
    "accelerator_type,multi_host",
    [("v5litepod-8", False), ("v4-8", False), ("v5p-8", False), ("v6e-8", False), ("v5litepod-16", True),
     ("v4-16", True), ("v4-32", True), ("v3-32", True), ("v6e-64", True)],
)  # fmt: skip
def test_slices_larger_than_one_vm_are_multi_host(accelerator_type, multi_host):
    assert dataflow.is_multi_host(accelerator_type) is multi_host


def test_a_multi_host_slice_installs_on_every_worker_and_trains_from_worker_0_with_the_tpu_name():
    spec = spec_for("v4-32")
    create, install, train = (shlex.split(command) for command in spec["commands"])
    assert spec["tpu"]["multi_host"] is True
    assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "my-tpu"]
    assert flag(create, "--version") == dataflow.DEFAULT_POD_RUNTIME  # workers run TensorFlow's TPU server
    assert install[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-tpu"]
    assert "--worker=all" in install and flag(install, "--zone") == "us-central2-b"
    assert "pip install" in flag(install, "--command") and "python3 -m train" not in flag(
        install, "--command"
    )
    assert "--worker=0" in train
    train_argv = shlex.split(flag(train, "--command"))
    assert train_argv[:3] == ["python3", "-m", "train"]
    # The resolver must see the whole slice: the TPU's name, not `local`.
    assert flag(train_argv, "--tpu") == "my-tpu" and flag(train_argv, "--strategy") == "tpu"
    assert flag(train_argv, "--data") == "gs://b/run/dataset" and flag(train_argv, "--model-dir").startswith(
        "gs://"
    )
    assert spec["train_args"] == train_argv[3:]


def test_a_single_host_vm_installs_and_trains_in_one_command_with_the_local_tpu():
    spec = spec_for("v5litepod-8")
    create, run = (shlex.split(command) for command in spec["commands"])
    assert spec["tpu"]["multi_host"] is False and flag(create, "--version") == dataflow.DEFAULT_RUNTIME
    assert "--worker=all" in run
    command = flag(run, "--command")
    assert "pip install" in command and "python3 -m train" in command
    assert flag(spec["train_args"], "--tpu") == "local"


def test_an_explicit_runtime_version_wins_and_an_unknown_type_is_refused():
    assert spec_for("v4-32", "--runtime-version", "tpu-vm-tf-2.21.0-pod-custom")["tpu"][
        "runtime_version"
    ] == ("tpu-vm-tf-2.21.0-pod-custom")
    with pytest.raises(ValueError, match="expected a TPU type"):
        spec_for("tpu-large")
