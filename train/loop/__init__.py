"""The training loop around Keras fit: steps, checkpoints, evaluation and telemetry."""
