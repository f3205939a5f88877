"""The torch side of the benchmarks: what builds or runs models outside the engine."""
