"""A fatal native error during `import tensorflow` (a libtpu or driver abort) reaches the training log."""

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Stands in for a TensorFlow whose native start-up aborts: INFO chatter, then glog's fatal line (as the
# TPU-FACTS abort reads), then SIGABRT, all from native code's fd 2, before the import returns.
ABORTING_TENSORFLOW = textwrap.dedent(
    """
    import os
    os.write(2, b"I0000 00:00:1 1 cpu_feature_guard.cc:1] startup chatter\\n")
    os.write(2, b"F1126 09:00:00.000000 1 tpu_library_init.cc:1] "
                b"ConfigureDistributedTpuOp_DoWork not available in this library\\n")
    os.abort()
    """
)


def test_a_child_that_aborts_while_importing_tensorflow_has_its_fatal_line_in_the_supervisor_log(tmp_path):
    fake = tmp_path / "fake" / "tensorflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(ABORTING_TENSORFLOW)
    log_path = tmp_path / "train.log"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'fake'}{os.pathsep}{REPO}"}
    with open(log_path, "wb") as log:
        result = subprocess.run(
            [sys.executable, "-m", "train.tools.supervisor", "--restart-delay", "0", "--crash-loop-limit", "1", "--",
             sys.executable, "-m", "train", "--data", str(tmp_path / "data"), "--model-dir", str(tmp_path / "m")],
            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=120,
        )  # fmt: skip
    text = log_path.read_text()
    assert result.returncode == 128 + 6, text  # SIGABRT, as the supervisor reports a signal death
    assert "ConfigureDistributedTpuOp_DoWork not available in this library" in text, text
    assert "killed by SIGABRT" in text
    assert "startup chatter" not in text  # the filter was on: only the noise is dropped
