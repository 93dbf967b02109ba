"""`python -m pipelines.dataflow --dry-run`, offline: both job descriptions, nothing submitted.

Dataflow itself cannot be reached from here. `--template_location` makes the
DataflowRunner build the complete job description (the pipeline graph, our
pipeline options, and the package built from setup.py staged to
--staging_location) and write it to a file instead of submitting it. Staging
needs a gs:// location, so it goes to the GCS emulator (tests/conftest.py).
"""

import contextlib
import io
import json
import shlex
import tarfile

import pytest
from apache_beam.portability.api import beam_runner_api_pb2

from pipelines import dataflow
from pipelines.tpu import launch as tpu_launch
from pipelines.tpu import runtime as tpu_runtime
from train import install_lines

pytestmark = pytest.mark.slow


WORKER_IMAGE = "europe-west4-docker.pkg.dev/test-project-123/images/tf-image-pipeline:abc123"


# The ImageNet recipe's flags, which the written training command must carry.
RECIPE_ARGS = ("--optimizer", "sgd", "--warmup-epochs", "5", "--label-smoothing", "0.1", "--ema", "--augment")


def _run_dry_run(gcs_emulator, out, workdir, extra_args=()):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = dataflow.main(
            [
                "--input",
                gcs_emulator.url("raw"),
                "--workdir",
                workdir,
                "--project",
                "test-project-123",
                "--region",
                "europe-west4",
                "--zone",
                "europe-west4-a",
                "--tpu",
                "my-tpu",
                "--accelerator-type",
                "v5litepod-8",
                "--image-size",
                "160",
                "--encoding",
                "uint8",
                "--dry-run",
                "--dry-run-dir",
                str(out),
                "--max_num_workers",
                "17",
                "--machine_type",
                "n2-standard-8",
                *RECIPE_ARGS,
                *extra_args,
            ]
        )
    assert code == 0
    with open(out / dataflow.TEMPLATE_FILE) as handle:
        template = json.load(handle)
    with open(out / dataflow.TRAINING_SPEC_FILE) as handle:
        spec = json.load(handle)
    return template, spec, workdir, printed.getvalue()


@pytest.fixture(scope="module")
def dry_run(gcs_emulator, tmp_path_factory):
    """The job as launched without a worker image: workers install setup.py at boot."""
    return _run_dry_run(gcs_emulator, tmp_path_factory.mktemp("dry-run"), gcs_emulator.url("dry-run-workdir"))


@pytest.fixture(scope="module")
def container_dry_run(gcs_emulator, tmp_path_factory):
    """The job as launched with the worker image built from the Dockerfile."""
    return _run_dry_run(
        gcs_emulator,
        tmp_path_factory.mktemp("dry-run-container"),
        gcs_emulator.url("dry-run-container-workdir"),
        ["--sdk_container_image", WORKER_IMAGE],
    )


def _pipeline_options(template):
    return template["environment"]["sdkPipelineOptions"]["options"]


def test_dataflow_template_carries_our_options_and_the_runner_flags(dry_run, gcs_emulator):
    template, _, workdir, _ = dry_run
    options = _pipeline_options(template)
    assert options["project"] == "test-project-123"
    assert options["region"] == "europe-west4"
    assert options["max_num_workers"] == 17
    assert options["machine_type"] == "n2-standard-8"
    assert options["setup_file"] == dataflow.SETUP_FILE
    assert options["staging_location"].startswith(f"{workdir}/staging")
    # Runner v2 keeps the graph in the staged pipeline proto the template points to.
    pipeline_url = options["pipelineUrl"]
    pipeline = beam_runner_api_pb2.Pipeline.FromString(
        gcs_emulator.read_object(pipeline_url.removeprefix(f"gs://{gcs_emulator.bucket}/"))
    )
    steps = {transform.unique_name for transform in pipeline.components.transforms.values()}
    for label in (
        "RunId",  # the run id is made when the job runs: every launch of the template gets its own
        "ListInputs",
        "Deduplicate",
        "Decode",
        "AnalyzeTrain",
        "WriteShards",  # one for all splits
        "WriteManifest",
    ):
        assert label in steps


def test_the_staged_package_contains_the_job_code(dry_run, gcs_emulator):
    _, _, workdir, _ = dry_run
    prefix = workdir.removeprefix(f"gs://{gcs_emulator.bucket}/") + "/staging/"
    staged = [name for name in gcs_emulator.list_objects(prefix) if name.endswith("workflow.tar.gz")]
    assert len(staged) == 1
    with tarfile.open(fileobj=io.BytesIO(gcs_emulator.read_object(staged[0]))) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for module in (
        "preprocess/pipeline.py",
        "preprocess/decode/image.py",
        "dataset_contract/manifest.py",
        "setup.py",
    ):
        assert module in names


