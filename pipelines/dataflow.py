"""The cloud workflow: stage 1 on Dataflow, then training on a Cloud TPU VM.

Run it on the TPU VM itself and it does everything, start to finish:

    python -m pipelines.dataflow --input gs://BUCKET/raw --workdir gs://BUCKET/run \\
        --project PROJECT --region us-central1 --tpu local \\
        --sdk_container_image REGION-docker.pkg.dev/PROJECT/REPOSITORY/tf-image-pipeline:TAG

(the worker image built from the repository's Dockerfile: see its header).

Run it anywhere else (a laptop, Cloud Shell) with the TPU's name and it
runs stage 1 on Dataflow, checks the dataset, stages this package next to
it, and prints (and writes to WORKDIR/jobs/train_tpu_vm.json) the exact
commands that create the TPU and train there:

    python -m pipelines.dataflow --input gs://BUCKET/raw --workdir gs://BUCKET/run \\
        --project PROJECT --region us-central1 --tpu my-tpu --zone us-central1-a \\
        --accelerator-type v4-32

Single-host TPUs (up to 8 chips: v5litepod-8, v4-8, ...) run one command on
the VM: install, then `python3 -m train --tpu local`. Multi-host slices
(v4-32, v5litepod-16, ...) run TensorFlow the way TPUStrategy works there,
single-client: the software is installed on every worker
(`gcloud compute tpus tpu-vm ssh NAME --worker=all`), the slice is created
with a TensorFlow *pod* runtime (each worker runs TensorFlow's TPU server),
and training is launched on worker 0 with `--tpu NAME`, from where one
process drives every host's TPU chips and every host's input pipeline (each
host reads its own shards). Running `python -m train` on every worker would
start one coordinator per worker, each re-initializing the whole slice.

`--dry-run` builds both job descriptions and submits nothing: the Dataflow
job as a template file (`--template_location`, which stages the package
built from setup.py but does not start a job) and the training job spec,
both written under `--dry-run-dir` (default ./dry-run).

Why a TPU VM and not a Vertex AI custom job: on a TPU VM our code runs on
the TPU host itself, where the input pipeline this project optimizes runs,
with plain `pip install` of the package and no container image to build and
keep in step with TensorFlow's TPU runtime; the same `python -m train`
command is what one debugs with over ssh. Flags this module does not know
(--machine_type, --max_num_workers, --disk_size_gb, --service_account_email,
--network, ...) go to Dataflow untouched.
"""

import argparse
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import tempfile

from dataset_contract import features
from dataset_contract import manifest as manifest_lib
from pipelines.workflow import WorkflowError, WorkflowPaths, run_stage1, run_workflow
from preprocess.worker_image import LauncherPythonError, check_launcher_python

log = logging.getLogger(__name__)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP_FILE = os.path.join(REPO_ROOT, "setup.py")
TEMPLATE_FILE = "dataflow_template.json"
TRAINING_SPEC_FILE = "train_tpu_vm.json"
DEFAULT_ACCELERATOR = "v5litepod-8"
DEFAULT_RUNTIME = "v2-alpha-tpuv5-lite"
# Multi-host slices need a runtime whose workers run TensorFlow's TPU server for the
# coordinator on worker 0 to connect to: a TensorFlow pod runtime of the pinned version.
DEFAULT_POD_RUNTIME = "tpu-vm-tf-2.21.0-pod-pjrt"
TENSORFLOW_TPU_REQUIREMENT = "tensorflow-tpu==2.21.0"
LIBTPU_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.dataflow",
        description="Preprocess on Dataflow, then train on a Cloud TPU VM. Unknown flags go to Dataflow.",
    )
    parser.add_argument("--input", required=True, help="gs:// image tree or CSV/JSONL manifest.")
    parser.add_argument("--workdir", required=True, help="gs:// directory for the dataset, model, staging.")
    parser.add_argument("--project", required=True)
    parser.add_argument("--region", required=True, help="Dataflow region, e.g. us-central1.")
    parser.add_argument(
        "--tpu",
        default="local",
        help="'local' when running on the TPU VM (trains here after stage 1); otherwise the TPU VM's name, "
        "for which the training commands are printed.",
    )
    parser.add_argument("--zone", help="TPU VM zone (default: REGION-a).")
    parser.add_argument("--accelerator-type", default=DEFAULT_ACCELERATOR, help="TPU type for a new TPU VM.")
    parser.add_argument(
        "--runtime-version",
        default=None,
        help=f"TPU VM software version (default: {DEFAULT_RUNTIME}; for a multi-host slice {DEFAULT_POD_RUNTIME}, "
        "a TensorFlow pod runtime).",
    )
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--encoding", choices=features.ENCODINGS, default=features.UINT8)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--global-batch-size", type=int, default=1024)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--skip-preprocess", action="store_true", help="Reuse WORKDIR/dataset.")
    parser.add_argument("--dry-run", action="store_true", help="Write both job descriptions; submit nothing.")
    parser.add_argument("--dry-run-dir", default="dry-run", help="Local directory for --dry-run output.")
    parser.add_argument(
        "--sdk_container_image",
        help="The Dataflow worker image built from this repository's Dockerfile (recommended; see its header "
        "for the build). Workers then start with everything installed. Without it, every worker pip-installs "
        "TensorFlow and tf.Transform from --setup-file at boot: minutes per worker, and it needs internet "
        "access from the workers.",
    )
    parser.add_argument(
        "--setup-file",
        default=SETUP_FILE,
        help="The setup.py Dataflow workers install at boot when no --sdk_container_image is given.",
    )
    return parser


