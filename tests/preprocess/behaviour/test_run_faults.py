"""What a run of `python -m preprocess` says when its inputs fail it, or a person stops it: a few lines, no
traceback from the launcher or its workers. Real runs on the DirectRunner, a real SIGINT."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.user_mistakes import assert_refused, command_env, run_command, said_lines, write_image, write_text


def test_zero_usable_inputs_give_the_failures_by_reason_not_tf_transforms_crash(tmp_path):
    root = tmp_path / "photos"
    for number in range(3):
        write_text(root / "cat" / f"{number}.jpg", f"a web page saved as cat {number}")
        write_text(root / "dog" / f"{number}.jpg", f"a web page saved as dog {number}")
    # --max-failed-fraction 1: the failure budget (which would stop the run early, with the same counts)
    # never stops it, so the analysis meets an empty train split.
    args = ["--input", root, "--output", tmp_path / "out", "--max-failed-fraction", "1"]
    result = run_command("preprocess", args, tmp_path)
    output = assert_refused(
        result,
        "no image reached the train split",
        "not_an_image 6",
        "the published dataset is unchanged",
        max_lines=6,
    )
    assert "OutOfRangeError" not in output
    assert not (tmp_path / "out" / "dataset.json").exists()


def test_exceeding_max_failed_fraction_says_so_without_a_traceback_from_the_workers_either(tmp_path):
    root = tmp_path / "photos"
    for number in range(3):
        write_image(root / "cat" / f"{number}.jpg", number)
        write_image(root / "dog" / f"{number}.jpg", 10 + number)
    write_text(root / "dog" / "broken.jpg", "not an image")
    args = ["--input", root, "--output", tmp_path / "out", "--image-size", "16"]
    # Worker processes: the step that fails runs in one of them, whose stderr is the terminal's too.
    args += ["--in-process-below", "0", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    result = run_command("preprocess", args, tmp_path)
    # Stopped while decoding, as soon as the failure made the fraction certain (preprocess/decode/failure_budget.py).
    assert_refused(result, "1 of the 7 inputs found fail", "--max-failed-fraction 0.05", "not_an_image 1")


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A corpus and a dataset directory holding a published run of it."""
    base = tmp_path_factory.mktemp("interrupt")
    root = base / "photos"
    for number in range(6):
        write_image(root / "cat" / f"{number}.jpg", number)
        write_image(root / "dog" / f"{number}.jpg", 20 + number)
    output = base / "dataset"
    args = ["--input", root, "--output", output, "--image-size", "16", "--min-shards", "1"]
    result = run_command("preprocess", args, base)
    assert result.returncode == 0, result.stderr[-3000:]
    return base, root, output


def _default_sigint():
    # As in a terminal: a child started from a shell without job control would ignore SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_run_with_worker_processes_says_what_it_left_and_leaves_the_dataset(published):
    base, root, output = published
    before = (output / "dataset.json").read_bytes()
    run_id = json.loads(before)["run"]["id"]
    args = ["--input", root, "--output", output, "--image-size", "16", "--min-shards", "1"]
    # Worker processes, as a large local run has them: they share the terminal's process group.
    args += ["--in-process-below", "0", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    process = subprocess.Popen(
        [sys.executable, "-m", "preprocess", *map(str, args)],
        cwd=base,
        env=command_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, which the test signals as a terminal's Ctrl-C does
        preexec_fn=_default_sigint,
    )
    lines = []
    running = threading.Event()

    def read():
        for line in process.stdout:
            lines.append(line)
            if line.startswith("[0:"):  # the progress line: the pipeline runs, its workers started
                running.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert running.wait(180), "".join(lines)[-3000:]
        said_before = len(lines)
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(60) == 130, "".join(lines)[-3000:]
        reader.join(30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    after = said_lines("".join(lines[said_before:]))
    assert (
        after[0]
        == f"preprocess: interrupted, nothing published: the published dataset of {output} is still run {run_id}"
    )
    # What the run left behind, its size and what removes it (the run had started writing: staging/ at least).
    assert len(after) == 2, "".join(lines)[-3000:]
    left = re.fullmatch(
        r"  left behind: ([\d.]+ [KMG]?B) of temporary and unpublished files in (.+); the next run that "
        rf"publishes to {re.escape(str(output))} removes them, as does `python -m preprocess.gc "
        rf"{re.escape(str(output))}` once this run is 7 days old \(tf.Transform's staging/tft-\* once unused for "
        r"2 days\); or delete them now",
        after[1],
    )
    assert left, after[1]
    folders = left.group(2).split(", ")
    assert f"{output}/staging/" in folders and all(os.path.exists(folder) for folder in folders)
    assert "Traceback" not in "".join(lines)
    assert (output / "dataset.json").read_bytes() == before
    # The workers went with the launcher: nothing is left in its process group.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        pytest.fail("worker processes outlived the interrupted launcher")
    # As said: the next run that publishes removes what the interrupted one left.
    result = run_command("preprocess", args[:8], base)
    assert result.returncode == 0, result.stderr[-3000:]
    left_files = [
        os.path.join(d, name) for folder in folders for d, _, names in os.walk(folder) for name in names
    ]
    assert all(path.startswith(f"{output}/staging/tft-") for path in left_files), left_files
