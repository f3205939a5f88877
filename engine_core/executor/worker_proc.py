"""Tensor-parallel worker: one process per rank 1..N-1 (rank 0 lives in the core process).

`python -m engine_core.executor.worker_proc --master-addr A --master-port P --rank R --parent-pid PID`
joins the core's rendezvous store, reads the resolved EngineConfig from it, joins the process
group, loads its shard of the model, agrees on the KV cache size, then runs every StepInput the
core publishes until told to quit. It dies with its parent and exits when the core goes silent.

`run_node` is what `nvllm worker` runs on nodes other than node 0: it starts that node's ranks
and exits when they do.
"""

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

import msgspec
import torch
import zmq

from common.child_process import spawn_module
from engine_core.executor import channel
from engine_core.executor import rendezvous as rdv
from engine_core.distributed.block_agreement import agree_on_num_blocks
from engine_core.engine_config import EngineConfig
from engine_core.worker.step_input import StepInput

logger = logging.getLogger("nvllm")



def spawn_worker(master_addr: str, master_port: int, rank: int, model: str | None = None) -> subprocess.Popen:
    """A fresh interpreter for one rank, its arguments on the command line as plain text."""
    args = ["--master-addr", master_addr, "--master-port", str(master_port), "--rank", str(rank),
            "--parent-pid", str(os.getpid()), "--log-level", _log_level_name()]
    return spawn_module("engine_core.executor.worker_proc", args + (["--model", model] if model is not None else []))


def _log_level_name() -> str:
    name = logging.getLevelName(logging.getLogger("nvllm").getEffectiveLevel())
    return name if name in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") else "INFO"


class Worker:
    def __init__(self, store, config: EngineConfig, rank: int, parent_pid: int | None):
        self.rank = rank
        self.parent_pid = parent_pid
        self.config = config
        self.layout = rdv.Layout.of_rank(config.parallel.tensor_parallel_size, config.parallel.nnodes, rank)
        self.ctx = zmq.Context()
        self.steps = channel.step_subscriber(self.ctx, store.get(rdv.KEY_STEP_ADDR).decode())
        self.status = channel.status_sender(self.ctx, store.get(rdv.KEY_STATUS_ADDR).decode())
        self.status_lock = threading.Lock()
        self.stopping = threading.Event()
        self.send("hello")
        self.heartbeat = threading.Thread(target=self._heartbeat, name=f"nvllm-rank{rank}-heartbeat", daemon=True)
        self.heartbeat.start()

    def start(self, store) -> None:
        """Join the process group, load this rank's shard, agree on the KV cache size with the others."""
        from engine_core.worker.model_runner import ModelRunner

        rank = self.rank
        device = rdv.rank_device(self.config.device, rank, self.layout.per_node)
        if device.type == "cpu":
            torch.set_num_threads(rdv.cpu_threads_per_rank(self.layout.per_node))
        rdv.init_process_group(store, rank, self.layout.world_size, device)
        self.runner = ModelRunner(self.config)
        self.send("ready")
        num_blocks = agree_on_num_blocks(self.runner)  # rank 0 takes part in its num_blocks_for_budget
        self.runner.allocate_kv_cache(num_blocks)
        logger.info("rank %d ready: %d KV blocks, %d torch threads", rank, num_blocks, torch.get_num_threads())

    def send(self, kind: str, **fields) -> None:
        with self.status_lock:
            self.status.send(channel.status_encoder.encode(channel.WorkerStatus(self.rank, kind, **fields)))

    def _heartbeat(self) -> None:
        while not self.stopping.wait(rdv.HEARTBEAT_SECONDS):
            self.send("heartbeat")

    def run(self) -> int:
        decoder = msgspec.msgpack.Decoder(StepInput)
        silence = rdv.heartbeat_timeout()
        last_heard = time.monotonic()
        while True:
            if not self.steps.poll(1000):
                if not rdv.parent_alive(self.parent_pid):
                    logger.error("rank %d: the process that started it is gone; exiting", self.rank)
                    return 1
                if time.monotonic() - last_heard > silence:
                    logger.error("rank %d: no word from the engine core for %.0f s; exiting", self.rank, silence)
                    return 1
                continue
            kind, body = self.steps.recv_multipart()
            last_heard = time.monotonic()
            if kind == channel.STEP:
                self.runner.forward_step(decoder.decode(body))
            elif kind == channel.QUIT:
                self.send("bye")
                return 0

    def close(self) -> None:
        self.stopping.set()
        rdv.destroy_process_group()
        self.steps.close(linger=0)
        self.status.close()  # lingers long enough to deliver a last error or bye
        self.ctx.term()


