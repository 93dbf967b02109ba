"""`python -m train.evaluate`: a trained model on a split of its dataset (by default the test split).

    python -m train.evaluate --model-dir MODEL_DIR [--split test] [--data DATA_DIR] [--json]

It reads MODEL_DIR/model.keras (the weights the run shipped: with --ema the
moving average) and the split of the dataset run the model was trained on
(MODEL_DIR/dataset_pin.json, train/data/dataset_pin.py; the data dir recorded in
metrics.json unless --data), through the training's own evaluation pipeline
(every example once, static shapes). It reports accuracy, loss (mean
cross-entropy), per-class precision and recall, and the confusion matrix;
as text, or as one JSON object with --json. While it reads, it holds a lease
on the run (train/dataset_lease.py), so that stage 1's cleanup leaves it alone.

    scores.py   the report from a confusion matrix and a summed loss (numpy only)
    split.py    the model and the split, one evaluation pass (TensorFlow)
    __main__.py the command line
"""