def test_training_job_spec_names_the_tpu_the_dataset_the_model_and_the_tables_runtime(dry_run):
    _, spec, workdir, _ = dry_run
    choice = tpu_runtime.choose_runtime("v5litepod-8")
    assert spec["tpu"] == {
        "name": "my-tpu",
        "zone": "europe-west4-a",
        "project": "test-project-123",
        "accelerator_type": "v5litepod-8",
        "runtime_version": choice.runtime_version,
        "multi_host": False,  # v5litepod-8: one VM
    }
    assert choice.runtime_version == "v2-alpha-tpuv5-lite" and spec["runtime"] == choice.describe()
    assert spec["data_dir"] == f"{workdir}/dataset"
    assert spec["model_dir"] == f"{workdir}/model"
    args = spec["train_args"]
    assert args[args.index("--data") + 1] == spec["data_dir"]
    assert args[args.index("--strategy") + 1] == "tpu"
    create, train = spec["commands"]
    assert "--worker=all" in train and args[args.index("--tpu") + 1] == "local"
    assert "tpu-vm create my-tpu" in create and "--accelerator-type v5litepod-8" in create
    assert f"--version {choice.runtime_version}" in create
    assert spec["package"] in train


def test_the_written_training_command_runs_the_recipe_under_the_supervisor(dry_run):
    _, spec, _, _ = dry_run
    _, run = (shlex.split(command) for command in spec["commands"])
    command = run[run.index("--command") + 1]
    assert "setsid nohup python3 -m train.tools.supervisor" in command and tpu_launch.LOG_FILE in command
    train_argv = shlex.split(command[command.index("python3 -m train ") : command.index(" >")])[3:]
    assert train_argv == spec["train_args"]
    assert train_argv[train_argv.index("--optimizer") + 1] == "sgd"
    assert float(train_argv[train_argv.index("--warmup-epochs") + 1]) == 5
    assert float(train_argv[train_argv.index("--label-smoothing") + 1]) == 0.1
    assert "--ema" in train_argv and "--augment" in train_argv
    # 128 images per chip of a v5litepod-8, and no learning rate: the recipe scales it with the batch.
    assert train_argv[train_argv.index("--global-batch-size") + 1] == "1024"
    assert "--learning-rate" not in train_argv


def test_the_dry_run_prints_the_chosen_runtime_and_why(dry_run):
    _, spec, _, printed = dry_run
    assert f"TPU runtime: {spec['runtime']}" in printed
    assert "v2-alpha-tpuv5-lite" in printed and "installed on top" in printed


def test_dry_run_writes_nothing_to_the_dataset_or_model_dirs(dry_run, gcs_emulator):
    _, _, workdir, _ = dry_run
    prefix = workdir.removeprefix(f"gs://{gcs_emulator.bucket}/")
    written = [name for name in gcs_emulator.list_objects(prefix) if not name.endswith("/")]
    assert all("/staging/" in name for name in written), written


def test_with_a_worker_image_the_job_runs_in_it_and_installs_nothing_at_boot(container_dry_run):
    template, _, _, _ = container_dry_run
    (pool,) = template["environment"]["workerPools"]
    assert [image["containerImage"] for image in pool["sdkHarnessContainerImages"]] == [WORKER_IMAGE]
    assert "setup_file" not in _pipeline_options(template)
    # Without a setup file the staged packages are only Beam's own bookkeeping:
    # no sdist that each worker would build and pip-install at boot.
    staged = {package["name"] for package in pool["packages"]}
    assert not any(name.endswith((".tar.gz", ".whl")) for name in staged), staged


def test_without_a_worker_image_workers_install_the_package_from_setup_py(dry_run):
    template, _, _, _ = dry_run
    (pool,) = template["environment"]["workerPools"]
    assert {package["name"] for package in pool["packages"]} >= {"workflow.tar.gz", "requirements.txt"}
    options = _pipeline_options(template)
    assert options["setup_file"] == dataflow.SETUP_FILE
    # setup.py's install_requires hold no TensorFlow: stage 1's comes from the staged requirements.
    with open(options["requirements_file"]) as staged:
        assert tuple(staged.read().split()) == install_lines.STAGE1_REQUIREMENTS
    assert options["requirements_cache"] == "skip"
