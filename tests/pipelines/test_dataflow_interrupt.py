"""Ctrl-C while stage 1's Dataflow job runs: the cloud workflow says the job goes on, starts no training,
and exits 130 without a traceback. (Dataflow cannot run here: stage 1's launcher is stood in for by
what it raises then, preprocess.launch.dataflow_job.JobContinuesError; the workflow around it is real.)"""

from google.cloud import storage

from pipelines import dataflow
from preprocess.launch import dataflow_job, launcher


def test_ctrl_c_during_stage_1_says_the_job_goes_on_and_starts_no_training(
    gcs_emulator, gcs_dir, monkeypatch, capsys
):
    def interrupted(config, beam_args):
        raise dataflow_job.JobContinuesError(
            "interrupted: the launcher stops, but Dataflow job J goes on (Ctrl-C does not cancel it); ...\n"
            "  to cancel it: gcloud dataflow jobs cancel J --region europe-west4"
        )

    # Two classes of images: the workflow checks its input before stage 1 (preprocess/inputs/checks.py).
    raw = f"{gcs_dir}/raw".removeprefix(f"gs://{gcs_emulator.bucket}/")
    bucket = storage.Client().bucket(gcs_emulator.bucket)
    for name in ("cat/1.jpg", "dog/1.jpg"):
        bucket.blob(f"{raw}/{name}").upload_from_string(b"\xff\xd8 bytes are not read before stage 1")
    monkeypatch.setattr(launcher, "run", interrupted)
    trained = []
    monkeypatch.setattr(dataflow, "build_package", lambda uri: trained.append(uri))
    code = dataflow.main(
        [
            "--input",
            f"{gcs_dir}/raw",
            "--workdir",
            f"{gcs_dir}/work",
            "--project",
            "p",
            "--region",
            "europe-west4",
            "--zone",
            "europe-west4-a",
            "--tpu",
            "my-tpu",
        ]
    )
    err = capsys.readouterr().err
    assert code == 130
    assert "gcloud dataflow jobs cancel J --region europe-west4" in err
    assert "training was not started" in err
    assert "Traceback" not in err and trained == []
