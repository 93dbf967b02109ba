"""The cloud workflow: stage 1 on Dataflow, then training on a Cloud TPU VM.

    python -m pipelines.dataflow --input gs://BUCKET/raw --workdir gs://BUCKET/run \\
        --project PROJECT --region us-central1 --tpu local --accelerator-type v5litepod-8 \\
        --sdk_container_image REGION-docker.pkg.dev/PROJECT/REPOSITORY/tf-image-pipeline:TAG

How it works: docs/internals.md; the user's guide: docs/cloud.md.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile

from dataset_contract import log_format
from dataset_contract import manifest as manifest_lib
from dataset_contract.cli_help import CommandParser, group_flags
from pipelines.tpu import interpreter as tpu_interpreter
from pipelines.tpu import launch as tpu_launch
from pipelines.tpu import lifecycle as tpu_lifecycle
from pipelines.tpu import runtime as tpu_runtime
from pipelines.workflow import WorkflowError, WorkflowPaths, run_stage1, run_workflow, skip_preprocess_problem
from preprocess import options
from preprocess.launch.worker_image import LauncherPythonError, check_launcher_python
from train import flags as train_flags
from train import install_lines
from train.config import JAX, MODELS, RECIPE, RESNET50, SMALL_CNN, TENSORFLOW, resolve_backend
from train.errors import SetupError

log = logging.getLogger(__name__)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP_FILE = os.path.join(REPO_ROOT, "setup.py")
TEMPLATE_FILE = "dataflow_template.json"
TRAINING_SPEC_FILE = "train_tpu_vm.json"
DEFAULT_ACCELERATOR = "v5litepod-8"
# Without --global-batch-size: 128 images per chip (Google's TPU harness gives ResNet-50 128 per unit of the
# accelerator type's count: per chip on v5e). The learning rate follows the batch (train/model/recipe.py): none is set here.
BATCH_PER_CHIP = 128
# Without --crop-margin: store 256 squares for 224 crops (crop fraction 0.875), the resize-then-crop of the
# ImageNet recipes the keras.applications backbones were trained with; the small CNN takes the center crop.
IMAGENET_CROP_MARGIN = 0.143
# The fields of python -m train this command takes as flags, besides the training recipe's.
STAGE2_FIELDS = (
    "model",
    "backend",
    "epochs",
    "global_batch_size",
    "learning_rate",
    "augment",
    "checkpoint_every",
)
# Those handed on to python -m train as given (train_argv sets the model, epochs and batch itself).
FORWARDED_FIELDS = ("augment", "learning_rate", "checkpoint_every", *train_flags.names_in(RECIPE))


def build_parser() -> CommandParser:
    parser = CommandParser(
        prog="python -m pipelines.dataflow",
        description="Preprocess on Dataflow, then train on a Cloud TPU VM. Unknown flags go to Dataflow.",
        epilog="The TPU VM's runtime comes from the accelerator type and tensorflow-tpu "
        f"{tpu_runtime.TENSORFLOW_TPU_VERSION} (table: pipelines/tpu/runtime.py). Training starts detached from "
        "ssh under `python3 -m train.tools.supervisor`, which restarts it after an interruption (exit 143, a slice "
        "peer's preemption) and stops after success or a setup error (exit 2); log: ~/tf-image-pipeline/train.log. "
        "Single host: one command installs and launches on the VM; a multi-host slice: install and TPU servers on "
        "every worker, training on worker 0 with --tpu NAME once every worker's TPU server answers (--backend jax: "
        "jax[tpu] in a uv-managed Python 3.11, installed and training on every worker). --spot: a TPU "
        "Spot VM, recreated after a preemption by `python -m pipelines.tpu.restart --spec SPEC`; a boot script "
        "resumes training after a reboot. What an event can lose is bounded by --checkpoint-every, except "
        "maintenance on a single-host VM with Autocheckpoint (pipelines/tpu/lifecycle.py). "
        "The defaults here (resnet50, 224 px, 30 epochs, 128 images per chip) are a TPU fine-tuning run's; "
        "python -m train's (small_cnn, 10 epochs, a per-device batch) are a first run on one machine's.",
    )
    parser.add_argument(
        "--input", help="gs:// image tree or CSV/JSONL manifest (required unless --skip-preprocess)."
    )
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
    parser.add_argument(
        "--accelerator-type",
        default=DEFAULT_ACCELERATOR,
        help="TPU type: v4-8, v4-32, v5litepod-8, v5litepod-16, v5p-8, v6e-8, v6e-16, ... (default %(default)s). "
        "It chooses the runtime, single host or slice, and the default batch.",
    )
    parser.add_argument(
        "--runtime-version",
        default=None,
        help="TPU VM software version. Default: from the table in pipelines/tpu/runtime.py for the accelerator "
        f"type and tensorflow-tpu {tpu_runtime.TENSORFLOW_TPU_VERSION} (--dry-run prints the choice and why).",
    )
    # python -m preprocess's own flags (preprocess/config.py), with this workflow's defaults where they differ.
    options.add_stage1_flags(
        parser,
        ("image_size", "crop_margin", "encoding"),
        overrides={
            "image_size": {"help": "The square the model sees (default 224)."},
            "crop_margin": {
                "default": None,
                "help": "Stage 1 stores round(SIZE x (1 + F)) squares so that training takes random SIZE crops "
                f"(evaluation and serving the center). Default: {IMAGENET_CROP_MARGIN} for the ImageNet backbones "
                "(256 stored for 224), 0 for small_cnn.",
            },
        },
    )
    # python -m train's own flags (train/config.py), with a TPU fine-tuning run's defaults where they differ.
    train_flags.add_config_flags(
        parser,
        STAGE2_FIELDS,
        group="stage 2 (python -m train)",
        overrides={
            # The built-in models only: the TPU VM installs this package, not a module of yours.
            "model": {
                "default": RESNET50,
                "type": None,
                "choices": MODELS,
                "metavar": None,
                "help": "The classifier.",
            },
            "backend": {
                "help": f"Keras' backend on the TPU VM. {TENSORFLOW}: tensorflow-tpu "
                f"{tpu_runtime.TENSORFLOW_TPU_VERSION} on the image's Python 3.10, TPUStrategy (a slice is driven "
                f"from worker 0). {JAX}: jax[tpu] {install_lines.JAX_VERSION} in a uv-managed Python "
                f"{install_lines.JAX_PYTHON} (~/{tpu_launch.JAX_VENV}), keras.distribution.DataParallel, the trainer "
                "on every worker of a slice. Default: $KERAS_BACKEND, else tensorflow.",
            },
            "epochs": {"default": 30},
            "global_batch_size": {
                "help": f"Default: {BATCH_PER_CHIP} per chip of the accelerator type (1024 on v5litepod-8, 2048 "
                "on v4-32)."
            },
            "checkpoint_every": {
                "default": None,
                "help": "python -m train's interval checkpoint (default there: 10m). On a multi-host slice it bounds "
                "what a preemption loses: only worker 0's process sees SIGTERM.",
            },
        },
    )
    train_flags.add_config_flags(parser, train_flags.names_in(RECIPE))
    tpu_lifecycle.add_lifecycle_flags(parser)  # --spot, --autocheckpoint
    parser.add_argument(
        "--skip-preprocess",
        action="store_true",
        help="Reuse WORKDIR/dataset as it is. Without it, stage 1 is skipped all the same when WORKDIR/dataset "
        "was built from these inputs with these stage 1 flags: the same command run again goes on to training.",
    )
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
    group_flags(
        parser,
        {
            "where": ("--input", "--workdir", "--project", "--region", "--skip-preprocess", "--dry-run", "--dry-run-dir"),
            "stage 1 on Dataflow": ("--image-size", "--crop-margin", "--encoding", "--sdk_container_image", "--setup-file"),
            "the TPU VM": ("--tpu", "--zone", "--accelerator-type", "--runtime-version"),
        },
    )  # fmt: skip
    return parser


def _argv(flags: dict) -> list[str]:
    """{"--flag": value} -> ["--flag", "value", ...]."""
    return [word for flag, value in flags.items() for word in (flag, str(value))]


def preprocess_argv(args, paths: WorkflowPaths, dataflow_args: list[str]) -> list[str]:
    workdir = args.workdir.rstrip("/")
    argv = _argv(
        {
            "--input": args.input,
            "--output": paths.dataset_dir,
            "--image-size": args.image_size,
            "--crop-margin": crop_margin(args),
            "--encoding": args.encoding,
            "--runner": "DataflowRunner",
            "--project": args.project,
            "--region": args.region,
            "--temp_location": manifest_lib.join(workdir, "tmp"),
            "--staging_location": manifest_lib.join(workdir, "staging"),
        }
    )
    argv += [*worker_setup_argv(args), *dataflow_args]
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
    # Dataflow installs the --setup_file package without extras, and setup.py's
    # install_requires hold no TensorFlow (train/install_lines.py says why): the
    # workers get stage 1's TensorFlow and tf.Transform from a requirements file.
    # "skip": the launcher downloads nothing; each worker installs from the index.
    requirements = os.path.join(tempfile.mkdtemp(prefix="stage1-workers-"), "requirements.txt")
    with open(requirements, "w") as out:
        out.write("".join(f"{requirement}\n" for requirement in install_lines.STAGE1_REQUIREMENTS))
    return _argv(
        {"--setup_file": args.setup_file, "--requirements_file": requirements, "--requirements_cache": "skip"}
    )


def crop_margin(args) -> float:
    """--crop-margin, or the default for the model: random 224 crops of 256 squares for the ImageNet backbones."""
    if args.crop_margin is not None:
        return args.crop_margin
    return 0.0 if args.model == SMALL_CNN else IMAGENET_CROP_MARGIN


def train_argv(
    args, paths: WorkflowPaths, choice: tpu_runtime.RuntimeChoice, tpu: str = "local"
) -> list[str]:
    """`python -m train`'s arguments: `tpu` is `local` on a single-host VM, the TPU's name for a slice."""
    argv = _argv(
        {
            "--data": paths.dataset_dir,
            "--model-dir": paths.model_dir,
            "--model": args.model,
            "--epochs": args.epochs,
            # Without --global-batch-size, python -m train's default for the TPU, shown in the commands.
            "--global-batch-size": args.global_batch_size
            or tpu_launch.default_global_batch_size(args.model, args.image_size, choice.tpu),
            "--backend": args.backend,
            # TensorFlow: TPUStrategy (over the slice, from worker 0, for a TPU's name); JAX: the host's chips
            # (every worker, keras.distribution.initialize() for a TPU's name).
            **({"--strategy": "tpu"} if args.backend == TENSORFLOW else {}),
            "--tpu": tpu,
        }
    )
    return argv + train_flags.train_argv(train_flags.config_fields(args, FORWARDED_FIELDS))


def package_uri(args) -> str:
    return manifest_lib.join(args.workdir.rstrip("/"), "packages", "tf-image-pipeline.tar.gz")


def backend_problem(args) -> str | None:
    """What the flags ask that `--backend` cannot do, in words; None when they agree (checked before any cloud call)."""
    if args.backend == JAX and args.freeze_backbone_epochs:
        return (
            "--freeze-backbone-epochs is not supported with --backend jax (Keras' JAX optimizer updates every "
            "variable it was built for): drop it (the warmup protects the backbone), or train with --backend "
            "tensorflow"
        )
    return None


def training_job_spec(args, paths: WorkflowPaths) -> dict:
    """What runs stage 2 on a TPU: the machine, its runtime, the paths, the exact commands (module docstring)."""
    zone = args.zone or f"{args.region}-a"
    name = args.tpu if args.tpu != "local" else "THIS-TPU-VM"
    args.backend = resolve_backend(args.backend)
    choice = tpu_runtime.choose_runtime(
        args.accelerator_type, override=args.runtime_version, backend=args.backend
    )
    multi_host = choice.tpu.multi_host
    if args.tpu == "local" and multi_host:
        raise ValueError(
            f"--tpu local trains on this VM alone, but {args.accelerator_type} is a multi-host slice: run this "
            "command elsewhere with --tpu NAME, and it prints the commands that set up every worker and train "
            "from worker 0"
        )
    location = ["--zone", zone, "--project", args.project]
    arguments = train_argv(args, paths, choice, name if multi_host else "local")
    # TensorFlow drives a slice from worker 0's one client; on JAX each worker's trainer holds its chips.
    single_client = multi_host and args.backend == TENSORFLOW
    lifecycle = tpu_lifecycle.choose_lifecycle(choice.tpu, args.spot, args.autocheckpoint, single_client)
    return {
        "kind": "cloud-tpu-vm",
        "tpu": {
            "name": name,
            "zone": zone,
            "project": args.project,
            "accelerator_type": args.accelerator_type,
            "runtime_version": choice.runtime_version,
            "multi_host": multi_host,
        },
        "chips": choice.tpu.chips,
        "hosts": choice.tpu.hosts,
        "backend": args.backend,
        "software": choice.software,
        "python": "uv-managed Python " + install_lines.JAX_PYTHON
        if args.backend == JAX
        else "the image's python3",
        "tensorflow_tpu": choice.tensorflow_version if args.backend == TENSORFLOW else None,
        "runtime": choice.describe(),
        "environment": dict(tpu_launch.training_environment(multi_host, args.backend)),
        "supervisor": {
            "command": f"{tpu_launch.training_python(args.backend)} -m train.tools.supervisor",
            "log": f"~/{tpu_launch.LOG_FILE}",
            "pid_file": f"~/{tpu_launch.PID_FILE}",
            "worker": "0" if single_client else "all",
        },
        "package": package_uri(args),
        "data_dir": paths.dataset_dir,
        "model_dir": paths.model_dir,
        "train_args": arguments,
        "lifecycle": lifecycle.describe(restart_command(args)),
        "commands": tpu_launch.training_commands(
            name, location, choice, package_uri(args), arguments, lifecycle, args.backend
        ),
    }


def spec_location(args) -> str:
    """Where the training spec is written: the dry run's directory, else WORKDIR/jobs."""
    if args.dry_run:
        return os.path.join(args.dry_run_dir, TRAINING_SPEC_FILE)
    return manifest_lib.join(args.workdir.rstrip("/"), "jobs", TRAINING_SPEC_FILE)


