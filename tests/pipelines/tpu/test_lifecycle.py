"""Creation choices (spot, Autocheckpoint, boot script), the dry run that shows them, and start.sh for real."""

import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from pipelines import dataflow
from pipelines.tpu import launch as tpu_launch
from pipelines.tpu import lifecycle as tpu_lifecycle
from pipelines.tpu import runtime as tpu_runtime

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def create_for(accelerator_type, spot=False, autocheckpoint=tpu_lifecycle.AUTO):
    choice = tpu_runtime.choose_runtime(accelerator_type)
    lifecycle = tpu_lifecycle.choose_lifecycle(choice.tpu, spot, autocheckpoint)
    return tpu_lifecycle.create_command("t", ["--zone", "z"], choice, lifecycle), lifecycle


@pytest.mark.parametrize(
    "accelerator_type,enabled",
    [("v2-8", True), ("v3-8", True), ("v4-8", True), ("v5litepod-8", True), ("v5p-8", False), ("v6e-8", False),
     ("v4-32", False), ("v5litepod-16", False)],
)  # fmt: skip
def test_autocheckpoint_is_on_by_default_where_the_docs_allow_it_and_our_process_holds_the_tpu(
    accelerator_type, enabled
):
    create, lifecycle = create_for(accelerator_type)
    assert lifecycle.autocheckpoint is enabled
    assert ("--autocheckpoint-enabled" in create) is enabled
    # The Public Preview flag is created through `gcloud alpha`, as the docs do.
    assert create[:2] == (["gcloud", "alpha"] if enabled else ["gcloud", "compute"])


def test_spot_is_asked_for_and_autocheckpoint_can_be_forced_on_a_slice_or_turned_off():
    create, _ = create_for("v5p-8", spot=True)
    assert "--spot" in create and create.count("--spot") == 1
    assert "--spot" not in create_for("v5p-8")[0]
    assert "--autocheckpoint-enabled" in create_for("v4-32", autocheckpoint="on")[0]
    assert "--autocheckpoint-enabled" not in create_for("v4-8", autocheckpoint="off")[0]
    with pytest.raises(ValueError, match="offers Autocheckpoint on v2, v3, v4, v5e only"):
        create_for("v6e-8", autocheckpoint="on")


def test_only_a_single_host_vm_with_autocheckpoint_loses_nothing_to_maintenance():
    lost = {
        accelerator_type: create_for(accelerator_type, autocheckpoint=mode)[1].describe("")["at_most_lost"]
        for accelerator_type, mode in (
            ("v4-8", "auto"),
            ("v4-32", "on"),
            ("v6e-8", "auto"),
            ("v5litepod-8", "off"),
        )
    }
    assert lost["v4-8"]["maintenance"].startswith("nothing")
    # A slice forced on: the SIGTERM reaches the TPU servers, not the client that saves.
    assert lost["v4-32"]["maintenance"] == lost["v6e-8"]["maintenance"] == tpu_lifecycle.INTERVAL
    assert lost["v5litepod-8"]["maintenance"] == tpu_lifecycle.INTERVAL
    assert all(kind["crash_or_sigkill"] == tpu_lifecycle.INTERVAL for kind in lost.values())


def test_the_vm_is_created_with_the_boot_script_that_reruns_start_sh_as_its_owner():
    create, _ = create_for("v5litepod-8")
    metadata = create[create.index("--metadata") + 1]
    assert metadata == f"startup-script={tpu_lifecycle.BOOT_SCRIPT}"
    assert "," not in tpu_lifecycle.BOOT_SCRIPT  # gcloud's --metadata splits on commas
    assert "/home/*/tf-image-pipeline/start.sh" in tpu_lifecycle.BOOT_SCRIPT
    assert 'su - "$(stat -c %U "$start")" -c "bash $start' in tpu_lifecycle.BOOT_SCRIPT
    subprocess.run(["bash", "-n", "-c", tpu_lifecycle.BOOT_SCRIPT], check=True)  # it parses


