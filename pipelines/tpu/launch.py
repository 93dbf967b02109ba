"""The commands that put this package on a TPU VM and start training there, supervised and detached from ssh.

The commands for a single-host VM and a slice, on each backend, and the environment they set:
docs/internals.md. On TensorFlow (tensorflow-tpu on the image's Python 3.10) a slice is driven from worker
0 alone; on JAX (jax[tpu] in a uv-managed Python 3.11) every worker runs the trainer.
"""

import contextlib
import fcntl
import os
import shlex
import subprocess
import sys
import time
from typing import NamedTuple

from dataset_contract.cli_help import flag_value
from pipelines.tpu import lifecycle as tpu_lifecycle
from pipelines.tpu import runtime as tpu_runtime
from train import install_lines
from train.config import JAX, TENSORFLOW
from train.device import device_defaults
from train.tools import run_status

REMOTE_PACKAGE = "/tmp/tf-image-pipeline.tar.gz"
# Relative to the ssh user's home, where `gcloud ... ssh --command` starts.
RUN_DIR = "tf-image-pipeline"
LOG_FILE = f"{RUN_DIR}/train.log"
PID_FILE = f"{RUN_DIR}/supervisor.pid"
START_SCRIPT = f"{RUN_DIR}/start.sh"  # the launch runs it; the VM's boot script runs it again after a reboot
START_LOCK = f"{RUN_DIR}/start.lock"  # held by start.sh from its checks until the pid file is written
STOPPED_FILE = f"{RUN_DIR}/stopped"  # the supervisor's reason when training ended for good
PROGRESS_FILE = f"{RUN_DIR}/progress.json"  # the last checkpoint step, for the supervisor's no-progress stop
# --backend jax: the venv of the [tpu-jax] extra on a uv-managed Python 3.11 (install_lines.tpu_jax_venv_commands).
JAX_VENV = f"{RUN_DIR}/jax-venv"
TPU_RUNTIME_SERVICE = "/etc/systemd/system/tpu-runtime.service"
TPU_SERVER_IMAGE = "gcr.io/cloud-tpu-v2-images/grpc_tpu_worker"
# Where libtpu is, found without importing it (importing TensorFlow's TPU pieces would load it). Without it
# (a CPU VM, the generic tensorflow build) one line on stderr, no traceback, and an empty path, which
# TensorFlow treats as unset (it loads the plugin only for a non-empty value); start.sh goes on as before.
# No quote characters: it travels inside gcloud's --command '...'.
LIBTPU_MISSING = (
    " has no libtpu (a CPU VM, or TensorFlow without its TPU build), so TensorFlow will find no TPU here: "
    "install this package with its [tpu] extra (tensorflow-tpu and its libtpu) for that Python, then launch again"
)
_LIBTPU_PATH_PYTHON = (
    "import importlib.util, os, sys; "
    'spec = importlib.util.find_spec("libtpu"); '
    'print(os.path.join(spec.submodule_search_locations[0], "libtpu.so")) '
    f'if spec and spec.submodule_search_locations else sys.exit(sys.executable + "{LIBTPU_MISSING}")'
)


# TPUStrategy's replicas per chip: one per TensorCore on v2 and v3 (two a chip); from v4 on one per chip
# (v4 and v5p join a chip's two TensorCores into one megacore device; v5e and v6e have one TensorCore a chip).
_REPLICAS_PER_CHIP = {"v2": 2, "v3": 2}


def tpu_replicas(tpu: tpu_runtime.TpuType) -> int:
    """The replicas TPUStrategy runs on `tpu` (its num_replicas_in_sync)."""
    return tpu.chips * _REPLICAS_PER_CHIP.get(tpu.generation.name, 1)


def default_global_batch_size(model: str, image_size: int, tpu: tpu_runtime.TpuType) -> int:
    """The global batch `python -m train` picks on `tpu` without --global-batch-size (device_defaults.py: 1024
    on a v5litepod-8), passed explicitly so that the printed commands show it."""
    per_replica = device_defaults.default_per_replica_batch(
        device_defaults.TPU, model, image_size
    ).per_replica
    return per_replica * tpu_replicas(tpu)


