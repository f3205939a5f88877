"""Tensor-parallel executor: rank 0 in the core process, ranks 1..N-1 in worker processes.

Start-up: rank 0 serves the rendezvous store (torch.distributed's TCPStore) and puts the resolved
EngineConfig (msgpack) and the channel addresses in it, starts this node's workers (`python -m
engine_core.executor.worker_proc`), waits until every rank has checked in (other nodes start theirs with `nvllm
worker`), then all ranks join the process group, load their shards, and agree on the smallest KV block
count any rank can hold (distributed/block_agreement.py).

Each step: rank 0 builds the StepInput (plain lists), publishes it msgpack-encoded to every worker,
and runs the same forward pass; the all-reduces inside the model keep the ranks in lock step, the
LM head gathers logits on rank 0, and rank 0 samples. Nothing comes back from the workers but
status (hello, ready, heartbeat, error, bye).

Faults: a monitor thread watches the local worker processes, the workers' heartbeats and error
reports, and records the first failure. A failed rank makes the next (or current) step raise
TensorParallelError naming it; a step blocked in a collective when a rank dies ends when the
collective fails (a dead peer's connection closes) or times out, and then waits a moment on the
recorded failure to name the rank. If the core is idle, the monitor calls the wake-up the core
registered (`on_failure`): the core process's busy loop wakes, calls `check_health`, and exits
non-zero within seconds instead of waiting for the next request. No signals: the core process
owns those (SIGTERM/SIGINT).
"""

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable

import msgspec
import torch
import zmq

from common.wire_messages import MALFORMED
from engine_core.executor import channel
from engine_core.executor import rendezvous as rdv
from engine_core.distributed.block_agreement import agree_on_num_blocks
from engine_core.engine_config import EngineConfig
from engine_core.executor.fatal_errors import FatalEngineError
from engine_core.worker.model_runner import ModelRunner
from engine_core.sched.scheduler import SchedulerOutput
from engine_core.worker.step_input import StepResult, build_step_input
from engine_core.executor.worker_proc import spawn_worker

logger = logging.getLogger("nvllm")


class TensorParallelError(FatalEngineError):
    """A tensor-parallel rank failed; the engine cannot run another step."""


