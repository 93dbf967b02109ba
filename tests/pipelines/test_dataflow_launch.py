"""The TPU launch commands pipelines.dataflow prints and writes, for single-host VMs and multi-host slices."""

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from pipelines import dataflow
from pipelines.tpu import launch as tpu_launch
from pipelines.tpu import runtime as tpu_runtime
from pipelines.workflow import WorkflowPaths
from train import install_lines
from train.tools import supervisor


def spec_for(accelerator_type, *extra):
    args = dataflow.build_parser().parse_args(
        ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "us-central2",
         "--tpu", "my-tpu", "--zone", "us-central2-b", "--accelerator-type", accelerator_type, *extra]
    )  # fmt: skip
    return dataflow.training_job_spec(args, WorkflowPaths(args.workdir))


def flag(argv, name):
    return argv[argv.index(name) + 1]


def start_script_of(launch_command):
    """The start.sh text the launch writes (`printf '%s' SCRIPT > tf-image-pipeline/start.sh`) and runs."""
    words = shlex.split(launch_command)
    script = words[words.index("printf") + 2]
    assert words[words.index("printf") + 3 : words.index("printf") + 5] == [">", tpu_launch.START_SCRIPT]
    assert f"bash {tpu_launch.START_SCRIPT}" in launch_command
    return script


def supervised_train_argv(launch_command):
    """The `python3 -m train ...` argv inside `setsid nohup python3 -m train.tools.supervisor ... -- python3 -m train ...`."""
    words = shlex.split(start_script_of(launch_command), comments=True)
    start = words.index("setsid")
    assert words[start : start + 5] == ["setsid", "nohup", "python3", "-m", "train.tools.supervisor"]
    command = words[words.index("--", start) + 1 : words.index(">>", start)]
    assert command[:3] == ["python3", "-m", "train"]
    return command[3:]


@pytest.mark.parametrize(
    "accelerator_type,multi_host",
    [("v5litepod-8", False), ("v4-8", False), ("v5p-8", False), ("v6e-8", False), ("v5litepod-16", True),
     ("v4-16", True), ("v4-32", True), ("v3-32", True), ("v6e-64", True)],
)  # fmt: skip
def test_slices_larger_than_one_vm_are_multi_host(accelerator_type, multi_host):
    assert tpu_runtime.parse_accelerator_type(accelerator_type).multi_host is multi_host


