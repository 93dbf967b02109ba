"""Commands around training (`python -m train.tools.NAME`) and the status object the supervisor keeps.

bench_input.py  which is the bottleneck: the input pipeline or the train step
supervisor.py   keeps training running on a TPU VM: restarts it after an interruption; no TensorFlow
tpu_servers.py  a slice's start waits for every worker's TPU server; no TensorFlow
run_status.py   the supervisor's status object in the model dir (heartbeat, why it stopped); no TensorFlow
"""