def pip_install_command(sdist_path: str) -> str:
    """The TPU VM install line: the staged package with its [tpu] extra (tensorflow-tpu + the matching libtpu).

    train/install_lines.py spells it, for the README and its install test as for this launch.
    """
    return install_lines.tpu_install_command(sdist_path)


# No quote characters: the lines travel inside gcloud's --command '...'.
JAX_INSTALL_FAILED = (
    "error: the JAX backend install on this TPU VM failed at the step whose output is above (uv, the Python 3.11",
    "  it brings, or the [tpu-jax] packages). It needs the registry (pypi.org) and GitHub (python-build-standalone,",
    "  where uv gets Python). With the network back, run the same command again: it reuses what was done.",
    "  Or launch with --backend tensorflow (tensorflow-tpu on the image Python, no uv).",
)


def install_command(package_uri: str, backend: str) -> str:
    """Copy the staged sdist from GCS and install it: the [tpu] extra (TensorFlow), or [tpu-jax] in JAX_VENV
    on a uv-managed Python 3.11 (a failed step ends with JAX_INSTALL_FAILED's lines, exit 2)."""
    if backend == JAX:
        steps = install_lines.tpu_jax_venv_commands("python3", REMOTE_PACKAGE, JAX_VENV, pip_user=True)
        failed = "; ".join(shlex.join(["echo", line]) for line in JAX_INSTALL_FAILED)
        install = (
            f"{{ {' && '.join(shlex.join(step) for step in steps)} || {{ {{ {failed}; }} >&2; exit 2; }}; }}"
        )
    else:
        install = pip_install_command(REMOTE_PACKAGE)
    return f"gcloud storage cp {shlex.quote(package_uri)} {REMOTE_PACKAGE} && {install}"


def training_python(backend: str = TENSORFLOW) -> str:
    """The interpreter start.sh runs the supervisor and the trainer with (relative to the ssh user's home)."""
    return f"{JAX_VENV}/bin/python" if backend == JAX else "python3"


def tpu_server_setup_command(tensorflow_version: str) -> str:
    """Point this worker's TPU server (the tpu-runtime service) at `tensorflow_version` and restart it."""
    image = f"{TPU_SERVER_IMAGE}:tf-{tensorflow_version}-pjrt"
    missing = (
        f"echo 'no {TPU_RUNTIME_SERVICE} on this worker: the runtime image runs no TensorFlow TPU server, so "
        "TensorFlow cannot drive this slice from worker 0; create the slice with the runtime "
        "pipelines/tpu/runtime.py chooses' >&2"
    )
    # The service line reads Environment="TF_DOCKER_URL=...": the substitution ends with the closing quote.
    return (
        f"{{ test -f {TPU_RUNTIME_SERVICE} || {{ {missing}; exit 1; }}; }} && "
        f"sudo sed -i 's|TF_DOCKER_URL=.*|TF_DOCKER_URL={image}\"|' {TPU_RUNTIME_SERVICE} && "
        "sudo systemctl daemon-reload && sudo systemctl restart tpu-runtime"
    )


def training_environment(multi_host: bool, backend: str = TENSORFLOW) -> list[tuple[str, str]]:
    """(name, shell value) pairs the training process gets, as the harness sets them (docs/internals.md)."""
    if backend == JAX:
        # Keras' backend before Keras is imported; TensorFlow (tf.data only) leaves libtpu to JAX.
        return [("KERAS_BACKEND", JAX), ("TPU_LOAD_LIBRARY", "0")]
    if multi_host:
        # The client on worker 0 leaves the chips to the TPU servers (python -m train sets it too for --tpu NAME).
        return [("TPU_LOAD_LIBRARY", "0")]
    return [
        ("NEXT_PLUGGABLE_DEVICE_USE_C_API", "true"),
        ("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", f'"$(python3 -c {shlex.quote(_LIBTPU_PATH_PYTHON)})"'),
    ]


def supervisor_tpu_argv(
    name: str, location: list[str], multi_host: bool, backend: str = TENSORFLOW
) -> list[str]:
    """The supervisor's TPU flags: it waits for the TPU's health (and a TensorFlow slice's servers) before each
    restart. JAX runs no TPU servers: every worker's own trainer holds its chips."""
    servers = multi_host and backend == TENSORFLOW
    return ["--tpu", name, *location, *(["--wait-for-tpu-servers"] if servers else [])]


