"""The input pipeline of training: the dataset checks, the tf.data pipeline, the run pinned and leased."""
