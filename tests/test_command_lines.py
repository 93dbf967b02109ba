"""Every command of the package, as a user runs it: a typo in a flag (dashes and underscores mixed up
included) gets the flag it meant, in two lines with exit 2, before TensorFlow or Beam is imported; --help
comes back the same way; a --runner Beam does not know is one sentence, not a traceback."""

import pytest

from tests.cli_probe import probe_module

HEAVY = ("tensorflow", "keras", "apache_beam")

# (command, its required arguments, a typo, the flag it meant)
TYPOS = [
    ("preprocess", ["--input", "in", "--output", "out"], "--image_size", "--image-size"),
    ("preprocess.inspect", ["data"], "--per_class", "--per-class"),
    ("preprocess.verify", ["data"], "--no_records", "--no-records"),
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