def test_the_dry_run_of_the_tpu_launch_shows_the_spot_autocheckpoint_and_restart_choices(tmp_path):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = dataflow.main(
            ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "us-central1",
             "--tpu", "my-tpu", "--accelerator-type", "v5litepod-8", "--spot", "--skip-preprocess", "--dry-run",
             "--dry-run-dir", str(tmp_path)]
        )  # fmt: skip
    assert code == 0
    text = printed.getvalue()
    spec_path = tmp_path / dataflow.TRAINING_SPEC_FILE
    assert "TPU VM: spot; Autocheckpoint on (v5e single host" in text
    assert (
        f"After a spot preemption: run on your machine: python -m pipelines.tpu.restart --spec {spec_path}"
        in text
    )
    assert "After a reboot: the VM's startup script" in text
    assert (
        f"Keep it training: run on your machine: python -m pipelines.tpu.restart --spec {spec_path} (relaunches "
        "training where nothing supervises it, recreates the TPU after a preemption" in text
    )
    assert "At most lost: on maintenance nothing" in text and "--checkpoint-every" in text
    spec = json.loads(spec_path.read_text())
    assert spec["lifecycle"]["spot"] is True and spec["lifecycle"]["autocheckpoint"] is True
    create = shlex.split(spec["commands"][0])
    assert "--spot" in create and "--autocheckpoint-enabled" in create


def test_autocheckpoint_on_where_cloud_tpu_has_none_is_a_message_and_exit_2(tmp_path, capsys):
    code = dataflow.main(
        ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "r", "--tpu", "t",
         "--accelerator-type", "v6e-8", "--autocheckpoint", "on", "--skip-preprocess", "--dry-run",
         "--dry-run-dir", str(tmp_path)]
    )  # fmt: skip
    assert code == 2 and "not on v6e" in capsys.readouterr().err


