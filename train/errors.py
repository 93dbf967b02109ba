"""What can stop training, as exception types.

Every problem that a user can fix by changing the dataset, the flags or the
machine is raised before the first step as a SetupError subclass with a
message that names the file or the mismatch; the command line prints the
message without a traceback and exits with status 2. A run stopped by
SIGTERM raises TrainingPreempted once its checkpoint is saved (exit status
143). Anything else is a bug and keeps its traceback.
"""


class SetupError(Exception):
    """A problem found before training starts; the message says what to fix."""


class DatasetError(SetupError):
    """The dataset directory is incomplete, inconsistent or unusable for this model."""


class StrategyError(SetupError):
    """The requested distribution strategy cannot be set up on this machine."""


class ConfigError(SetupError):
    """The flags contradict each other or the dataset (batch size, steps, model)."""


class TrainingPreempted(Exception):
    """Training stopped on SIGTERM, SIGHUP or SIGINT after saving a checkpoint at `step`; the same command resumes it."""

    def __init__(self, step: int, checkpoint_dir: str, signal_name: str | None = None):
        super().__init__(
            f"stopped by {signal_name or 'SIGTERM'} at step {step}, checkpoint saved in {checkpoint_dir}"
        )
        self.step = step
        self.checkpoint_dir = checkpoint_dir
        self.signal_name = signal_name
