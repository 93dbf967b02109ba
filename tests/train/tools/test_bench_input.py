"""train.tools.bench_input: input pipeline vs. train step, on a small dataset from the real stage 1."""

import pytest

from train.tools import bench_input


@pytest.fixture(scope="module")
def dataset_dir(stage1_dataset):
    """The session's bfloat16 dataset (tests/train/conftest.py): 32 px, written once for every train test."""
    return stage1_dataset("bfloat16")


def test_verdict_names_the_input_pipeline_when_it_is_slower_than_the_step():
    bottleneck, text = bench_input.verdict_for(100.0, 400.0, 90.0, on_cpu=False)
    assert bottleneck == "input"
    assert "INPUT PIPELINE" in text and "100 images/s" in text and "400 images/s" in text


def test_verdict_names_the_train_step_when_input_has_headroom():
    bottleneck, text = bench_input.verdict_for(1000.0, 400.0, None, on_cpu=True)
    assert bottleneck == "train step"
    assert "TRAIN STEP" in text and "2.5x" in text


def test_verdict_asks_for_headroom_before_clearing_the_input_pipeline():
    bottleneck, _ = bench_input.verdict_for(1.1 * 400.0, 400.0, None, on_cpu=False)
    assert bottleneck == "input"


@pytest.mark.slow
def test_bench_input_measures_input_step_and_training_and_prints_the_bottleneck(dataset_dir, capsys):
    args = bench_input.build_parser().parse_args(
        ["--data", dataset_dir, "--global-batch-size", "8", "--seconds", "0.5", "--warmup-batches", "1"]
    )
    result = bench_input.run(args)
    assert result.input_images_per_second > 0
    assert result.step_images_per_second > 0
    assert result.training_images_per_second > 0
    assert result.bottleneck in ("input", "train step")
    assert result.global_batch_size == 8
    # The configuration `auto` chose on this CPU, reported with the figures.
    assert (result.device, result.policy, result.xla, result.steps_per_execution) == (
        "cpu",
        "float32",
        "off",
        1,
    )

    assert (
        bench_input.main(
            ["--data", dataset_dir, "--global-batch-size", "8", "--seconds", "0.2", "--skip-training"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "input pipeline alone:" in out and "train step on synthetic input:" in out
    assert "is the bottleneck" in out
    assert "policy float32, XLA off, 1 step(s) per execution" in out


@pytest.mark.slow
def test_bench_input_applies_the_precision_and_xla_flags(dataset_dir, capsys):
    args = bench_input.build_parser().parse_args(
        ["--data", dataset_dir, "--global-batch-size", "8", "--seconds", "0.2", "--warmup-batches", "1",
         "--skip-training", "--mixed-precision", "bfloat16", "--jit-compile", "on"]
    )  # fmt: skip
    result = bench_input.run(args)
    assert (result.policy, result.xla) == ("mixed_bfloat16", "keras")
    assert "policy mixed_bfloat16, XLA keras" in capsys.readouterr().out


def test_bench_input_refuses_a_directory_without_a_manifest(tmp_path, capsys):
    assert bench_input.main(["--data", str(tmp_path)]) == 2
    assert "dataset.json" in capsys.readouterr().err