def preprocess_argv(args, paths: WorkflowPaths, dataflow_args: list[str]) -> list[str]:
    workdir = args.workdir.rstrip("/")
    argv = [
        "--input",
        args.input,
        "--output",
        paths.dataset_dir,
        "--image-size",
        str(args.image_size),
        "--encoding",
        args.encoding,
        "--runner",
        "DataflowRunner",
        "--project",
        args.project,
        "--region",
        args.region,
        "--temp_location",
        manifest_lib.join(workdir, "tmp"),
        "--staging_location",
        manifest_lib.join(workdir, "staging"),
        *worker_setup_argv(args),
        *dataflow_args,
    ]
    if args.dry_run:
        argv += ["--template_location", os.path.abspath(os.path.join(args.dry_run_dir, TEMPLATE_FILE))]
    return argv


def worker_setup_argv(args) -> list[str]:
    """How Dataflow workers get this package: the prebuilt container, else setup.py at boot."""
    if args.sdk_container_image:
        # The package is in the image already; a --setup_file as well would
        # make every worker build and pip-install it again at boot.
        return ["--sdk_container_image", args.sdk_container_image]
    log.warning(
        "no --sdk_container_image: every Dataflow worker will pip-install TensorFlow and tf.Transform at boot "
        "(minutes per worker; fails where workers have no internet access). See Dockerfile for the image."
    )
    return ["--setup_file", args.setup_file]


def _parse_tpu_type(accelerator_type: str) -> tuple[int, str]:
    match = re.fullmatch(r"v(\d+)(litepod|e|p)?-(\d+)", accelerator_type.strip().lower())
    if not match:
        raise ValueError(
            f"--accelerator-type {accelerator_type!r}: expected a TPU type such as v5litepod-8, v4-32, v5p-16, v6e-8"
        )
    return int(match.group(3)), match.group(2) or ""


