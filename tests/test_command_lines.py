"""Every command of the package, as a user runs it: a typo in a flag (dashes and underscores mixed up
included) gets the flag it meant, in two lines with exit 2, before TensorFlow or Beam is imported; --help
comes back the same way; a --runner Beam does not know is one sentence, not a traceback; no TensorFlow
start-up line unless --verbose, no Beam "yield and return" warning, one log format."""

import re
import subprocess
import sys

import pytest

from tests.cli_probe import probe_module
from tests.user_mistakes import command_env, run_command, write_image

HEAVY = ("tensorflow", "keras", "apache_beam")

# (command, its required arguments, a typo, the flag it meant)
TYPOS = [
    ("preprocess", ["--input", "in", "--output", "out"], "--image_size", "--image-size"),
    ("preprocess.inspect", ["data"], "--per_class", "--per-class"),
    ("preprocess.verify", ["data"], "--no_records", "--no-records"),
    ("preprocess.gc", ["data"], "--dry_run", "--dry-run"),
    ("train", ["--data", "d", "--model-dir", "m"], "--epocs", "--epochs"),
    ("train", ["--data", "d", "--model-dir", "m"], "--global_batch_size", "--global-batch-size"),
    ("train.evaluate", ["--model-dir", "m"], "--splt", "--split"),
    ("train.predict", ["export", "a.jpg"], "--top_k", "--top-k"),
    ("pipelines.local", ["--workdir", "w"], "--image_size", "--image-size"),
    ("pipelines.local", ["--workdir", "w"], "--epocs", "--epochs"),
    (
        "pipelines.dataflow",
        ["--input", "gs://b/in", "--workdir", "gs://b/run", "--project", "p", "--region", "r"],
        "--image_size",
        "--image-size",
    ),
]


def _heavy_imported(result) -> str:
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(("module", "required", "typo", "meant"), TYPOS)
def test_a_typo_names_the_flag_it_meant_before_tensorflow_or_beam(tmp_path, module, required, typo, meant):
    result = probe_module(module, [*required, typo, "3"], HEAVY, tmp_path)
    # The probe's last line holds the command's exit status and the heavy modules it imported.
    assert _heavy_imported(result) == "EXIT 2 HEAVY []", result.stderr[-3000:]
    said = [line for line in result.stdout.splitlines() + result.stderr.splitlines()[:-1] if line.strip()]
    assert said == [
        f"python -m {module}: error: unknown flag {typo} (did you mean {meant}?)",
        f"(see python -m {module} --help)",
    ]


@pytest.mark.parametrize(
    "module",
    [
        "preprocess.inspect",
        "preprocess.verify",
        "preprocess.gc",
        "train",
        "train.evaluate",
        "train.predict",
        "pipelines.local",
    ],
)
def test_help_comes_before_tensorflow_or_beam(tmp_path, module):
    result = probe_module(module, ["--help"], HEAVY, tmp_path)
    assert _heavy_imported(result) == "EXIT 0 HEAVY []", result.stderr[-3000:]
    assert "(default: None)" not in result.stdout


def test_a_runner_beam_does_not_know_is_one_sentence(tmp_path):
    result = probe_module(
        "preprocess", ["--input", "in", "--output", "out", "--runner", "DirectRuner"], (), tmp_path
    )
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == "EXIT 2 HEAVY []" and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[:-1] == [
        "python -m preprocess: error: --runner DirectRuner: no such Beam runner (did you mean DirectRunner?); "
        "choose DirectRunner (this machine), DataflowRunner, PrismRunner, ... or give a PipelineRunner "
        "subclass's full module.Class name",
        "(see python -m preprocess --help)",
    ]


# TensorFlow's native start-up lines, as they look when nothing drops them.
_NATIVE = ("I0000 ", "W0000 ", "E0000 ", "WARNING: All log messages before absl", "To enable the following")


@pytest.fixture(scope="module")
def manifest_dataset(tmp_path_factory):
    """A dataset stage 1 wrote from a CSV manifest (a real `python -m preprocess` run), and that run."""
    base = tmp_path_factory.mktemp("quiet")
    rows = ["path,label,split"]
    for index in range(4):
        for label, offset in (("cat", 0), ("dog", 20)):
            write_image(base / "images" / f"{label}{index}.png", offset + index)
            rows.append(f"images/{label}{index}.png,{label},{'train' if index % 2 else 'val'}")
    (base / "labels.csv").write_text("\n".join(rows) + "\n")
    args = ["--input", base / "labels.csv", "--output", base / "dataset", "--image-size", "16"]
    result = run_command("preprocess", [*args, "--min-shards", "1"], base)
    assert result.returncode == 0, result.stderr[-3000:]
    return base, result


def test_a_manifest_run_prints_no_beam_yield_and_return_warning_and_one_log_format(manifest_dataset):
    _, result = manifest_dataset
    output = result.stdout + result.stderr
    assert "Using yield and return" not in output
    assert not [line for line in output.splitlines() if line.startswith(_NATIVE)], output[-3000:]
    # Log lines, where there are any, have the one format (time, level, logger): none in argparse's or
    # logging's bare default ("INFO:preprocess...").
    assert not re.search(r"^(INFO|WARNING|ERROR):[\w.]+:", output, re.MULTILINE), output[-3000:]


@pytest.mark.parametrize(
    "command",
    [
        ["preprocess.verify", "dataset"],
        ["preprocess.inspect", "dataset", "--out", "sheet.png"],
        ["python", "-c", "import train; print(len(list(train.load_dataset('dataset', 'validation'))))"],
    ],
)
def test_no_tensorflow_start_up_line_unless_verbose(manifest_dataset, command):
    base, _ = manifest_dataset
    if command[0] == "python":
        result = subprocess.run(
            [sys.executable, *command[1:]],
            cwd=base,
            env=command_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
    else:
        result = run_command(command[0], command[1:], base)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert not [line for line in output.splitlines() if line.startswith(_NATIVE)], output[-3000:]
    if command[0] != "python":
        verbose = run_command(command[0], [*command[1:], "--verbose"], base)
        assert any(line.startswith(_NATIVE) for line in (verbose.stdout + verbose.stderr).splitlines())
