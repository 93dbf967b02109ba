"""The device a run trains on: the tf.distribute strategy, accelerator facts and per-device defaults."""
