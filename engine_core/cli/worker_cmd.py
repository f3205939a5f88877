"""`nvllm worker`: a node other than node 0 joining a tensor-parallel engine core.

The core runs on node 0 (`nvllm serve` / `nvllm engine-core` with `-tp N --nnodes M
--master-addr ADDR --master-port PORT`); each other node runs
`nvllm worker --nnodes M --node-rank K --master-addr ADDR --master-port PORT`, which starts that
node's N/M ranks. The resolved engine config (engine_core/engine_config.py: model, dtype, ...) comes
from the core through torch.distributed's rendezvous store; `--model` names this host's copy of the model if its path
differs from node 0's.
"""

import argparse

from common.cli.arg_types import add_log_level, positive_int


def run_worker_cmd(ns: argparse.Namespace) -> int:
    import sys

    from engine_core.executor.worker_proc import run_node  # torch enters here

    try:
        return run_node(ns.nnodes, ns.node_rank, ns.master_addr, ns.master_port, ns.model)
    except TimeoutError as e:  # no core to join: a message, not a traceback
        print(f"nvllm worker: error: {e}", file=sys.stderr)
        return 1


def register_worker(sub, formatter) -> None:
    from common.config import EngineArgs

    d = EngineArgs()
    p = sub.add_parser("worker", help="run this node's tensor-parallel ranks for an engine core on node 0",
                       formatter_class=formatter)
    p.add_argument("--nnodes", type=positive_int, required=True, help="hosts the tensor-parallel ranks span")
    p.add_argument("--node-rank", type=int, required=True, help="this host's rank among --nnodes (1 and up)")
    p.add_argument("--master-addr", default=d.master_addr, help="address of node 0 (the engine core)")
    p.add_argument("--master-port", type=int, default=d.master_port, help="rendezvous port on node 0")
    p.add_argument("--model", default=None, help="this host's copy of the model (default: node 0's path)")
    add_log_level(p)
    p.set_defaults(func=run_worker_cmd)
