"""The serving export of a model trained on the JAX backend, written by a TensorFlow-backend process.

A SavedModel is a TensorFlow graph: only Keras' TensorFlow backend can trace the model into one. So
the JAX process writes the model's architecture (Keras JSON) and its weights (a Keras weights file)
into a scratch directory with the request, and runs

    KERAS_BACKEND=tensorflow python -m train.serving.handoff SCRATCH_DIR

which rebuilds the model, loads the weights and calls export.export_serving_model and
export.save_keras_model, exactly as a TensorFlow-trained run does: the same signature, limits,
warmup requests and lineage, and the same model.keras, so serving does not care which backend
trained. The JAX side only writes files (the weights file of the trained model itself, its
optimizer state ignored on loading): no JAX computation, which on several hosts every process
would have to join.
"""

import json
import os
import sys

ARCHITECTURE_FILE = "model.json"
WEIGHTS_FILE = "model.weights.h5"
REQUEST_FILE = "request.json"
RESULT_FILE = "result.json"


def write_handoff(
    scratch: str, model, manifest: dict, model_dir: str, lineage: dict | None, model_name: str
) -> None:
    """Write what the TensorFlow process needs into `scratch`: architecture, weights, the request."""
    model.save_weights(os.path.join(scratch, WEIGHTS_FILE))
    architecture = json.loads(model.to_json())
    # The layers only: the training recipe's loss and metrics are not needed to serve (nor importable there).
    architecture.pop("compile_config", None)
    with open(os.path.join(scratch, ARCHITECTURE_FILE), "w", encoding="utf-8") as handle:
        json.dump(architecture, handle)
    request = {"manifest": manifest, "model_dir": model_dir, "lineage": lineage, "model": model_name}
    with open(os.path.join(scratch, REQUEST_FILE), "w", encoding="utf-8") as handle:
        json.dump(request, handle)


def read_result(scratch: str) -> dict:
    """{"export_dir", "keras_model"} as the TensorFlow process wrote them."""
    with open(os.path.join(scratch, RESULT_FILE), encoding="utf-8") as handle:
        return json.load(handle)


def export_from_handoff(scratch: str) -> dict:
    """Rebuild the model from `scratch` on the TensorFlow backend; write its SavedModel and model.keras."""
    import keras  # noqa: PLC0415

    from train.config import is_user_model  # noqa: PLC0415
    from train.loop import metrics  # noqa: F401, PLC0415 - registers the package's Keras objects
    from train.model import user_model  # noqa: PLC0415
    from train.serving import export  # noqa: PLC0415

    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            f"the serving export needs Keras' tensorflow backend, not {keras.backend.backend()}"
        )
    with open(os.path.join(scratch, REQUEST_FILE), encoding="utf-8") as handle:
        request = json.load(handle)
    if is_user_model(request["model"]):
        user_model.resolve_function(request["model"])  # imports the module: its custom layers register
    with open(os.path.join(scratch, ARCHITECTURE_FILE), encoding="utf-8") as handle:
        model = keras.models.model_from_json(handle.read())
    model.load_weights(os.path.join(scratch, WEIGHTS_FILE))
    model_dir = request["model_dir"]
    result = {
        "export_dir": export.export_serving_model(
            model, request["manifest"], export.export_path(model_dir), lineage=request["lineage"]
        ),
        "keras_model": export.save_keras_model(model, model_dir, request["manifest"]),
    }
    with open(os.path.join(scratch, RESULT_FILE), "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    return result


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: KERAS_BACKEND=tensorflow python -m train.serving.handoff SCRATCH_DIR", file=sys.stderr)
        return 2
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    from train import console  # noqa: PLC0415

    console.configure(verbose=False)
    console.import_tensorflow(verbose=False)
    export_from_handoff(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
