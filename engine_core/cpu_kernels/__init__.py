"""nvllm's CPU kernels: one folder per operation (linear/, attention/, ops/, decoder/), each holding its C sources
and the ctypes binding that loads them (a torch-facing module named as the source it binds); here, the tier
detection (tiers.py), the build (build.py) and the table of which kernel serves which operation on which tier
(table.py). The bindings ask table.load for their library; nothing outside this package loads one."""