def tpu_chips(accelerator_type: str) -> int:
    """The chips of a TPU type: v5litepod-16 -> 16; v4-32 -> 16 (v2, v3, v4 and v5p count TensorCores, 2 a chip)."""
    number, variant = _parse_tpu_type(accelerator_type)
    return number if variant in ("litepod", "e") else max(1, number // 2)


def is_multi_host(accelerator_type: str) -> bool:
    """Whether a slice of this type spans several TPU VMs: more chips than one VM holds
    (8 for v5e and v6e, 4 for v2, v3, v4 and v5p)."""
    _, variant = _parse_tpu_type(accelerator_type)
    chips_per_vm = 8 if variant in ("litepod", "e") else 4
    return tpu_chips(accelerator_type) > chips_per_vm


def train_argv(args, paths: WorkflowPaths, tpu: str = "local") -> list[str]:
    """`python -m train`'s arguments: `tpu` is `local` on a single-host VM, the TPU's name for a slice."""
    return [
        "--data",
        paths.dataset_dir,
        "--model-dir",
        paths.model_dir,
        "--model",
        args.model,
        "--epochs",
        str(args.epochs),
        "--global-batch-size",
        str(args.global_batch_size),
        "--learning-rate",
        str(args.learning_rate),
        "--strategy",
        "tpu",
        "--tpu",
        tpu,
    ]


def package_uri(args) -> str:
    return manifest_lib.join(args.workdir.rstrip("/"), "packages", "tf-image-pipeline.tar.gz")


def _ssh(name: str, location: list[str], worker: str, command: str) -> str:
    return shlex.join(
        [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "ssh",
            name,
            *location,
            f"--worker={worker}",
            "--command",
            command,
        ]
    )


def training_job_spec(args, paths: WorkflowPaths) -> dict:
    """What runs stage 2 on a TPU: the machine, the paths, and the exact commands (see the module docstring)."""
    zone = args.zone or f"{args.region}-a"
    name = args.tpu if args.tpu != "local" else "THIS-TPU-VM"
    multi_host = is_multi_host(args.accelerator_type)
    runtime = args.runtime_version or (DEFAULT_POD_RUNTIME if multi_host else DEFAULT_RUNTIME)
    location = ["--zone", zone, "--project", args.project]
    setup = (
        f"gcloud storage cp {package_uri(args)} /tmp/pkg.tar.gz && "
        f"pip install /tmp/pkg.tar.gz {TENSORFLOW_TPU_REQUIREMENT} -f {LIBTPU_INDEX}"
    )
    tpu_target = name if multi_host else "local"
    arguments = train_argv(args, paths, tpu_target)
    train = shlex.join(["python3", "-m", "train", *arguments])
    create = shlex.join(
        [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "create",
            name,
            *location,
            "--accelerator-type",
            args.accelerator_type,
            "--version",
            runtime,
        ]
    )
    if multi_host:
        # The same software on every worker; one coordinator, on worker 0, drives the whole slice.
        commands = [create, _ssh(name, location, "all", setup), _ssh(name, location, "0", train)]
    else:
        commands = [create, _ssh(name, location, "all", f"{setup} && {train}")]
    return {
        "kind": "cloud-tpu-vm",
        "tpu": {
            "name": name,
            "zone": zone,
            "project": args.project,
            "accelerator_type": args.accelerator_type,
            "runtime_version": runtime,
            "multi_host": multi_host,
        },
        "package": package_uri(args),
        "data_dir": paths.dataset_dir,
        "model_dir": paths.model_dir,
        "train_args": arguments,
        "commands": commands,
    }


def build_package(destination_uri: str) -> None:
    """Build this project's sdist from setup.py and copy it to `destination_uri`."""
    with tempfile.TemporaryDirectory() as build_dir:
        subprocess.run(
            [sys.executable, SETUP_FILE, "-q", "sdist", "--dist-dir", build_dir],
            cwd=REPO_ROOT,
            check=True,
        )
        (built,) = os.listdir(build_dir)
        with (
            open(os.path.join(build_dir, built), "rb") as source,
            _filesystems().create(destination_uri) as target,
        ):
            target.write(source.read())


def _filesystems():
    """Beam's FileSystems, imported when a file is written: --help answers without importing Beam."""
    from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415

    return FileSystems


def write_json(path: str, content: dict) -> None:
    with _filesystems().create(path) as handle:
        handle.write(json.dumps(content, indent=2).encode("utf-8"))


def train_on_this_tpu_vm(args, paths: WorkflowPaths):
    from train.__main__ import build_parser as train_parser
    from train.__main__ import config_from_args
    from train.trainer import train_and_evaluate

    return train_and_evaluate(config_from_args(train_parser().parse_args(train_argv(args, paths))))


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args, dataflow_args = build_parser().parse_known_args(argv)
    if args.sdk_container_image:
        try:
            check_launcher_python(["--sdk_container_image", args.sdk_container_image])
        except LauncherPythonError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if not args.workdir.startswith("gs://") or not args.input.startswith("gs://"):
        print(
            "error: --input and --workdir must be gs:// URIs: Dataflow workers and TPU VMs read from GCS",
            file=sys.stderr,
        )
        return 2
    paths = WorkflowPaths(args.workdir)
    try:
        spec = training_job_spec(args, paths)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stage1_argv = None if args.skip_preprocess else preprocess_argv(args, paths, dataflow_args)

    if args.dry_run:
        os.makedirs(args.dry_run_dir, exist_ok=True)
        if stage1_argv is not None:
            run_stage1(stage1_argv)  # with --template_location: builds the job description, starts nothing
        spec_path = os.path.join(args.dry_run_dir, TRAINING_SPEC_FILE)
        with open(spec_path, "w") as handle:
            json.dump(spec, handle, indent=2)
        print(
            f"Dry run: Dataflow template {os.path.join(args.dry_run_dir, TEMPLATE_FILE)}, training job {spec_path}"
        )
        return 0

    def launch_training(manifest):
        if args.tpu == "local":
            return train_on_this_tpu_vm(args, paths)
        build_package(package_uri(args))
        spec_uri = manifest_lib.join(args.workdir.rstrip("/"), "jobs", TRAINING_SPEC_FILE)
        write_json(spec_uri, spec)
        where = (
            "the TPU slice (software on every worker, training from worker 0)"
            if spec["tpu"]["multi_host"]
            else "the TPU VM"
        )
        print(f"Dataset ready. Train on {where} (spec: {spec_uri}):")
        for command in spec["commands"]:
            print(f"  {command}")
        return None

    try:
        run_workflow(
            dataset_dir=paths.dataset_dir, preprocess_argv=stage1_argv, launch_training=launch_training
        )
    except WorkflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
