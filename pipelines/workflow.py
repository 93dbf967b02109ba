"""The two-stage batch workflow, defined once: preprocess, check, train."""

import dataclasses
import logging
from collections.abc import Callable

from dataset_contract import manifest as manifest_lib
from train.errors import DatasetError

# The stages themselves (TensorFlow, Beam, tf.Transform: ~8 s to import) are imported where they run,
# so that the commands built on this module answer --help and bad flags at once.

log = logging.getLogger(__name__)

DATASET_SUBDIR = "dataset"
MODEL_SUBDIR = "model"


class WorkflowError(Exception):
    """A stage failed or its output cannot be used; the message says which and what to do."""


@dataclasses.dataclass(frozen=True)
class WorkflowPaths:
    """Where a workflow keeps its stages' outputs: WORKDIR/dataset and WORKDIR/model."""

    workdir: str

    @property
    def dataset_dir(self) -> str:
        return manifest_lib.join(self.workdir.rstrip("/"), DATASET_SUBDIR)

    @property
    def model_dir(self) -> str:
        return manifest_lib.join(self.workdir.rstrip("/"), MODEL_SUBDIR)


def check_stage1_output(dataset_dir: str) -> dict:
    """The manifest of a complete, usable dataset; WorkflowError otherwise."""
    from train.data import checks  # noqa: PLC0415 - see the imports

    try:
        manifest = checks.read_manifest(dataset_dir)
        # The splits training reads must be non-empty, and every shard of
        # every split present at its listed size.
        splits = [manifest_lib.TRAIN, manifest_lib.VALIDATION]
        if manifest["splits"].get(manifest_lib.TEST, {}).get("shards"):
            splits.append(manifest_lib.TEST)
        checks.check_dataset(dataset_dir, manifest, splits=splits)
    except DatasetError as exc:
        raise WorkflowError(f"stage 1 output is not a usable dataset: {exc}") from exc
    return manifest


def run_stage1(preprocess_argv: list[str]) -> dict | None:
    """Runs stage 1 and waits for it; returns its run's manifest. WorkflowError if it fails, or if a
    newer run of stage 1 into the same directory superseded it (training would not read this run)."""
    from preprocess import options  # noqa: PLC0415 - see the imports
    from preprocess.launch import launcher  # noqa: PLC0415 - see the imports
    from preprocess.publish.commit import SupersededRunError  # noqa: PLC0415 - see the imports

    log.info("stage 1: python -m preprocess %s", " ".join(preprocess_argv))
    try:
        # Both workflows check the input before stage 1 (local.precheck_problem, dataflow.precheck_problem).
        return launcher.run(*options.parse_args(preprocess_argv))
    except SupersededRunError as exc:
        raise WorkflowError(
            f"stage 1 (preprocess) was superseded, so training will not start: {exc}"
        ) from exc
    except Exception as exc:
        raise WorkflowError(f"stage 1 (preprocess) failed, so training will not start: {exc}") from exc


def already_built(dataset_dir: str, preprocess_argv: list[str]) -> dict | None:
    """The published manifest when it was built from these stage 1 flags and these inputs (the fingerprint
    stage 1 would record now, from its own pipeline.job_config), else None."""
    from preprocess import options, pipeline  # noqa: PLC0415 - see the imports
    from preprocess.publish.commit import read_published_manifest  # noqa: PLC0415 - see the imports
    from preprocess.publish.fingerprint import compute_fingerprint, published_fingerprint  # noqa: PLC0415

    manifest = read_published_manifest(dataset_dir)
    recorded = published_fingerprint(manifest)
    if recorded is None:
        return None
    config, _ = options.parse_args(preprocess_argv)
    return (
        manifest
        if recorded == compute_fingerprint(pipeline.job_config(config, build_id=""))["sha256"]
        else None
    )


def skip_preprocess_problem(argv: list[str], stage1_flags, dataset_dir: str, more=()) -> str | None:
    """The `stage1_flags` given in `argv` (as --flag VALUE or --flag=VALUE) with --skip-preprocess, then `more`,
    said as a mistake; None when there is none."""
    given = {token.split("=", 1)[0] for token in argv if token.startswith("--")}
    flags = [flag for flag in stage1_flags if flag in given] + list(more)
    if not flags:
        return None
    return (
        f"{', '.join(flags)} given with --skip-preprocess, which reuses {dataset_dir} as it is: they would change "
        "nothing. Drop them, or drop --skip-preprocess to build the dataset with them (the same command with the "
        "same flags skips stage 1 by itself when the dataset was built from them)."
    )


def check_model_dir_is_new(model_dir: str, stage1_changes: list[str] | None = None) -> None:
    """WorkflowError if `model_dir` already holds a model (its checkpoints or its dataset pin), asked before
    stage 1; `stage1_changes`: what differs from the published dataset's build (named in the message)."""
    import tensorflow as tf  # noqa: PLC0415 - see the imports (a gs:// model dir needs its filesystem)

    from train.data import dataset_pin  # noqa: PLC0415 - see the imports
    from train.loop.checkpoints import CHECKPOINT_DIR  # noqa: PLC0415 - see the imports

    held = [
        name
        for name in (dataset_pin.PIN_FILE, CHECKPOINT_DIR)
        if tf.io.gfile.exists(manifest_lib.join(model_dir, name))
    ]
    if held:
        why = (
            f"({'; '.join(stage1_changes)})"
            if stage1_changes
            else "(the inputs or the stage 1 flags differ from what the published one was built from, or there "
            "is none)"
        )
        raise WorkflowError(
            f"{model_dir} already holds a model ({', '.join(held)}), trained on the dataset run it started on; "
            f"stage 1 would build a new dataset {why}, which that model would not train on. "
            "To train a new model on a new dataset, remove that directory or use another --workdir; "
            "to resume or finish that model on its own dataset, run with the stage 1 flags it was built with, "
            "or with --skip-preprocess and no stage 1 flags"
        )


def run_workflow(
    *,
    dataset_dir: str,
    preprocess_argv: list[str] | None,
    launch_training: Callable[[dict], object],
    model_dir: str | None = None,
    skip_if_built: bool = False,
    describe_stage1_changes: Callable[[dict | None], list[str]] | None = None,
):
    """Stage 1 (unless `preprocess_argv` is None, or `skip_if_built` and already_built), the check, stage 2;
    returns (manifest, launch_training(manifest)). With stage 1 to run, `model_dir` must hold no model yet."""
    if preprocess_argv is not None and skip_if_built:
        built = already_built(dataset_dir, preprocess_argv)
        if built is not None:
            print(
                f"Stage 1 skipped: {dataset_dir} (run {built['run']['id']}) was built from these inputs with "
                "these stage 1 flags."
            )
            preprocess_argv = None
    if preprocess_argv is not None and model_dir is not None:
        changes = None
        if describe_stage1_changes is not None:
            from preprocess.publish.commit import read_published_manifest  # noqa: PLC0415 - see the imports

            changes = describe_stage1_changes(read_published_manifest(dataset_dir))
        check_model_dir_is_new(model_dir, changes)
    own = run_stage1(preprocess_argv) if preprocess_argv is not None else None
    manifest = check_stage1_output(dataset_dir)
    if own is not None and manifest["run"]["id"] != own["run"]["id"]:
        raise WorkflowError(
            f"stage 1 published run {own['run']['id']}, but run {manifest['run']['id']}, which started later, "
            f"has published into {dataset_dir} since; training will not start on another run's dataset"
        )
    log.info("stage 1 output checked: %s", manifest_lib.join(dataset_dir, manifest_lib.MANIFEST_FILE))
    return manifest, launch_training(manifest)
