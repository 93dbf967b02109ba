"""Training on a Cloud TPU VM, for `python -m pipelines.dataflow`: its runtime, lifecycle, launch,
interpreter and the restart loop (docs/development.md)."""