@pytest.fixture
def scratch_home(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": REPO, "HOME": str(tmp_path)}
    return tmp_path, env


def run_start_script(home, env):
    """What the boot script does after a reboot: bash ~/tf-image-pipeline/start.sh, as the owner."""
    return subprocess.run(
        ["bash", str(home / tpu_launch.START_SCRIPT)],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def wait_for(path, text, count=1, seconds=120):
    """The file's text once `text` occurs `count` times in it (or after `seconds`)."""
    deadline = time.monotonic() + seconds
    while (path.read_text() if path.exists() else "").count(text) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    return path.read_text()


def wait_for_the_supervisor_to_exit(home, seconds=120):
    """Until the supervisor is gone, as after a shutdown. It removes its pid file last, after the stopped file
    and its status object: until then start.sh rightly sees it running."""
    pid_file = home / tpu_launch.PID_FILE
    deadline = time.monotonic() + seconds
    while pid_file.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the supervisor still runs {seconds} s after it ended training: {pid_file} is there")
        time.sleep(0.05)


def test_start_sh_resumes_after_a_reboot_skips_a_run_that_still_runs_and_one_that_ended_for_good(
    scratch_home,
):
    home, env = scratch_home
    # The launch writes start.sh and runs it; a setup error (--epochs 0) ends this supervised run for good.
    launch = tpu_launch.supervised_launch_command(
        ["--data", str(home), "--model-dir", str(home), "--epochs", "0"], multi_host=False
    )
    result = subprocess.run(
        ["bash", "-c", launch], cwd=home, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "training started" in result.stdout, result.stderr
    log = home / tpu_launch.LOG_FILE
    wait_for(log, "not restarting")
    wait_for(home / tpu_launch.STOPPED_FILE, "setup error")
    wait_for_the_supervisor_to_exit(home)
    # A reboot now leaves it alone: it ended for good.
    result = run_start_script(home, env)
    assert "training ended for good (setup error" in result.stdout and log.read_text().count("run 1:") == 1
    # A run that was stopped by the shutdown (no stopped file) is resumed, its log kept.
    (home / tpu_launch.STOPPED_FILE).unlink()
    result = run_start_script(home, env)
    assert "training started" in result.stdout
    assert wait_for(log, "not restarting", count=2).count("run 1:") == 2  # appended: earlier lines stay
    # While a supervisor runs, start.sh starts no second one.
    wait_for(home / tpu_launch.STOPPED_FILE, "setup error")
    wait_for_the_supervisor_to_exit(home)
    (home / tpu_launch.STOPPED_FILE).unlink()
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "train.tools.supervisor"]
    )
    try:
        (home / tpu_launch.PID_FILE).write_text(f"{sleeper.pid}\n")
        result = run_start_script(home, env)
        assert f"already running under train.tools.supervisor (pid {sleeper.pid})" in result.stdout
    finally:
        sleeper.kill()
        sleeper.wait()


def test_two_start_sh_runs_at_once_start_one_supervisor(scratch_home):
    # The boot script's run and a relaunch by pipelines.tpu.restart can overlap: the later one must see the
    # supervisor the earlier one started, though that supervisor has not yet written its own pid file.
    home, env = scratch_home
    (home / tpu_launch.RUN_DIR).mkdir()
    script = tpu_launch.start_script(["--data", str(home), "--model-dir", str(home), "--epochs", "0"], False)
    (home / tpu_launch.START_SCRIPT).write_text(script)
    runs = [
        subprocess.Popen(
            ["bash", str(home / tpu_launch.START_SCRIPT)], cwd="/", env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=60)[0] for run in runs]
    assert sum("training started" in output for output in outputs) == 1, outputs
    wait_for(home / tpu_launch.STOPPED_FILE, "setup error")
    wait_for_the_supervisor_to_exit(home)
    assert (home / tpu_launch.LOG_FILE).read_text().count("run 1:") == 1


def test_start_sh_and_running_supervisor_agree_on_a_supervisor_a_zombie_and_another_process(scratch_home):
    # Both wait out an empty cmdline (a process mid-exec) but not a zombie's, which stays empty: an exited
    # supervisor its launcher has not reaped yet is no supervisor, at once rather than after the 1 s bound.
    home, env = scratch_home
    script = tpu_launch.start_script(["--data", str(home)], False)
    check = script[script.index("running_supervisor() {") : script.index("if running_supervisor; then")]
    (home / tpu_launch.RUN_DIR).mkdir()
    pid_file = home / tpu_launch.PID_FILE
    marked = [sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))"]
    supervisor, other, zombie = (
        subprocess.Popen([*marked, seconds, name])
        for seconds, name in (
            ("60", "train.tools.supervisor"),
            ("60", "other"),
            ("0", "train.tools.supervisor"),
        )
    )
    try:
        while not open(f"/proc/{zombie.pid}/stat").read().rpartition(") ")[2].startswith("Z"):
            time.sleep(0.01)
        for process, running in ((supervisor, True), (zombie, False), (other, False)):
            while not open(f"/proc/{process.pid}/cmdline", "rb").read() and process is not zombie:
                time.sleep(0.01)  # past its own exec: this test is not about that instant
            pid_file.write_text(f"{process.pid}\n")
            # Each answers within the 1 s it would wait out an empty cmdline (both take milliseconds here).
            started = time.monotonic()
            assert (tpu_launch.running_supervisor(str(pid_file)) == process.pid) is running, process.args
            assert time.monotonic() - started < tpu_launch.EXEC_SETTLE_SECONDS
            started = time.monotonic()
            shell = subprocess.run(
                ["bash", "-c", f"{check}running_supervisor"], cwd=home, env=env, timeout=60
            )
            assert (shell.returncode == 0) is running, process.args
            assert time.monotonic() - started < tpu_launch.EXEC_SETTLE_SECONDS
    finally:
        for process in (supervisor, other, zombie):
            process.kill()
            process.wait()