def restart_command(args) -> str:
    """The off-VM loop that recreates a preempted spot TPU from the spec (pipelines/tpu/restart.py)."""
    return f"python -m pipelines.tpu.restart --spec {spec_location(args)}"


def build_sdist(dist_dir: str) -> str:
    """Build this project's sdist from setup.py into the empty directory `dist_dir`; return its path."""
    subprocess.run(
        [sys.executable, SETUP_FILE, "-q", "sdist", "--dist-dir", dist_dir], cwd=REPO_ROOT, check=True
    )
    (built,) = os.listdir(dist_dir)
    return os.path.join(dist_dir, built)


def build_package(destination_uri: str) -> None:
    """Build this project's sdist from setup.py and copy it to `destination_uri`."""
    with tempfile.TemporaryDirectory() as build_dir, open(build_sdist(build_dir), "rb") as source:
        _write(destination_uri, source.read())


def _write(uri: str, data: bytes) -> None:
    from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415 - --help answers without Beam

    with FileSystems.create(uri) as handle:
        handle.write(data)


def train_on_this_tpu_vm(spec: dict, run=subprocess.run):
    """Start training on this single-host TPU VM under the supervisor, detached, in the [tpu] (or JAX's
    [tpu-jax]) venv the launcher makes (pipelines/tpu/interpreter.py)."""
    run_dir = os.path.join(os.path.expanduser("~"), tpu_launch.RUN_DIR)
    backend = spec.get("backend", TENSORFLOW)  # a spec an earlier version wrote trains on TensorFlow
    pid_file = os.path.join(run_dir, os.path.basename(tpu_launch.PID_FILE))
    python = sys.executable  # not run: a supervisor runs there already
    with tpu_launch.start_lock(run_dir):
        # Under the lock, before the install: a second launch never reinstalls under a running trainer.
        if tpu_launch.running_supervisor(pid_file) is None:
            with tempfile.TemporaryDirectory() as build_dir:
                python = tpu_interpreter.ensure_interpreter(run_dir, build_sdist(build_dir), backend, run=run)
            extra = install_lines.TPU_JAX if backend == JAX else install_lines.TPU
            print(f"Training interpreter: {python} (this package with its [{extra}] extra)")
        start = tpu_launch.start_detached(
            spec["train_args"], run_dir, python=python, backend=backend, locked=True
        )
    how = "started" if start.started else "is already running (not started again)"
    print(
        f"Dataset ready. Training {how} under train.tools.supervisor (pid {start.pid}); follow it with: "
        f"tail -f {start.log_path}"
    )
    return start.pid


