"""nvllm's CPU kernels: C sources by operation (linear/, attention/, ops/, decoder/), the tier detection
(tiers.py), the build (build.py) and the table of which kernel serves which operation on which tier
(table.py). The torch layers' ctypes wrappers (engine_core/layers/cpu_*.py, attention/cpu_*.py,
cpu_kernels/decoder/loop_avx512_bf16.py) ask table.load for their library."""
