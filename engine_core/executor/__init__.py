"""Runs a scheduled step on the model, in this process or across tensor-parallel ranks.

- factory.py: which executor an engine config asks for.
- uniproc.py: one rank, in the core's own process.
- multiproc.py: rank 0 here, the other ranks in worker processes.
- worker_proc.py: a rank 1..N-1 process (`python -m engine_core.executor.worker_proc`; `nvllm worker` on other nodes).
- rendezvous.py: the store ranks meet at, the engine config they read from it, the process group.
- channel.py: the socket each step's input reaches the other ranks by.
- fatal_errors.py: which failures end the core, and which only fail the step's requests.
"""
