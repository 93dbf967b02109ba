"""The child's side of the supervisor's no-progress stop: each saved checkpoint step reaches the progress file."""

import os

os.environ.setdefault("TPU_LOAD_LIBRARY", "0")

import keras  # noqa: E402

from train.loop import checkpoints, progress_file  # noqa: E402


def test_each_checkpoint_save_records_its_step_in_the_file_the_supervisor_names(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    monkeypatch.setenv(progress_file.PROGRESS_FILE_ENV, str(path))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    manager = checkpoints.KerasCheckpoints(model, str(tmp_path / "model"))
    assert progress_file.read_saved_step(str(path)) is None
    manager.save(40)
    assert progress_file.read_saved_step(str(path)) == 40
    manager.save(80)
    assert progress_file.read_saved_step(str(path)) == 80
    # Restoring is not progress: a run that restores 80 and saves nothing leaves 80 there.
    path.unlink()
    assert checkpoints.KerasCheckpoints(model, str(tmp_path / "model")).restore_latest() == 80
    assert not path.exists()
    # A non-chief process records its saves too: its own supervisor counts them.
    checkpoints.KerasCheckpoints(model, str(tmp_path / "model"), worker="worker-1").save(120)
    assert progress_file.read_saved_step(str(path)) == 120


def test_without_a_supervisor_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(progress_file.PROGRESS_FILE_ENV, raising=False)
    progress_file.record_saved_step(5)  # no file named: a no-op
    assert progress_file.read_saved_step(str(tmp_path / "absent.json")) is None


def test_the_first_training_step_of_a_run_is_recorded_and_the_supervisor_clears_it_before_the_next(
    tmp_path, monkeypatch
):
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    path = tmp_path / "progress.json"
    progress_file.record_saved_step(300, str(path))  # an earlier run saved step 300
    progress_file.start_run(str(path))  # the supervisor, before this run
    assert progress_file.read_progress(str(path)) == progress_file.Progress(300, False)
    monkeypatch.setenv(progress_file.PROGRESS_FILE_ENV, str(path))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    counter = checkpoints.StepCounter(checkpoints.TrainingProgress(300))
    model.fit(np.zeros((4, 2)), np.zeros((4, 1)), batch_size=2, epochs=1, callbacks=[counter], verbose=0)
    # Stepped, and the saved step kept: a failure from here on is this run's, not the machine's.
    assert progress_file.read_progress(str(path)) == progress_file.Progress(300, True)