def _exit_description(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class MultiprocExecutor:
    def __init__(self, config: EngineConfig):
        parallel = config.parallel
        self.layout = rdv.Layout(parallel.tensor_parallel_size, parallel.nnodes, parallel.node_rank)
        if parallel.node_rank != 0:
            raise ValueError(f"the engine core runs on node 0, not --node-rank {parallel.node_rank}; "
                             "start the other nodes' ranks with `nvllm worker`")
        self.block_size = config.block_size
        self.world_size = self.layout.world_size
        self.peers = range(1, self.world_size)
        self.failure: str | None = None  # the first failure the monitor saw; the executor is dead from then on
        self.wake: Callable[[], None] | None = None
        self.closing = False
        self.procs: dict[int, subprocess.Popen] = {}
        self.hello: set[int] = set()
        self.ready: set[int] = set()
        self.bye: set[int] = set()
        self.last_seen: dict[int, float] = {}
        self.cond = threading.Condition()
        self.pub_lock = threading.Lock()
        self.encoder = msgspec.msgpack.Encoder()
        self.threads_before = torch.get_num_threads()
        self.ctx = zmq.Context()
        self.store = None
        self.runner = None
        self.monitor = None
        self.stop_monitor = threading.Event()
        try:
            self._start(config)
        except BaseException:
            self.shutdown()
            raise

    # ---- start-up ---------------------------------------------------------------------------

    def _start(self, config: EngineConfig) -> None:
        multinode = self.layout.nnodes > 1
        host = config.parallel.master_addr if multinode else "127.0.0.1"
        self.pub = channel.step_publisher(self.ctx)
        self.pull = channel.status_receiver(self.ctx)
        step_addr = channel.bind_address(self.pub, host if multinode else None)
        status_addr = channel.bind_address(self.pull, host if multinode else None)
        # one host: a free port, so several engines can run side by side; several: the agreed port
        self.store = rdv.master_store(host, config.parallel.master_port if multinode else 0)
        self.master = (host, self.store.port)
        rdv.publish_config(self.store, config)  # every rank computes with what rank 0 resolved
        self.store.set(rdv.KEY_STEP_ADDR, step_addr)
        self.store.set(rdv.KEY_STATUS_ADDR, status_addr)

        self.monitor = threading.Thread(target=self._monitor, name="nvllm-tp-monitor", daemon=True)
        self.monitor.start()
        for rank in self.layout.local_ranks:
            if rank != 0:
                self.procs[rank] = spawn_worker(host, self.store.port, rank)
        self._wait_for_hello(rdv.init_timeout())

        device = rdv.rank_device(config.device, 0, self.layout.per_node)
        if device.type == "cpu":
            torch.set_num_threads(rdv.cpu_threads_per_rank(self.layout.per_node))
        rdv.init_process_group(self.store, 0, self.world_size, device)
        self.runner = ModelRunner(config)
        self._wait(lambda: len(self.ready) == len(self.peers), None, "load their shards of the model")
        self._wait_for_subscribers(rdv.init_timeout())
        logger.info("tensor parallel: %d ranks on %d node(s) ready (%s, %d torch threads per rank)",
                    self.world_size, self.layout.nnodes, "nccl" if device.type == "cuda" else "gloo",
                    torch.get_num_threads())

    def _wait(self, done, timeout: float | None, what: str) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while not done():
                if self.failure is not None:
                    raise TensorParallelError(self.failure)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(self._missing_message(what, timeout))
                self.cond.wait(0.2)

    def _wait_for_hello(self, timeout: float) -> None:
        self._wait(lambda: len(self.hello) == len(self.peers), timeout, "check in")

    def _missing_message(self, what: str, timeout: float) -> str:
        missing = [r for r in self.peers if r not in self.hello]
        text = f"tensor-parallel rank(s) {missing} did not {what} within {timeout:.0f} s"
        remote = [r for r in missing if r not in self.layout.local_ranks]
        if remote:
            nodes = sorted({r // self.layout.per_node for r in remote})
            host, port = self.master
            text += (f"; start them with `nvllm worker --nnodes {self.layout.nnodes} --node-rank N "
                     f"--master-addr {host} --master-port {port}` for node(s) {nodes}")
        return text + f" (time-out: {rdv.INIT_TIMEOUT_ENV})"

    def _wait_for_subscribers(self, timeout: float) -> None:
        """Every worker's SUB socket is connected, so no step is published into the void."""
        deadline, subscribed = time.monotonic() + timeout, 0
        while subscribed < len(self.peers):
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {subscribed} of {len(self.peers)} workers subscribed to the step channel")
            with self.pub_lock:
                if self.pub.poll(100):
                    if self.pub.recv()[:1] == b"\x01":
                        subscribed += 1

    # ---- monitor thread ---------------------------------------------------------------------

    def _monitor(self) -> None:
        try:
            self._monitor_loop()
        except Exception as e:  # never die silently: without the monitor, faults would go unseen
            logger.exception("tensor-parallel monitor failed")
            self._fail(f"the tensor-parallel monitor failed: {e}")

    def _monitor_loop(self) -> None:
        last_heartbeat = 0.0
        silence = rdv.heartbeat_timeout()
        while not self.stop_monitor.is_set():
            self._drain_status(200)
            now = time.monotonic()
            for rank, proc in list(self.procs.items()):
                code = proc.poll()
                if code is not None and not (self.closing or rank in self.bye):
                    self._drain_status(100)  # its last error report may still be in flight
                    self._fail(f"tensor-parallel worker rank {rank} (pid {proc.pid}) exited with "
                               f"{_exit_description(code)}")
            for rank, seen in list(self.last_seen.items()):
                if now - seen > silence and rank not in self.bye:
                    self._fail(f"tensor-parallel rank {rank} sent no heartbeat for {now - seen:.0f} s")
            if now - last_heartbeat >= rdv.HEARTBEAT_SECONDS and not self.closing:
                with self.pub_lock:
                    self.pub.send_multipart([channel.HEARTBEAT, b""])
                last_heartbeat = now

    def _drain_status(self, timeout_ms: int) -> None:
        if not self.pull.poll(timeout_ms):
            return
        while True:
            try:
                frame = self.pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = channel.status_decoder.decode(frame)
            except MALFORMED as e:
                logger.warning("dropped a malformed worker status frame: %s", e)
                continue
            with self.cond:
                self.last_seen[msg.rank] = time.monotonic()
                if msg.kind == "hello":
                    self.hello.add(msg.rank)
                elif msg.kind == "ready":
                    self.ready.add(msg.rank)
                elif msg.kind == "bye":
                    self.bye.add(msg.rank)
                elif msg.kind == "error":
                    self._fail(f"tensor-parallel rank {msg.rank} failed: {msg.message}")
                self.cond.notify_all()

    def _fail(self, reason: str) -> None:
        with self.cond:
            if self.failure is not None or self.closing:
                return
            self.failure = reason
            self.cond.notify_all()
            wake = self.wake
        logger.error("%s; the engine stops", reason)
        if wake is not None:
            wake()

    # ---- the executor interface -------------------------------------------------------------

    def num_blocks_for_budget(self) -> tuple[int, int]:
        """(blocks every rank can hold, rank 0's bytes per block: it holds the most heads)."""
        return agree_on_num_blocks(self.runner), self.runner.kv_bytes_per_block()

    def prompt_arithmetic(self) -> bool:
        """False: tensor-parallel ranks run the decoder as modules, one arithmetic for every row
        (cpu_kernels/decoder/)."""
        return False

    def initialize_cache(self, num_blocks: int) -> None:
        self.runner.allocate_kv_cache(num_blocks)  # the workers allocated the same count after agreeing on it

    def on_failure(self, wake: Callable[[], None]) -> None:
        """`wake()` is called once, from the monitor thread, when a rank fails (at once if one has):
        it must only wake the caller's loop, which then calls check_health."""
        with self.cond:
            self.wake = wake
            failed = self.failure is not None
        if failed:
            wake()

    def check_health(self) -> None:
        """Raises TensorParallelError naming the failed rank once the monitor has seen one."""
        if self.failure is not None:
            raise TensorParallelError(self.failure)

    def execute_model(self, out: SchedulerOutput) -> StepResult:
        self.check_health()
        planned = build_step_input(out, self.block_size)
        try:
            with self.pub_lock:
                self.pub.send_multipart([channel.STEP, self.encoder.encode(planned.step)])
            logits, scored, hidden = self.runner.forward_step(planned.step)
        except Exception as e:
            raise self._step_failed(e) from e
        self.check_health()
        return self.runner.finish_step(planned, logits, scored, hidden)

    def _step_failed(self, error: Exception) -> TensorParallelError:
        """A collective failed: give the monitor a moment to learn which rank is gone."""
        with self.cond:
            self.cond.wait_for(lambda: self.failure is not None, timeout=3.0)
        return TensorParallelError(self.failure or f"a tensor-parallel collective failed: {error}")

    def forget_requests(self, request_ids) -> None:
        if self.runner is not None and self.runner.sampler is not None:
            for rid in request_ids:
                self.runner.sampler.forget(rid)
                if self.runner.pooler is not None:
                    self.runner.pooler.forget(rid)

    def shutdown(self) -> None:
        if self.closing:
            return
        self.closing = True
        if hasattr(self, "pub"):
            with self.pub_lock:
                self.pub.send_multipart([channel.QUIT, b""])
            # remote ranks say bye; local ones also exit
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                local_done = all(p.poll() is not None for p in self.procs.values())
                remote_done = all(r in self.bye or r in self.procs or r not in self.hello for r in self.peers)
                if local_done and remote_done:
                    break
                time.sleep(0.05)
        for rank, proc in self.procs.items():
            if proc.poll() is None:
                logger.warning("tensor-parallel worker rank %d did not exit; killing it", rank)
                proc.kill()
                proc.wait()
        self.stop_monitor.set()
        if self.monitor is not None:
            self.monitor.join(timeout=5)
        rdv.destroy_process_group()
        self.ctx.destroy(linger=0)
        self.store = None
        torch.set_num_threads(self.threads_before)
