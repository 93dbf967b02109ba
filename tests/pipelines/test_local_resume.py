"""`python -m pipelines.local` run again with the same command resumes: stage 1 is skipped when the published
dataset was built from the same inputs and stage 1 flags (the manifest's build fingerprint), and training
goes on from its checkpoint. What cannot work is refused before anything is spent."""

import os
import shutil

import keras
import pytest

from pipelines import local, workflow
from tests.stage1 import read_manifest, write_corpus
from tests.train.checkpoint_files import rewind_checkpoints
from train.model import pretrained


def test_stage1_flags_with_skip_preprocess_are_refused(tmp_path, capsys):
    workdir = tmp_path / "work"
    code = local.main(
        ["--workdir", str(workdir), "--skip-preprocess", "--image-size", "40", "--encoding=jpeg"]
    )
    error = capsys.readouterr().err
    assert code == 2 and "--image-size, --encoding given with --skip-preprocess" in error
    assert not workdir.exists()


def test_weights_that_cannot_load_are_refused_before_stage1(tmp_path, capsys, monkeypatch):
    workdir = tmp_path / "work"
    unknown_model = local.main(["--workdir", str(workdir), "--model", "resnet"])
    assert (
        unknown_model == 2
        and "--model resnet: no such model (did you mean resnet50?)" in capsys.readouterr().err
    )
    missing = local.main(["--workdir", str(workdir), "--weights", str(tmp_path / "nope.weights.h5")])
    assert missing == 2 and "no such file" in capsys.readouterr().err
    # ImageNet weights neither in Keras' cache nor downloadable (the network is what cannot run here).
    monkeypatch.setattr(keras.src.backend.config, "_KERAS_DIR", str(tmp_path / "keras"))
    monkeypatch.setattr(pretrained, "origin_unreachable", lambda origin, timeout=0: "offline")
    offline = local.main(
        [
            "--workdir",
            str(workdir),
            "--model",
            "mobilenetv3small",
            "--weights",
            "imagenet",
            "--image-size",
            "32",
        ]
    )
    error = capsys.readouterr().err
    assert offline == 2 and "weights_mobilenet_v3_small_224_1.0_float_no_top_v2.h5" in error
    assert "--weights PATH" in error
    assert not workdir.exists()  # before the sample corpus, before stage 1


@pytest.mark.slow
def test_the_same_command_again_skips_stage1_and_resumes_training(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus", images_per_class=6, include_broken=False)
    workdir = tmp_path / "work"
    argv = ["--input", corpus.root, "--workdir", str(workdir), "--image-size", "32", "--steps", "4",
            "--global-batch-size", "8", "--workers", "1"]  # fmt: skip
    assert local.main(argv) == 0
    built = read_manifest(workdir / "dataset")
    files = sum(len(names) for _, _, names in os.walk(corpus.root))
    assert built["build"]["fingerprint"]["num_input_files"] == files
    capsys.readouterr()

    # As an interruption after the first epoch leaves it: its checkpoint is the latest, no metrics.json.
    rewind_checkpoints(workdir / "model", 2)
    os.remove(workdir / "model" / "metrics.json")

    assert local.main(argv) == 0
    printed = capsys.readouterr().out
    assert "Stage 1 skipped" in printed and "resuming from step 2 of 4" in printed
    assert read_manifest(workdir / "dataset")["run"]["id"] == built["run"]["id"]  # no new run published
    assert os.path.exists(workdir / "model" / "metrics.json")

    # Another stage 1 flag would build another dataset, which that model would not train on: refused first.
    other_size = [
        ("40" if previous == "--image-size" else value)
        for previous, value in zip(["", *argv], argv, strict=False)
    ]
    assert local.main(other_size) == 2
    error = capsys.readouterr().err
    # The refusal names the stage 1 flag that differs, with the dataset's value.
    assert "already holds a model" in error and "--image-size 40 (the dataset's: 32)" in error
    assert read_manifest(workdir / "dataset")["run"]["id"] == built["run"]["id"]

    # A longer run of the same model dir: refused by train's plan check, with flags pipelines.local takes.
    longer = [
        ("6" if previous == "--steps" else value) for previous, value in zip(["", *argv], argv, strict=False)
    ]
    assert local.main(longer) == 2
    error = capsys.readouterr().err
    assert "To resume it: the same command with --steps 4" in error, error
    assert "--steps-per-epoch 2" not in error and "with --warmup-steps" not in error

    # Other inputs are another fingerprint.
    stage1_argv = local.preprocess_argv(
        local.build_parser().parse_args(argv), corpus.root, str(workdir / "dataset")
    )
    assert workflow.already_built(str(workdir / "dataset"), stage1_argv) is not None
    first_class = sorted(os.listdir(corpus.root))[0]
    some_image = sorted(os.listdir(os.path.join(corpus.root, first_class)))[0]
    shutil.copy(
        os.path.join(corpus.root, first_class, some_image), os.path.join(corpus.root, first_class, "new.png")
    )
    assert workflow.already_built(str(workdir / "dataset"), stage1_argv) is None
