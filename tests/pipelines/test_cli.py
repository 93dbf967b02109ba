"""`python -m pipelines.local|dataflow --help` answers before TensorFlow or Beam is imported."""

import pytest

from tests.cli_probe import probe_module

HEAVY = ("tensorflow", "apache_beam", "tensorflow_transform", "keras")


@pytest.mark.parametrize(
    "module, flag", [("pipelines.local", "--skip-preprocess"), ("pipelines.dataflow", "--region")]
)
def test_help_prints_before_tensorflow_or_beam_is_imported(tmp_path, module, flag):
    result = probe_module(module, ["--help"], HEAVY, tmp_path)
    assert "EXIT 0 HEAVY []" in result.stderr, result.stderr[-2000:]
    assert flag in result.stdout


def test_the_local_workflow_hands_verbose_to_stage_1_and_is_quiet_without_it():
    from pipelines import local

    verbose = local.build_parser().parse_args(["--workdir", "w", "--verbose"])
    assert "--verbose" in local.preprocess_argv(verbose, "images", "dataset")
    quiet = local.build_parser().parse_args(["--workdir", "w"])
    assert "--verbose" not in local.preprocess_argv(quiet, "images", "dataset")


@pytest.mark.parametrize(
    "module, groups, defaults",
    [
        (
            "train",
            ("data and output:", "model and machine:", "training length and learning rate:", "training recipe:",
             "checkpoints and progress:"),
            ("Default: per replica x replicas", "32 per CPU replica", "Passes over the train split. (default: 10)"),
        ),
        (
            "pipelines.local",
            ("stage 1 (python -m preprocess):", "stage 2 (python -m train):"),
            ("(default 64, the demo's; python -m preprocess's is 224)", "(default 32, the demo's; python -m train's is set per device",
             "(default 50, the demo's; python -m train's is 10: see below)"),
        ),
        (
            "pipelines.dataflow",
            ("where:", "stage 1 on Dataflow:", "the TPU VM:", "stage 2 (python -m train):", "training recipe:"),
            ("--epochs EPOCHS Passes over the train split. (default: 30)", "python -m train's (small_cnn, 10 epochs, a per-device batch)"),
        ),
        (
            "preprocess",
            ("input and output:", "images:", "dataset:", "running:"),
            ("(default 224)", "(default 0.8,0.1,0.1)"),
        ),
    ],
)  # fmt: skip
def test_every_help_groups_its_flags_and_shows_the_defaults(tmp_path, module, groups, defaults):
    result = probe_module(module, ["--help"], HEAVY, tmp_path)
    assert "EXIT 0" in result.stderr, result.stderr[-2000:]
    text = " ".join(result.stdout.split())  # argparse wraps lines where it likes
    for title in groups:
        assert f" {title} " in f" {text} ", title
    for default in defaults:
        assert default in text, default


@pytest.mark.parametrize("module", ["pipelines.local", "pipelines.dataflow"])
def test_a_workflows_stage_1_flags_are_checked_as_python_m_preprocess_checks_them(module, capsys):
    import importlib

    parser = importlib.import_module(module).build_parser()
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--workdir", "w", "--crop-margin", "2"])
    assert exited.value.code == 2
    assert "--crop-margin: expected a fraction between 0 and 1, got 2" in capsys.readouterr().err


def test_the_local_workflow_hands_stage_1_only_the_flags_given_as_it_takes_them():
    from pipelines import local

    args = local.build_parser().parse_args(
        ["--workdir", "w", "--max-failed-fraction", "0.5", "--crop-margin", "0.14"]
    )
    argv = local.preprocess_argv(args, "images", "dataset")
    assert argv[argv.index("--max-failed-fraction") + 1] == "0.5"
    assert argv[argv.index("--crop-margin") + 1] == "0.14"
    assert argv[argv.index("--image-size") + 1] == str(local.DEMO_IMAGE_SIZE)
    assert "--retention-days" not in argv  # not given: stage 1's own default
