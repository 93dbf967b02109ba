"""Training on a Cloud TPU VM, for `python -m pipelines.dataflow`.

runtime.py      which TPU VM software version a run gets, from the accelerator type and TensorFlow
lifecycle.py    what the VM is created with (spot, Autocheckpoint, a boot script) and what it survives
launch.py       the commands that install this package on the VM and start training there, supervised
interpreter.py  the [tpu] venv the on-VM mode trains in
restart.py      python -m pipelines.tpu.restart: recreates a preempted spot TPU until training ends
"""