def supervisor_argv(
    python: str,
    train_argv: list[str],
    pid_file: str = PID_FILE,
    run_dir: str = RUN_DIR,
    tpu_argv: list[str] | tuple = (),
) -> list[str]:
    """`python -m train.tools.supervisor ... -- python -m train TRAIN_ARGV`, its status object in the model dir."""
    model_dir = flag_value(train_argv, "--model-dir")
    return [
        python, "-m", "train.tools.supervisor",
        "--pid-file", pid_file,
        "--stopped-file", os.path.join(run_dir, os.path.basename(STOPPED_FILE)),
        "--progress-file", os.path.join(run_dir, os.path.basename(PROGRESS_FILE)),
        *(["--status-uri", run_status.status_uri(model_dir)] if model_dir else []),
        *tpu_argv,
        "--", python, "-m", "train", *train_argv,
    ]  # fmt: skip


def tpu_servers_wait_argv(name: str, location: list[str]) -> list[str]:
    """On a slice's worker 0: wait until every worker's TPU server answers (train/tools/tpu_servers.py)."""
    return ["python3", "-m", "train.tools.tpu_servers", "--tpu", name, *location]


_STATUS_URI_VARIABLE = "STATUS_URI_FROM_THE_WORKER_NUMBER"  # a word shlex leaves unquoted, then "$status_uri"
# The worker's number in its slice, from the metadata server (as jax.distributed's Cloud TPU cluster reads it).
WORKER_NUMBER_URL = "http://${GCE_METADATA_IP:-metadata.google.internal}/computeMetadata/v1/instance/attributes/agent-worker-number"


def worker_status_lines(status_uri: str) -> str:
    """start.sh's lines that give each JAX worker's supervisor its own status object (worker 0's:
    supervisor.json, the one pipelines.tpu.restart watches; worker N's: supervisor-worker-N.json)."""
    per_worker = status_uri[: -len(".json")] + "-worker-"
    return (
        f'worker="$(curl -sf --max-time 10 -H Metadata-Flavor:Google "{WORKER_NUMBER_URL}")" || worker=""\n'
        f"status_uri={shlex.quote(status_uri)}\n"
        f'case "$worker" in ""|0) ;; *[!0-9]*) ;; *) status_uri={shlex.quote(per_worker)}"$worker.json" ;; esac\n'
    )


