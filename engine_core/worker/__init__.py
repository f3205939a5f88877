"""One rank's side of a step: from the scheduler's output to sampled tokens.

- model_runner.py: loads the model, owns the KV cache, runs one step and samples.
- step_input.py: a step's model input (token ids, positions, slot mapping) built from the scheduler's output.
- cuda_graph.py: captured decode steps on CUDA.
"""