# The flags that only stage 1 reads: given with --skip-preprocess they would change nothing. Not
# --image-size (it also sizes training's default batch), nor --input (required until --skip-preprocess
# could do without it: commands that give both keep working).
STAGE1_FLAGS = ("--crop-margin", "--encoding", "--sdk_container_image", "--setup-file")


def precheck_problem(args, paths: WorkflowPaths, dataflow_args: list[str]) -> str | None:
    """What is wrong before stage 1 is launched: a flag Dataflow does not know, the input, the output; or None.

    A dry run builds a template, which may come before its input exists: only the output's place is checked.
    """
    from preprocess.inputs import checks as input_checks

    problem = options.beam_args_problem(dataflow_args, build_parser())
    if problem or args.skip_preprocess:
        return problem
    try:
        input_checks.check_inputs(
            args.input, paths.dataset_dir, template=args.dry_run, output_flag="--workdir"
        )
    except input_checks.InputError as exc:
        return str(exc)
    return None


class _Refused(Exception):
    """A mistake in the command, said as `error: ...` with exit 2."""


def _refuse_if(problem: str | None) -> None:
    if problem:
        raise _Refused(problem)


def checked_training_job_spec(args, argv: list[str], dataflow_args: list[str], paths: WorkflowPaths) -> dict:
    """training_job_spec, once everything that can be known before stage 1 is checked (_Refused, SetupError,
    LauncherPythonError or ValueError say what is wrong)."""
    # The training's backend (--backend, else $KERAS_BACKEND); start.sh sets it before Keras is imported.
    args.backend = resolve_backend(args.backend)
    _refuse_if(backend_problem(args))
    if args.skip_preprocess:
        dataflow_flags = [token.split("=", 1)[0] for token in dataflow_args if token.startswith("--")]
        _refuse_if(skip_preprocess_problem(argv, STAGE1_FLAGS, paths.dataset_dir, more=dataflow_flags))
    if not args.skip_preprocess and args.input is None:
        raise _Refused("--input is required (or --skip-preprocess to reuse WORKDIR/dataset)")
    if args.sdk_container_image:
        check_launcher_python(["--sdk_container_image", args.sdk_container_image])
    if not args.workdir.startswith("gs://") or not (args.input or "gs://").startswith("gs://"):
        raise _Refused("--input and --workdir must be gs:// URIs: Dataflow workers and TPU VMs read from GCS")
    _refuse_if(precheck_problem(args, paths, dataflow_args))
    spec = training_job_spec(args, paths)
    if (
        not args.dry_run
        and args.tpu != "local"
        and spec["lifecycle"]["autocheckpoint"]
        and shutil.which("gcloud")
    ):
        # The printed create needs gcloud's alpha track, and tpu_restart runs it unattended: say so before stage 1.
        _refuse_if(tpu_lifecycle.autocheckpoint_gcloud_problem())
    if args.tpu == "local" and not args.dry_run and args.backend == TENSORFLOW:
        # Training gets a venv of its own (pipelines/tpu/interpreter.py): check it can be made before stage 1
        # (on JAX uv makes it, on its own Python).
        run_dir = os.path.join(os.path.expanduser("~"), tpu_launch.RUN_DIR)
        if not os.path.exists(tpu_interpreter.venv_python(run_dir)):
            _refuse_if(tpu_interpreter.venv_problem())
    return spec


