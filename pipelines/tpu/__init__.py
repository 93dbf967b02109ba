"""Training on a Cloud TPU VM: its runtime, creation, launch, interpreter and restart after preemption."""