def start_script(
    train_argv: list[str],
    multi_host: bool,
    wait_argv: list[str] | None = None,
    tpu_argv: list[str] | tuple = (),
    backend: str = TENSORFLOW,
) -> str:
    """~/tf-image-pipeline/start.sh: start `python3 -m train TRAIN_ARGV` under the supervisor, detached from
    ssh; run by the launch and at every boot, it starts nothing when training ended for good or still runs."""
    exports = " ".join(f"{name}={value}" for name, value in training_environment(multi_host, backend))
    argv = supervisor_argv(training_python(backend), train_argv, tpu_argv=tpu_argv)
    wait = f"{shlex.join(wait_argv)} || exit $?\n" if wait_argv else ""
    if backend == JAX and multi_host and "--status-uri" in argv:
        status_at = argv.index("--status-uri") + 1
        wait += worker_status_lines(argv[status_at])
        argv[status_at] = _STATUS_URI_VARIABLE
    supervised = shlex.join(argv).replace(_STATUS_URI_VARIABLE, '"$status_uri"')
    # The braces put only the supervisor in the background. `>>`: a resume after a reboot keeps the earlier log.
    # The lock (fd 9, closed for the supervisor so that it ends with start.sh) makes overlapping runs (the boot
    # script's and a relaunch by pipelines.tpu.restart) take turns from the checks to the pid file, which holds
    # the supervisor's pid before the lock is let go: the later run sees it running. setsid execs the
    # supervisor in place (a background job leads no process group), so $! is the pid it writes there too.
    return (
        "#!/bin/bash\n"
        "# Written by the tf-image-pipeline launch (pipelines/tpu/launch.py); run again at every boot.\n"
        'cd "$HOME" || exit 1\n'
        f"exec 9>> {START_LOCK}\n"
        "flock 9 || exit 1\n"
        f"if test -e {STOPPED_FILE}; then\n"
        f'  echo "training ended for good ($(cat {STOPPED_FILE})); not starting it again"; exit 0\n'
        "fi\n"
        # running_supervisor's check: a live pid whose cmdline reads empty is mid-exec, read again (1 s at most).
        "running_supervisor() {\n"
        "  local pid cmdline stat tries=100\n"
        f"  pid=$(cat {PID_FILE} 2>/dev/null) || return 1\n"
        '  case "$pid" in ""|*[!0-9]*) return 1 ;; esac\n'
        "  while cmdline=$(tr '\\0' ' ' < /proc/$pid/cmdline 2>/dev/null); do\n"
        '    case "$cmdline" in *train.tools.supervisor*) return 0 ;; ?*) return 1 ;; esac\n'
        "    stat=$(cat /proc/$pid/stat 2>/dev/null) || return 1\n"
        '    case "${stat##*) }" in Z*|X*) return 1 ;; esac  # a zombie: its cmdline stays empty\n'
        "    tries=$((tries - 1)); test $tries -gt 0 || return 1\n"
        "    sleep 0.01\n"
        "  done\n"
        "  return 1\n"
        "}\n"
        "if running_supervisor; then\n"
        f'  echo "training is already running under train.tools.supervisor (pid $(cat {PID_FILE}))"; exit 0\n'
        "fi\n"
        f"{wait}"
        f"export {exports}\n"
        f"{{ setsid nohup {supervised} >> {LOG_FILE} 2>&1 < /dev/null & }} 9>&-\n"
        f'pid=$!; echo "$pid" > {PID_FILE}\n'
        # Until the forked shell has exec'd setsid, its cmdline is start.sh's, which the next run's check rejects;
        # from then on the check sees setsid, nohup or the supervisor, or an exec between them (an empty cmdline).
        "until grep -q train.tools.supervisor /proc/$pid/cmdline 2>/dev/null || ! kill -0 $pid 2>/dev/null; do\n"
        "  sleep 0.01\n"
        "done\n"
        f'echo "training started under train.tools.supervisor (pid $pid); follow it with: tail -f ~/{LOG_FILE}"\n'
    )


def supervised_launch_command(*args, **kwargs) -> str:
    """The ssh command: write start.sh (start_script's arguments; kept for the boot script), clear an earlier
    end, and run it."""
    script = start_script(*args, **kwargs)
    return (
        f"mkdir -p {RUN_DIR} && printf '%s' {shlex.quote(script)} > {START_SCRIPT} && "
        f"rm -f {STOPPED_FILE} && bash {START_SCRIPT}"
    )


# How long a check waits out an empty /proc/<pid>/cmdline; an exec is done in well under a millisecond.
EXEC_SETTLE_SECONDS = 1.0


def running_supervisor(pid_file: str) -> int | None:
    """The pid in `pid_file` while it names a live train.tools.supervisor (start.sh's check), else None.

    The pid file names the supervisor from the moment its exec begins (Popen returns then; start.sh's setsid
    and nohup exec in turn), and until the kernel has set up the new program's arguments its cmdline reads
    empty: a live pid with an empty cmdline is read again, up to EXEC_SETTLE_SECONDS. A zombie's reads
    empty for good: it is no supervisor."""
    try:
        with open(pid_file) as handle:
            pid = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    deadline = time.monotonic() + EXEC_SETTLE_SECONDS
    while True:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read()
            if cmdline or time.monotonic() > deadline:
                break
            with open(f"/proc/{pid}/stat", "rb") as handle:
                if handle.read().rpartition(b") ")[2][:1] in (b"Z", b"X"):  # the state, after the (name)
                    return None
        except OSError:
            return None
        time.sleep(0.001)
    return pid if b"train.tools.supervisor" in cmdline else None


class DetachedStart(NamedTuple):
    """What start_detached did: the supervisor's pid, its log, and whether this call started it (False: one
    already ran, which was left alone)."""

    pid: int
    log_path: str
    started: bool


