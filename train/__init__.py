"""Stage 2: train a Keras image classifier on a dataset directory written by stage 1.

The package reads only the dataset directory (`dataset.json` + the shards it
lists) and the shared names in `dataset_contract`; it never imports
`preprocess`. Everything runs the way it must on a TPU: one strategy resolved
once, static shapes, a parallel non-deterministic input pipeline.

    python -m train --data DATA_DIR --model-dir MODEL_DIR [options]

As a library: `train.load_dataset(data_dir, split, batch_size)` returns the
tf.data pipeline training reads (library.py); `--model module:function`
trains your own Keras network (user_model.py).

Training, one job per module:

  config.py        TrainConfig (what was asked) and TrainingPlan (epochs, steps, batch sizes); no TensorFlow
  flags.py         the flags train and bench_input share (parsed before TensorFlow is imported)
  console.py       quiet start-up: log levels, TensorFlow's native start-up lines, pre-import environment
  errors.py        SetupError and its kinds: problems found before the first step
  checks.py        reading dataset.json and checking the dataset before training
  dataset_pin.py   the dataset run a model dir trains on: pinned at the first start, kept by resumes
  dataset_lease.py the lease a training job holds on its dataset run, so that stage 1's cleanup keeps it
  dataset.py       the tf.data input pipeline (train and evaluation)
  augment.py       crops of a crop-margin dataset: random (training), center (evaluation, serving)
  strategy.py      resolving the tf.distribute strategy (TPU local or a multi-host slice), hosts, chief
  accelerator.py   per-device defaults: mixed precision, XLA, steps per execution (a pure function)
  device_defaults.py  the global batch per replica, and the files each host reads at once, by device
  lr_scaling.py    the learning rate's scaling with the batch: linear, or by the square root (AdamW)
  multi_step.py    several steps per execution on multi-replica GPUs: a tf.range loop around strategy.run
  cuda_cache.py    the CUDA JIT cache, persisted and sized before TensorFlow loads
  models.py        the model zoo (a small CNN and keras.applications backbones) with one head
  pretrained.py    the applications, their input conventions, ImageNet / file weights for the backbone
  weights_flag.py  --weights: imagenet, none, or a file, checked before TensorFlow is imported
  preflight.py     the weights checked against the dataset before anything is built
  user_model.py    --model module:function: a user's network with the same input, head and export
  recipe.py        the optimization numbers (learning rate x batch / 256, warmup, weight decay, EMA)
  optimization.py  the Keras optimizer of a recipe: warmup + cosine, decoupled weight decay, EMA
  losses.py        the training loss, with label smoothing
  freeze.py        --freeze-backbone-epochs: the head alone first, then the whole model
  metrics.py       weighted evaluation metrics (padding-proof) and the example counter
  checkpoints.py   step checkpoints (interval, epoch ends, SIGTERM), resume from the latest
  resume_check.py  a resume keeps the checkpoint's batch, length and schedule, or says what differs
  progress_lines.py  what a run prints: its plan, a line per epoch with an ETA, where the export went
  evaluation.py    exact evaluation at epoch ends and every N steps
  summaries.py     TensorBoard scalars (per epoch and per step) and profiles, progress lines
  plots.py         learning_curves.png and confusion_matrix.png
  trainer.py       train_and_evaluate, as its phases: dataset -> run -> model -> fit -> finish
  install_lines.py the install per machine kind (CPU, GPU, TPU VM): pins and pip lines; no TensorFlow
  bench_input.py   python -m train.tools.bench_input: the input pipeline against the train step
  supervisor.py    python -m train.tools.supervisor: restarts training after an interruption (TPU VMs); no TensorFlow
  progress_file.py the last saved checkpoint step and the first step, for the supervisor's limits; no TensorFlow
  run_status.py    the supervisor's status object in the model dir: heartbeat, reason it stopped; no TensorFlow
  tpu_servers.py   python -m train.tools.tpu_servers: a slice's start waits for every worker's TPU server; no TensorFlow
  __main__.py      python -m train: the command line

Serving (serving/): the SavedModel that takes encoded image bytes

  export.py        the serving SavedModel (bytes in, probabilities + label + per-image error out); model.keras
  decode.py        decode/orient/resize of encoded images in TF ops (the serving twin of stage 1)
  image_header.py  format, size and problems of an image from its header bytes, in-graph (the limits)
  exif_orientation.py  the EXIF orientation tag, in-graph
  graph_bytes.py   bounds-safe reads of integers from a string tensor
  warmup.py        TF Serving's warmup requests, written without tensorflow-serving-api

The library surface:

  library.py       train.load_dataset: the training input pipeline for one's own Keras code
  evaluate/        python -m train.evaluate: a trained model on a split (accuracy, loss, per class, confusion)
  predict/         python -m train.predict: image files through an export, one line per file
"""

__all__ = ["load_dataset"]


def __getattr__(name: str):
    # The library surface, imported on first use: `import train` (and `python -m train --help`) must not
    # import TensorFlow.
    if name == "load_dataset":
        from train.library import load_dataset

        return load_dataset
    raise AttributeError(f"module 'train' has no attribute {name!r}")
