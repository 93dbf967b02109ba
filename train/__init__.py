"""Stage 2: train a Keras image classifier on a dataset directory written by stage 1.

    python -m train --data DATA_DIR --model-dir MODEL_DIR [options]

It reads only the dataset directory and `dataset_contract`, never `preprocess`. As a library:
`train.load_dataset(data_dir, split)` is the input pipeline training reads, `train.load_model`
and `train.load_image` give a run's model.keras and its inputs to plain Keras, and `--model
module:function` trains your own network. At the top: the command, TrainConfig and its flags,
train_and_evaluate, the library surface; a folder per concern below (data/, device/, model/,
loop/, serving/, tools/, evaluate/, predict/: docs/development.md has the tree).
"""

__all__ = ["load_dataset", "load_image", "load_model"]


def __getattr__(name: str):
    # The library surface, imported on first use: `import train` (and `python -m train --help`) must not
    # import TensorFlow.
    if name in ("load_dataset", "load_model", "load_image"):
        # TensorFlow's native start-up lines (a "failed call to cuInit" that reads as an error) are dropped,
        # unless TF_CPP_MIN_LOG_LEVEL=0 asks for them.
        import os

        from dataset_contract import native_logs

        native_logs.import_tensorflow_quietly(verbose=os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0")
    if name == "load_dataset":
        from train.library import load_dataset

        return load_dataset
    if name in ("load_model", "load_image"):
        from train.serving import keras_model

        return getattr(keras_model, name)
    raise AttributeError(f"module 'train' has no attribute {name!r}")