def test_a_multi_host_slice_installs_and_retargets_tpu_servers_on_every_worker_and_trains_from_worker_0():
    spec = spec_for("v4-32")
    create, setup, train = (shlex.split(command) for command in spec["commands"])
    assert spec["tpu"]["multi_host"] is True and spec["hosts"] == 4 and spec["chips"] == 16
    assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "my-tpu"]
    assert (
        flag(create, "--version") == tpu_runtime.choose_runtime("v4-32").runtime_version == "v2-alpha-tpuv5"
    )
    assert setup[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-tpu"]
    assert "--worker=all" in setup and flag(setup, "--zone") == "us-central2-b"
    setup_command = flag(setup, "--command")
    assert tpu_launch.pip_install_command(tpu_launch.REMOTE_PACKAGE) in setup_command
    # Every worker's TPU server runs the client's TensorFlow (tensorflow-tpu 2.20.0).
    assert (
        "grpc_tpu_worker:tf-2.20.0-pjrt" in setup_command and "systemctl restart tpu-runtime" in setup_command
    )
    assert "train" not in shlex.split(setup_command)
    assert "--worker=0" in train
    launch = flag(train, "--command")
    assert "export TPU_LOAD_LIBRARY=0" in start_script_of(launch)
    train_argv = supervised_train_argv(launch)
    # The resolver must see the whole slice: the TPU's name, not `local`.
    assert flag(train_argv, "--tpu") == "my-tpu" and flag(train_argv, "--strategy") == "tpu"
    assert flag(train_argv, "--data") == "gs://b/run/dataset" and flag(train_argv, "--model-dir").startswith(
        "gs://"
    )
    assert spec["train_args"] == train_argv


def test_a_single_host_vm_installs_and_starts_supervised_training_in_one_command_with_the_harness_pjrt_env():
    spec = spec_for("v5litepod-8")
    create, run = (shlex.split(command) for command in spec["commands"])
    assert spec["tpu"]["multi_host"] is False
    assert flag(create, "--version") == "v2-alpha-tpuv5-lite"
    assert "--worker=all" in run
    command = flag(run, "--command")
    assert "pip install '/tmp/tf-image-pipeline.tar.gz[tpu]'" in command
    script = start_script_of(command)
    assert "NEXT_PLUGGABLE_DEVICE_USE_C_API=true" in script and "TF_PLUGGABLE_DEVICE_LIBRARY_PATH=" in script
    assert "TPU_LOAD_LIBRARY" not in command and "tpu-runtime" not in command
    # Detached from ssh: a new session, no terminal, every stream redirected, in the background.
    assert "setsid nohup python3 -m train.tools.supervisor" in script
    assert script.index(f">> {tpu_launch.LOG_FILE} 2>&1 < /dev/null &") > script.index(
        "train.tools.supervisor"
    )
    assert flag(supervised_train_argv(command), "--tpu") == "local"


def supervisor_flags(launch_command):
    """The supervisor's own flags in start.sh, parsed by its parser."""
    words = shlex.split(start_script_of(launch_command), comments=True)
    start = words.index("setsid") + 5  # setsid nohup python3 -m train.tools.supervisor
    return supervisor.build_parser().parse_args(words[start : words.index(">>", start)])


@pytest.mark.parametrize("accelerator_type,multi_host", [("v5litepod-8", False), ("v4-32", True)])
def test_the_supervisor_keeps_its_status_in_the_model_dir_and_knows_the_tpu_it_waits_for(
    accelerator_type, multi_host
):
    spec = spec_for(accelerator_type)
    args = supervisor_flags(flag(shlex.split(spec["commands"][-1]), "--command"))
    assert args.status_uri == f"{spec['model_dir']}/supervisor.json"
    assert (args.tpu, args.zone, args.project) == ("my-tpu", "us-central2-b", "p")
    # Only a slice waits for every worker's TPU server before a restart.
    assert args.wait_for_tpu_servers is multi_host


def test_the_launch_names_no_tensorflow_without_a_tpu_build():
    for accelerator_type in ("v4-8", "v4-32", "v5litepod-16", "v6e-16"):
        text = " ".join(spec_for(accelerator_type)["commands"])
        assert "2.21" not in text and "tensorflow-tpu==" not in text  # the [tpu] extra pins it


def test_an_explicit_runtime_version_wins_and_an_unknown_type_is_refused():
    assert spec_for("v4-32", "--runtime-version", "my-runtime")["tpu"]["runtime_version"] == "my-runtime"
    with pytest.raises(ValueError, match="Known TPU types are"):
        spec_for("tpu-large")


@pytest.mark.parametrize("accelerator_type,batch", [("v5litepod-8", 1024), ("v4-8", 512), ("v4-32", 2048),
                                                     ("v6e-16", 2048)])  # fmt: skip
def test_the_default_global_batch_is_128_per_chip_and_no_learning_rate_is_set(accelerator_type, batch):
    args = spec_for(accelerator_type)["train_args"]
    assert flag(args, "--global-batch-size") == str(batch)
    assert "--learning-rate" not in args and "--base-learning-rate" not in args


def test_given_batch_learning_rate_and_recipe_flags_are_forwarded_as_given():
    args = spec_for(
        "v4-32", "--global-batch-size", "4096", "--learning-rate", "0.5", "--optimizer", "sgd",
        "--warmup-epochs", "5", "--label-smoothing", "0.1", "--ema", "--augment", "--weights", "imagenet",
        "--base-learning-rate", "0.2", "--checkpoint-every", "5m",
    )["train_args"]  # fmt: skip
    assert flag(args, "--global-batch-size") == "4096" and flag(args, "--learning-rate") == "0.5"
    assert flag(args, "--optimizer") == "sgd" and flag(args, "--warmup-epochs") == "5.0"
    assert flag(args, "--label-smoothing") == "0.1" and flag(args, "--weights") == "imagenet"
    assert flag(args, "--base-learning-rate") == "0.2" and flag(args, "--checkpoint-every") == "5m"
    assert "--ema" in args and "--augment" in args
    # What python -m train would do anyway is left to it.
    assert "--weight-decay" not in args and "--ema-momentum" not in args and "--warmup-steps" not in args


def test_the_forwarded_arguments_parse_as_python_m_train_flags():
    from train.__main__ import build_parser, config_from_args

    args = spec_for("v5litepod-16", "--optimizer", "sgd", "--warmup-steps", "100", "--ema")["train_args"]
    config = config_from_args(build_parser().parse_args(args))
    assert (config.optimizer, config.warmup_steps, config.ema, config.global_batch_size) == (
        "sgd",
        100,
        True,
        2048,
    )
    assert config.learning_rate is None and config.tpu == "my-tpu"


def test_stage_1_gets_the_backbones_crop_margin_by_default_and_a_given_one_otherwise():
    def stage1(*extra):
        args = dataflow.build_parser().parse_args(
            ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "r", *extra]
        )
        return dataflow.preprocess_argv(args, WorkflowPaths(args.workdir), [])

    assert flag(stage1(), "--crop-margin") == "0.143"  # resnet50 by default: 256 stored, 224 crops
    assert flag(stage1("--model", "efficientnetb0"), "--crop-margin") == "0.143"
    assert flag(stage1("--model", "small_cnn"), "--crop-margin") == "0.0"
    assert flag(stage1("--crop-margin", "0.25"), "--crop-margin") == "0.25"
    with pytest.raises(SystemExit):
        stage1("--crop-margin", "1.5")


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_start_detached_runs_the_supervisor_in_its_own_session_with_output_in_the_log(tmp_path, monkeypatch):
    # A setup error (--epochs 0) ends it at once: the supervisor's own log lines show it ran, detached.
    monkeypatch.setenv("PYTHONPATH", REPO)
    pid, log_path, started = tpu_launch.start_detached(
        ["--data", str(tmp_path), "--model-dir", str(tmp_path), "--epochs", "0"], str(tmp_path / "run")
    )
    assert started
    assert os.getsid(pid) == pid  # a session leader: no terminal, no SIGHUP from the launching shell
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            break
        time.sleep(0.1)
    assert os.waitstatus_to_exitcode(status) == supervisor.SETUP_ERROR_EXIT_CODE
    text = open(log_path).read()
    assert "supervisor" in text and "not restarting" in text and "--epochs" in text


