"""The device a run trains on: the tf.distribute strategy, chosen once, and what follows from the device.

strategy.py         the strategy (TPU on a VM or a slice, Mirrored, MultiWorkerMirrored), hosts, chief (the entry)
accelerator.py      what runs fast on the device: mixed precision, XLA, steps per execution
device_defaults.py  the batch per replica and the files each host reads at once, by device; no TensorFlow
cuda_cache.py       the CUDA JIT cache, persisted and sized before TensorFlow loads
"""