def main(argv=None) -> int:
    log_format.configure(logging.INFO)
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args, dataflow_args = parser.parse_known_args(argv)
    mixed_up = parser.mixed_up_flags_problem(dataflow_args)  # ours for certain: said before Beam is imported
    if mixed_up:
        parser.refuse(mixed_up)
    paths = WorkflowPaths(args.workdir)
    try:
        spec = checked_training_job_spec(args, argv, dataflow_args, paths)
    except (_Refused, SetupError, LauncherPythonError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stage1_argv = None if args.skip_preprocess else preprocess_argv(args, paths, dataflow_args)

    print(f"TPU runtime: {spec['runtime']}", *tpu_lifecycle.summary_lines(spec["lifecycle"]), sep="\n")
    if args.dry_run:
        os.makedirs(args.dry_run_dir, exist_ok=True)
        if stage1_argv is not None:
            run_stage1(stage1_argv)  # with --template_location: builds the job description, starts nothing
        spec_path = spec_location(args)
        with open(spec_path, "w") as handle:
            json.dump(spec, handle, indent=2)
        print(
            f"Dry run: Dataflow template {os.path.join(args.dry_run_dir, TEMPLATE_FILE)}, training job {spec_path}"
        )
        return 0

    def launch_training(manifest):
        if args.tpu == "local":
            return train_on_this_tpu_vm(spec)
        build_package(package_uri(args))
        spec_uri = spec_location(args)
        _write(spec_uri, json.dumps(spec, indent=2).encode("utf-8"))
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
            dataset_dir=paths.dataset_dir,
            preprocess_argv=stage1_argv,
            launch_training=launch_training,
            model_dir=paths.model_dir,
            skip_if_built=True,
        )
    except WorkflowError as exc:
        from preprocess.launch.dataflow_job import JobContinuesError  # noqa: PLC0415 - Beam: not before --help

        if isinstance(exc.__cause__, JobContinuesError):
            # Ctrl-C while the Dataflow job runs on: say so and how to cancel it; training is not started.
            print(f"stage 1: {exc.__cause__}\ntraining was not started.", file=sys.stderr)
            return JobContinuesError.exit_code
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