def run_worker(master_addr: str, master_port: int, rank: int, parent_pid: int | None, model: str | None) -> int:
    rdv.die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the core, which stops its workers
    store = rdv.client_store(master_addr, master_port)
    config = rdv.read_config(store)
    if model is not None:  # this host's own copy of the model the core resolved
        from engine_core.weights.model_resolver import resolve_model
        config = config.with_model_path(resolve_model(model))
    worker = None
    try:
        worker = Worker(store, config, rank, parent_pid)
        worker.start(store)
        return worker.run()
    except Exception as e:
        logger.error("rank %d failed: %s", rank, traceback.format_exc())
        if worker is not None:
            worker.send("error", message=f"{type(e).__name__}: {e}")
        else:  # failed before the status channel was up: tell the core on a channel of its own
            _report_early_failure(store, rank, e)
        return 1
    finally:
        if worker is not None:
            worker.close()


def _report_early_failure(store, rank: int, error: Exception) -> None:
    try:
        ctx = zmq.Context()
        sock = channel.status_sender(ctx, store.get(rdv.KEY_STATUS_ADDR).decode())
        sock.send(channel.status_encoder.encode(channel.WorkerStatus(rank, "error", message=f"{type(error).__name__}: {error}")))
        sock.close()
        ctx.term()
    except Exception:  # the core will see this rank's process exit instead
        pass


def run_node(nnodes: int, node_rank: int, master_addr: str, master_port: int, model: str | None = None) -> int:
    """Start this node's tensor-parallel ranks for the core on node 0, and wait for them."""
    if node_rank == 0:
        raise ValueError("node 0 runs the engine core itself (nvllm serve / nvllm engine-core with --nnodes); "
                         "`nvllm worker` is for --node-rank 1 and up")
    logger.info("node %d: waiting for the engine core at %s:%d", node_rank, master_addr, master_port)
    store = rdv.client_store(master_addr, master_port)
    parallel = rdv.read_config(store).parallel
    if parallel.nnodes != nnodes:
        raise ValueError(f"the engine core runs with --nnodes {parallel.nnodes}, this node was given --nnodes {nnodes}")
    layout = rdv.Layout(parallel.tensor_parallel_size, nnodes, node_rank)
    del store
    procs = {rank: spawn_worker(master_addr, master_port, rank, model) for rank in layout.local_ranks}
    logger.info("node %d: started ranks %s of %d", node_rank, list(procs), layout.world_size)
    try:
        while True:
            codes = {rank: p.poll() for rank, p in procs.items()}
            failed = {rank: code for rank, code in codes.items() if code not in (None, 0)}
            if failed:
                logger.error("node %d: rank(s) %s exited with %s; stopping this node's other ranks",
                             node_rank, list(failed), list(failed.values()))
                return 1
            if all(code == 0 for code in codes.values()):
                logger.info("node %d: the engine core finished; all ranks exited", node_rank)
                return 0
            time.sleep(0.5)
    except KeyboardInterrupt:
        return 130
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        for p in procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine_core.executor.worker_proc")
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--model", default=None, help="this host's copy of the model (default: the core's path)")
    parser.add_argument("--log-level", default="INFO")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s nvllm-rank{ns.rank}: %(message)s")
    return run_worker(ns.master_addr, ns.master_port, ns.rank, ns.parent_pid, ns.model)


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the sockets and the process group are closed: skip the slow interpreter teardown