def test_start_detached_gives_the_supervisor_the_libtpu_of_the_training_interpreter(tmp_path, monkeypatch):
    # The training interpreter (the [tpu] venv's, here a wrapper) has a libtpu; this launcher process has none.
    monkeypatch.setenv("PYTHONPATH", REPO)
    site = tmp_path / "site"
    (site / "libtpu").mkdir(parents=True)
    (site / "libtpu" / "__init__.py").write_text("")
    seen = tmp_path / "seen"
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        f'[ "$2" = train.tools.supervisor ] && printf %s "$TF_PLUGGABLE_DEVICE_LIBRARY_PATH" > {seen}\n'
        f'PYTHONPATH={site}:$PYTHONPATH exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    train_argv = ["--data", str(tmp_path), "--model-dir", str(tmp_path), "--epochs", "0"]
    start = tpu_launch.start_detached(train_argv, str(tmp_path / "run"), python=str(python))
    deadline = time.monotonic() + 120
    while not os.waitpid(start.pid, os.WNOHANG)[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert seen.read_text() == str(site / "libtpu" / "libtpu.so")


def test_start_detached_clears_an_earlier_end_as_the_remote_launch_does(tmp_path):
    # A run that stopped for good left its reason; a new --tpu local launch starts it again, so a reboot's
    # start.sh must not read that old end. /bin/true as the interpreter: nothing writes the file again.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "stopped").write_text("an earlier run's end\n")
    tpu_launch.start_detached(["--epochs", "0"], str(run_dir), python=shutil.which("true"))
    assert not (run_dir / "stopped").exists()


# A launcher process: its imports done, it waits for a line on stdin, then calls start_detached.
_START_DETACHED_ON_A_LINE = """
import sys
from pipelines.tpu import launch
sys.stdin.readline()
print(*launch.start_detached(sys.argv[3:], sys.argv[2], python=sys.argv[1]))
"""


def test_two_start_detached_at_once_start_one_supervisor_and_the_second_says_it_runs(tmp_path):
    # A retried launcher, or Enter pressed twice: two --tpu local starts of one run directory at the same moment.
    run_dir = tmp_path / "run"
    train_argv = ["--data", str(tmp_path), "--model-dir", str(tmp_path), "--epochs", "0"]
    env = {**os.environ, "PYTHONPATH": REPO}
    # The training interpreter waits 5 s before `-m train` fails on its setup, so the first supervisor is
    # still running when the second start looks, however loaded the machine (it lived 0.5 s without this).
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\ncase " $* " in *" -m train "*) sleep 5;; esac\nexec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    launchers = [
        subprocess.Popen(
            [sys.executable, "-c", _START_DETACHED_ON_A_LINE, str(python), str(run_dir), *train_argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )  # fmt: skip
        for _ in range(2)
    ]
    outputs = [launcher.communicate("go\n", timeout=60)[0].split() for launcher in launchers]
    pids = {int(output[0]) for output in outputs}
    try:
        assert len(pids) == 1, outputs  # one supervisor, named by both
        assert sorted(output[-1] for output in outputs) == ["False", "True"], outputs
        # The supervisor ends (a setup error) and removes its pid file: one run of training in the log.
        deadline = time.monotonic() + 120
        while (run_dir / "supervisor.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (run_dir / "train.log").read_text().count("run 1:") == 1
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)  # a session leader: its group is its training too


def test_a_start_right_after_another_sees_its_supervisor_running_while_it_is_mid_exec(tmp_path, monkeypatch):
    # Popen returns once the child has begun its exec, with the pid file written at once; until the kernel has
    # set up the new program's arguments, /proc/<pid>/cmdline reads empty (4 reads in 5 right after Popen, on
    # a 2-core machine). A second start in that instant must see it running, not start a second supervisor.
    monkeypatch.setenv("PYTHONPATH", REPO)
    for attempt in range(30):
        run_dir = str(tmp_path / str(attempt))
        # multi_host: the same start without the libtpu lookup, one Python run fewer per start.
        first = tpu_launch.start_detached(["--epochs", "0"], run_dir, multi_host=True)
        second = tpu_launch.start_detached(["--epochs", "0"], run_dir, multi_host=True)
        for pid in {first.pid, second.pid}:
            os.killpg(pid, signal.SIGKILL)  # before it gets far: a session leader, its group is its own
            os.waitpid(pid, 0)
        assert first.started and second == (first.pid, first.log_path, False), (attempt, first, second)
        time.sleep(0.02)  # the attempts spread over 0.6 s: how the two processes share the cores varies


def test_the_remote_launch_command_starts_the_supervisor_detached_for_real(tmp_path):
    # The same shell text the ssh command runs, in a real shell in a scratch home, with python3 on PATH.
    command = tpu_launch.supervised_launch_command(
        ["--data", str(tmp_path), "--model-dir", str(tmp_path), "--epochs", "0"], multi_host=True
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": REPO, "HOME": str(tmp_path)}
    result = subprocess.run(
        ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "training started under train.tools.supervisor" in result.stdout
    log = tmp_path / tpu_launch.LOG_FILE
    deadline = time.monotonic() + 120
    while "not restarting" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "not restarting" in log.read_text()


def test_a_failed_install_stops_the_single_host_command_before_training_starts(tmp_path):
    # The ssh --command text in a real shell, with a `gcloud` that fails as a missing package would.
    spec = spec_for("v5litepod-8")
    command = flag(shlex.split(spec["commands"][1]), "--command")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(
        "#!/bin/sh\necho 'ERROR: gs://b/run/packages/...: not found' >&2\nexit 1\n"
    )
    (bin_dir / "gcloud").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    result = subprocess.run(
        ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and "not found" in result.stderr
    assert "training started" not in result.stdout and not (tmp_path / tpu_launch.RUN_DIR).exists()


def test_tpu_local_on_a_multi_host_slice_is_refused():
    args = dataflow.build_parser().parse_args(
        ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "r", "--tpu", "local",
         "--accelerator-type", "v5litepod-16"]
    )  # fmt: skip
    with pytest.raises(ValueError, match="v5litepod-16 is a multi-host slice"):
        dataflow.training_job_spec(args, WorkflowPaths(args.workdir))


def jax_train_argv(launch_command):
    """The trainer's argv in start.sh on --backend jax: the JAX venv's python runs the supervisor and the trainer."""
    words = shlex.split(start_script_of(launch_command), comments=True)
    python = tpu_launch.training_python("jax")
    start = words.index("setsid")
    assert words[start : start + 5] == ["setsid", "nohup", python, "-m", "train.tools.supervisor"]
    command = words[words.index("--", start) + 1 : words.index(">>", start)]
    assert command[:3] == [python, "-m", "train"]
    return command[3:]


def test_jax_on_a_slice_installs_a_uv_python_and_runs_the_trainer_on_every_worker():
    spec = spec_for("v4-32", "--backend", "jax")
    create, setup, train = (shlex.split(command) for command in spec["commands"])
    assert (
        spec["backend"] == "jax" and spec["supervisor"]["worker"] == "all" and spec["tensorflow_tpu"] is None
    )
    # No TensorFlow TPU servers to match: the docs' base image for v4 (TensorFlow's slice gets v2-alpha-tpuv5).
    assert flag(create, "--version") == "tpu-ubuntu2204-base"
    assert (
        "--worker=all" in setup and "--worker=all" in train and "--worker=0" not in " ".join(spec["commands"])
    )
    setup_command = flag(setup, "--command")
    copy, uv_steps = setup_command.split(" && { ", 1)
    assert (
        copy == f"gcloud storage cp gs://b/run/packages/tf-image-pipeline.tar.gz {tpu_launch.REMOTE_PACKAGE}"
    )
    steps, failed = uv_steps.split(" || ", 1)
    assert failed.endswith(
        "} >&2; exit 2; }; }"
    )  # a failed step: what to do, exit 2 (tested in a shell below)
    assert steps.split(" && ") == [
        f"python3 -m pip install --quiet --user uv=={install_lines.UV_VERSION}",
        "python3 -m uv python install 3.11",
        "python3 -m uv venv --allow-existing --managed-python --python 3.11 tf-image-pipeline/jax-venv",
        "python3 -m uv pip install --compile-bytecode --python tf-image-pipeline/jax-venv/bin/python --reinstall-package "
        "tf-image-pipeline '/tmp/tf-image-pipeline.tar.gz[tpu-jax]'",
    ]
    assert "tpu-runtime" not in setup_command and "[tpu]" not in setup_command
    launch = flag(train, "--command")
    script = start_script_of(launch)
    assert "export KERAS_BACKEND=jax TPU_LOAD_LIBRARY=0" in script
    assert "TF_PLUGGABLE_DEVICE_LIBRARY_PATH" not in script and "tpu_servers" not in script
    train_argv = jax_train_argv(launch)
    # --tpu NAME: every worker's trainer joins the others (keras.distribution.initialize()); no tf.distribute.
    assert flag(train_argv, "--backend") == "jax" and flag(train_argv, "--tpu") == "my-tpu"
    assert "--strategy" not in train_argv and spec["train_args"] == train_argv
    args = supervisor_flags(launch)
    assert args.tpu == "my-tpu" and args.wait_for_tpu_servers is False  # JAX has no TPU servers to wait for


def test_jax_on_a_single_host_installs_and_launches_in_one_command_and_tensorflow_stays_as_it_was():
    spec = spec_for("v5litepod-8", "--backend", "jax")
    create, run = (shlex.split(command) for command in spec["commands"])
    assert flag(create, "--version") == "v2-alpha-tpuv5-lite" and "--worker=all" in run
    command = flag(run, "--command")
    assert command.index("[tpu-jax]") < command.index(tpu_launch.START_SCRIPT)
    train_argv = jax_train_argv(command)
    assert flag(train_argv, "--tpu") == "local" and "--strategy" not in train_argv
    assert "jax[tpu] 0.10.2" in spec["runtime"] and "uv-managed Python 3.11" in spec["runtime"]
    # The same flags without --backend: TensorFlow, said explicitly to the trainer.
    tensorflow = spec_for("v5litepod-8")
    argv = supervised_train_argv(flag(shlex.split(tensorflow["commands"][1]), "--command"))
    assert flag(argv, "--backend") == "tensorflow" and flag(argv, "--strategy") == "tpu"
    assert tensorflow["tensorflow_tpu"] == "2.20.0" and "uv" not in tensorflow["commands"][1].split()


def test_the_jax_arguments_parse_as_python_m_train_flags():
    from train.__main__ import build_parser, config_from_args

    args = spec_for("v5litepod-16", "--backend", "jax", "--ema")["train_args"]
    config = config_from_args(build_parser().parse_args(args))
    assert (config.backend, config.strategy, config.tpu, config.ema) == ("jax", "auto", "my-tpu", True)


def test_the_jax_install_runs_in_order_in_a_real_shell_and_stops_where_a_step_fails(tmp_path):
    # The ssh --command text in bash, with a `gcloud` that stages the package and a `python3` that records
    # each call; uv's Python download fails (as it does off Google's network without GitHub): nothing trains,
    # and the command ends with what to do, exit 2.
    spec = spec_for("v5litepod-8", "--backend", "jax")
    command = flag(shlex.split(spec["commands"][1]), "--command")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "gcloud").write_text('#!/bin/sh\necho "gcloud $*" >> "$CALLS"\n')
    (bin_dir / "python3").write_text(
        '#!/bin/sh\necho "python3 $*" >> "$CALLS"\n'
        'case "$*" in *"uv python install"*) echo "error: download failed" >&2; exit 1;; esac\n'
    )
    for fake in ("gcloud", "python3"):
        (bin_dir / fake).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "CALLS": str(calls),
    }
    result = subprocess.run(
        ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "download failed" in result.stderr
    assert result.stderr.splitlines()[1:] == list(tpu_launch.JAX_INSTALL_FAILED)
    assert calls.read_text().splitlines() == [
        f"gcloud storage cp gs://b/run/packages/tf-image-pipeline.tar.gz {tpu_launch.REMOTE_PACKAGE}",
        f"python3 -m pip install --quiet --user uv=={install_lines.UV_VERSION}",
        "python3 -m uv python install 3.11",
    ]
    assert "training started" not in result.stdout and not (tmp_path / tpu_launch.START_SCRIPT).exists()


def test_backend_jax_with_a_tensorflow_only_flag_is_refused_before_any_cloud_call(monkeypatch, capsys):
    def no_cloud(*args, **kwargs):
        raise AssertionError("a cloud call before the flags were checked")

    monkeypatch.setattr(dataflow, "precheck_problem", no_cloud)
    monkeypatch.setattr(dataflow, "run_workflow", no_cloud)
    monkeypatch.setattr(subprocess, "run", no_cloud)
    base = ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "r",
            "--tpu", "my-tpu", "--backend", "jax"]  # fmt: skip
    assert dataflow.main([*base, "--freeze-backbone-epochs", "2"]) == 2
    error = capsys.readouterr().err
    assert (
        "--freeze-backbone-epochs is not supported with --backend jax" in error and "Traceback" not in error
    )
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    assert dataflow.main(base[:-2]) == 2
    assert "KERAS_BACKEND=torch" in capsys.readouterr().err


class MetadataServer:
    """A GCE metadata server answering only a TPU worker's number, as a Cloud TPU slice's worker has it."""

    def __init__(self, worker_number):
        import http.server
        import threading

        number = worker_number

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                found = self.path == "/computeMetadata/v1/instance/attributes/agent-worker-number"
                if found and self.headers.get("Metadata-Flavor") == "Google":
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(number.encode())
                else:
                    self.send_response(404)
                    self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    "worker_number,status_file", [("2", "supervisor-worker-2.json"), (None, "supervisor.json")]
)
def test_every_jax_worker_starts_its_supervisor_for_real_each_with_its_own_status(
    tmp_path, worker_number, status_file
):
    # The JAX slice's launch text in a real shell, in a scratch home whose jax-venv python is this one; the
    # worker's number from a metadata server on localhost (none: as on a single host, supervisor.json).
    model_dir = tmp_path / "model"
    command = tpu_launch.supervised_launch_command(
        ["--data", str(tmp_path), "--model-dir", str(model_dir), "--epochs", "0"], True, backend="jax"
    )
    venv_bin = tmp_path / tpu_launch.JAX_VENV / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    model_dir.mkdir()
    server = MetadataServer(worker_number) if worker_number else None
    env = {**os.environ, "PYTHONPATH": REPO, "HOME": str(tmp_path)}
    env["GCE_METADATA_IP"] = server.address if server else "127.0.0.1:9"  # port 9: nothing answers
    try:
        result = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
    finally:
        if server:
            server.close()
    assert result.returncode == 0 and "training started under train.tools.supervisor" in result.stdout
    log = tmp_path / tpu_launch.LOG_FILE
    deadline = time.monotonic() + 120
    while "not restarting" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "not restarting" in log.read_text()
    assert sorted(path.name for path in model_dir.iterdir() if path.name.startswith("supervisor")) == [
        status_file
    ]
