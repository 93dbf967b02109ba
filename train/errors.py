"""What can stop training before its first step, as exception types.

Every problem that a user can fix by changing the dataset, the flags or the
machine is raised as a SetupError subclass with a message that names the
file or the mismatch; the command line prints the message without a
traceback and exits with status 2. Anything else is a bug and keeps its
traceback.
"""


class SetupError(Exception):
    """A problem found before training starts; the message says what to fix."""


class DatasetError(SetupError):
    """The dataset directory is incomplete, inconsistent or unusable for this model."""


class StrategyError(SetupError):
    """The requested distribution strategy cannot be set up on this machine."""


class ConfigError(SetupError):
    """The flags contradict each other or the dataset (batch size, steps, model)."""
