"""The collectives a sharded model calls inside a step (torch.distributed), below the layers.

- parallel_state.py: this rank, the group's size, all-reduce and gather, how heads and rows split.
- block_agreement.py: every rank agrees on the smallest KV cache that fits all of them.

How ranks start and talk between steps (the rendezvous, the step channel) is the executor's (executor/).
"""