@contextlib.contextmanager
def start_lock(run_dir: str):
    """start.sh's lock, RUN_DIR/start.lock, as flock(2): a launch here, another one and a start.sh run at boot
    take turns. Python opens the lock file close-on-exec, so a supervisor started under it does not hold it."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, os.path.basename(START_LOCK)), "ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def start_detached(
    train_argv: list[str],
    run_dir: str,
    multi_host: bool = False,
    python: str = sys.executable,
    backend: str = TENSORFLOW,
    locked: bool = False,
) -> DetachedStart:
    """On this TPU VM: start training under the supervisor in a new session, output to RUN_DIR/train.log,
    unless a supervisor already runs there.

    The same environment as `supervised_launch_command`, and start.sh's lock (`start_lock`, taken here
    unless the caller holds it: `locked`), held from the check of the pid file until it names the new
    supervisor, so two starts at once start one.
    """
    log_path = os.path.join(run_dir, os.path.basename(LOG_FILE))
    pid_file = os.path.join(run_dir, os.path.basename(PID_FILE))
    with contextlib.nullcontext() if locked else start_lock(run_dir):
        # An earlier run's end is cleared, as the remote launch's `rm -f stopped` does: this run is a new one.
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(run_dir, os.path.basename(STOPPED_FILE)))
        running = running_supervisor(pid_file)
        if running is not None:
            return DetachedStart(running, log_path, started=False)
        # start.sh's environment. libtpu's path is the training interpreter's (the [tpu] venv's), not this
        # launcher's, which has generic TensorFlow and no libtpu: start.sh's line, run by `python`.
        environment, env = dict(training_environment(multi_host, backend)), dict(os.environ)
        if environment.pop("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", None):
            found = subprocess.run([python, "-c", _LIBTPU_PATH_PYTHON], stdout=subprocess.PIPE, text=True)
            # "" without libtpu: its line on stderr.
            env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] = found.stdout.strip()
        env.update(environment)
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(
                supervisor_argv(python, train_argv, pid_file, run_dir),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        # Popen returns once the child has begun its exec, so the next start's check sees it running, or
        # mid-exec, which it waits out (running_supervisor). The supervisor writes the same pid there later.
        with open(pid_file, "w") as handle:
            handle.write(f"{process.pid}\n")
    return DetachedStart(process.pid, log_path, started=True)


def training_commands(
    name: str,
    location: list[str],
    choice: tpu_runtime.RuntimeChoice,
    package_uri: str,
    train_argv: list[str],
    lifecycle: tpu_lifecycle.Lifecycle,
    backend: str,
) -> list[str]:
    """create, then install (+ TPU servers on a TensorFlow slice) and the supervised launch, as gcloud commands."""
    create = shlex.join(tpu_lifecycle.create_command(name, location, choice, lifecycle))
    install = install_command(package_uri, backend)
    multi_host = choice.tpu.multi_host
    tpu_argv = supervisor_tpu_argv(name, location, multi_host, backend)

    def ssh(worker: str, command: str) -> str:
        return shlex.join(["gcloud", "compute", "tpus", "tpu-vm", "ssh", name, *location, f"--worker={worker}",
                           "--command", command])  # fmt: skip

    if backend == TENSORFLOW and multi_host:
        # The same software on every worker, every TPU server on the client's TensorFlow; one client, on worker 0,
        # started once every worker's TPU server answers.
        launch = supervised_launch_command(train_argv, True, tpu_servers_wait_argv(name, location), tpu_argv)
        setup = f"{install} && {tpu_server_setup_command(choice.tensorflow_version)}"
        return [create, ssh("all", setup), ssh("0", launch)]
    # A single host; or JAX on a slice, which runs on every host the same install, then the same supervised
    # trainer (the trainers find each other: keras.distribution.initialize(), from --tpu NAME).
    launch = supervised_launch_command(train_argv, multi_host, tpu_argv=tpu_argv, backend=backend)
    if multi_host:
        return [create, ssh("all", install), ssh("all", launch)]
    return [create, ssh("all", f"{install} && {launch}")]