def test_start_sh_finds_libtpu_or_says_in_one_line_that_it_is_missing(scratch_home):
    # start.sh's export line, in a real bash whose python3 has no libtpu (this test machine's), then one that has.
    home, env = scratch_home
    (export,) = [
        line
        for line in tpu_launch.start_script(["--data", str(home)], False).splitlines()
        if line.startswith("export ")
    ]
    shown = f'{export}\necho "path=[$TF_PLUGGABLE_DEVICE_LIBRARY_PATH]"'
    result = subprocess.run(["bash", "-c", shown], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == "path=[]\n"  # empty: TensorFlow loads no plugin
    assert (
        result.stderr == f"{home / 'bin' / 'python3'}{tpu_launch.LIBTPU_MISSING}\n"
    )  # one line, no traceback
    package = home / "site" / "libtpu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    env = {**env, "PYTHONPATH": f"{home / 'site'}:{env['PYTHONPATH']}"}
    result = subprocess.run(["bash", "-c", shown], env=env, capture_output=True, text=True, timeout=60)
    assert result.stdout == f"path=[{package / 'libtpu.so'}]\n" and result.stderr == ""


def test_a_slice_start_sh_starts_no_training_while_a_tpu_server_does_not_answer(scratch_home):
    home, env = scratch_home
    bin_dir = home / "bin"
    # A slice of one worker whose TPU server (127.0.0.1, a closed port) never answers.
    (bin_dir / "gcloud").write_text(
        '#!/bin/sh\necho \'{"networkEndpoints": [{"ipAddress": "127.0.0.1", "port": 9}]}\'\n'
    )
    (bin_dir / "gcloud").chmod(0o755)
    wait_argv = [
        *tpu_launch.tpu_servers_wait_argv("my-v4-32", ["--zone", "z", "--project", "p"]),
        "--timeout",
        "0.5",
    ]
    launch = tpu_launch.supervised_launch_command(["--data", str(home)], True, wait_argv)
    result = subprocess.run(
        ["bash", "-c", launch], cwd=home, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "does not answer" in result.stderr
    assert "training started" not in result.stdout and not (home / tpu_launch.LOG_FILE).exists()
    # The launch's own wait on a slice: before the supervisor, with the TPU's name and location.
    script = tpu_launch.start_script(["--tpu", "my-v4-32"], True, wait_argv)
    assert script.index(
        "python3 -m train.tools.tpu_servers --tpu my-v4-32 --zone z --project p"
    ) < script.index("setsid nohup")


def test_a_launch_whose_gcloud_has_no_alpha_commands_is_refused_before_stage_1(tmp_path, monkeypatch, capsys):
    # A gcloud without its alpha component, run unattended: the prompt to install it cannot be answered.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(
        "#!/bin/sh\necho 'ERROR: (gcloud) This prompt could not be answered because you are not in an "
        "interactive session.' >&2\nexit 1\n"
    )
    (bin_dir / "gcloud").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    ran = []
    monkeypatch.setattr(dataflow, "run_workflow", lambda **kwargs: ran.append(kwargs))
    argv = ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "us-central1",
            "--tpu", "my-tpu", "--accelerator-type", "v5litepod-8", "--skip-preprocess"]  # fmt: skip
    assert dataflow.main(argv) == 2 and ran == []
    err = capsys.readouterr().err
    assert "gcloud components install alpha" in err and "--autocheckpoint off" in err
    assert "not in an interactive session" in err and "Traceback" not in err
    # Without Autocheckpoint the create is plain `gcloud compute ...`: no alpha needed, the launch goes on.
    assert dataflow.main([*argv, "--autocheckpoint", "off"]) == 0 and len(ran) == 1


def test_on_jax_a_slice_gets_autocheckpoint_where_the_docs_allow_it_since_every_worker_holds_its_chips():
    # JAX: no single client; each worker's trainer gets the SIGTERM and the workers agree on the step to save.
    for accelerator_type, enabled in (("v4-32", True), ("v5litepod-16", True), ("v5p-32", False)):
        choice = tpu_runtime.choose_runtime(accelerator_type, backend="jax")
        lifecycle = tpu_lifecycle.choose_lifecycle(choice.tpu, single_client=False)
        assert lifecycle.autocheckpoint is enabled, accelerator_type
        lost = lifecycle.describe("")["at_most_lost"]["maintenance"]
        assert (lost == "nothing: Autocheckpoint waits for the SIGTERM checkpoint") is enabled
    # The launch passes it: TensorFlow's v4-32 keeps it off, JAX's turns it on.
    from pipelines import dataflow
    from pipelines.workflow import WorkflowPaths

    def spec(*extra):
        args = dataflow.build_parser().parse_args(
            ["--input", "gs://b/raw", "--workdir", "gs://b/run", "--project", "p", "--region", "us-central2",
             "--tpu", "t", "--accelerator-type", "v4-32", *extra]
        )  # fmt: skip
        return dataflow.training_job_spec(args, WorkflowPaths(args.workdir))

    assert spec()["lifecycle"]["autocheckpoint"] is False
    jax = spec("--backend", "jax")
    assert (
        jax["lifecycle"]["autocheckpoint"] is True
        and "slice on JAX" in jax["lifecycle"]["autocheckpoint_why"]
    )
    assert jax["commands"][0].startswith("gcloud alpha compute tpus tpu-vm create")
