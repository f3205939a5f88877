"""Joining the tensor-parallel group: who runs which rank, the rendezvous store, time-outs.

Ranks are laid out node by node: with `--tensor-parallel-size N --nnodes M`, node k runs ranks
k*N/M .. (k+1)*N/M - 1, and node 0 (the core's host) runs rank 0 inside the core process. The
rendezvous is torch.distributed's own TCPStore on node 0; besides the process group it carries
what a worker needs to start: the resolved EngineConfig (msgpack) and the addresses of the channels.
"""

import ctypes
import datetime
import os
import signal
import socket
import time
from dataclasses import dataclass

import msgspec
import torch
import torch.distributed as dist

from engine_core.engine_config import EngineConfig

# seconds; tests shorten them through the environment
INIT_TIMEOUT_ENV = "NVLLM_TP_INIT_TIMEOUT"  # every rank must check in within this at start
COLLECTIVE_TIMEOUT_ENV = "NVLLM_TP_TIMEOUT"  # one collective (all-reduce, gather) at most
HEARTBEAT_TIMEOUT_ENV = "NVLLM_TP_HEARTBEAT_TIMEOUT"  # silence after which a peer is dead

HEARTBEAT_SECONDS = 1.0

# keys the core puts in the store for its workers
KEY_CONFIG = "nvllm/engine_config"
KEY_STEP_ADDR = "nvllm/step_addr"
KEY_STATUS_ADDR = "nvllm/status_addr"


def env_seconds(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def init_timeout() -> float:
    return env_seconds(INIT_TIMEOUT_ENV, 120.0)


def collective_timeout() -> float:
    return env_seconds(COLLECTIVE_TIMEOUT_ENV, 300.0)


def heartbeat_timeout() -> float:
    return env_seconds(HEARTBEAT_TIMEOUT_ENV, 30.0)


@dataclass(frozen=True)
class Layout:
    world_size: int
    nnodes: int
    node_rank: int

    def __post_init__(self):
        if self.world_size % self.nnodes:
            raise ValueError(f"tensor_parallel_size {self.world_size} does not split over nnodes {self.nnodes}: "
                             "every node runs the same number of ranks")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} is not in 0..{self.nnodes - 1}")

    @classmethod
    def of_rank(cls, world_size: int, nnodes: int, rank: int) -> "Layout":
        return cls(world_size, nnodes, rank // max(1, world_size // nnodes))

    @property
    def per_node(self) -> int:
        return self.world_size // self.nnodes

    @property
    def local_ranks(self) -> range:
        return range(self.node_rank * self.per_node, (self.node_rank + 1) * self.per_node)


def rank_device(device_type: str, rank: int, per_node: int) -> torch.device:
    """One CUDA device per rank (the rank's index on its node); CPU ranks share the CPU."""
    if device_type == "cuda":
        dev = torch.device("cuda", rank % per_node)
        torch.cuda.set_device(dev)
        return dev
    return torch.device(device_type)


def cpu_threads_per_rank(per_node: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // per_node)


def master_store(host: str, port: int) -> dist.TCPStore:
    """The rendezvous store, served from this process (rank 0). Port 0 picks a free one."""
    return dist.TCPStore(host, port, None, True, timeout=datetime.timedelta(seconds=init_timeout()),
                         wait_for_workers=False)


def wait_for_port(host: str, port: int, timeout: float) -> None:
    """Wait until something listens at host:port (the core's store), with a clear error if not."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=2):
                return
        except OSError as e:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no engine core answered at {host}:{port} within {timeout:.0f} s ({e}); "
                                   f"start the core (node 0) with --master-addr/--master-port, or set "
                                   f"{INIT_TIMEOUT_ENV}") from None
            time.sleep(0.5)


def client_store(host: str, port: int) -> dist.TCPStore:
    timeout = init_timeout()
    wait_for_port(host, port, timeout)
    return dist.TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=timeout))


def publish_config(store: dist.Store, config: EngineConfig) -> None:
    store.set(KEY_CONFIG, msgspec.msgpack.encode(config))


def read_config(store: dist.Store) -> EngineConfig:
    """The config rank 0 published (blocks until it is there, up to the store's time-out)."""
    return msgspec.msgpack.decode(store.get(KEY_CONFIG), type=EngineConfig)


def init_process_group(store: dist.Store, rank: int, world_size: int, device: torch.device) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=collective_timeout()))


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def die_with_parent(parent_pid: int | None) -> None:
    """Ask Linux to kill this process when its parent dies (PR_SET_PDEATHSIG); callers also watch
    the parent pid, which covers other systems and a parent that died before this call."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def parent_alive(parent_pid: int | None) -> bool:
    return parent_pid is None or os.getppid() == parent_pid
