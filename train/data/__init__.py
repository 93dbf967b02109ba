"""The input of training: a dataset directory checked, read as tf.data, and kept for the run.

dataset.py        the tf.data pipeline, train and evaluation (the entry: make_train_dataset, make_eval_dataset)
checks.py         reading dataset.json and checking the dataset before the first step
augment.py        crops of a crop-margin dataset: random (training), center (evaluation, serving)
dataset_pin.py    the dataset run a model dir trains on: pinned at the first start, kept by resumes
dataset_lease.py  the lease a training job holds on its run, so that stage 1's cleanup keeps it
"""
