"""What this machine is and how the engine uses it.

- device.py: the device and dtype the engine picks.
- cpu_threads.py: how many CPU threads torch and the kernels get, given the machine's load.
- batch_invariance.py: whether this process computes batch-invariantly (the default).
"""
