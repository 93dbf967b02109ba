"""The run around Keras' fit: its plan, steps, checkpoints, evaluation and telemetry.

plan.py            TrainingPlan: epochs, steps and batch sizes resolved from the config (the entry); no TensorFlow
multi_step.py      several steps per execution on multi-replica GPUs: a tf.range loop around strategy.run
checkpoints.py     step checkpoints, Keras-native on both backends (interval, epoch ends, SIGTERM), resuming from the latest
resume_check.py    a resume keeps the checkpoint's batch, length and schedule, or says what differs
evaluation.py      exact evaluation at epoch ends and every N steps
metrics.py         weighted evaluation metrics (padding-proof) and the example counter
summaries.py       TensorBoard scalars and profiles
progress_lines.py  what a run prints: its plan, a line per epoch with an ETA, where the export went
learned_nothing.py the warning for a model that predicts one class or a uniform guess, with what to try
progress_file.py   the last saved step, for the supervisor's no-progress stop; no TensorFlow
plots.py           learning_curves.png and confusion_matrix.png
"""
