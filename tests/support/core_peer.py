"""A frontend that speaks raw ZeroMQ frames to a real engine core process, and the engine arguments such a core
runs a tiny model with."""

import time

import msgspec
import zmq

from common import wire_messages as P
from common.config import EngineArgs
from common.wire_messages import EngineCoreRequest

WAIT = 120  # the deadline of every wait for something expected within seconds


def core_args(model: str, **kw) -> EngineArgs:
    return EngineArgs(model=model, dtype="float32", kv_cache_memory="64MiB", max_model_len=512, **kw)


class Peer:
    """A frontend speaking raw frames."""

    def __init__(self, address: str):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.sock.send_multipart([P.HELLO, msgspec.msgpack.encode(P.Hello(P.PROTOCOL_VERSION, "test"))])
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.sock.poll(1000) and self.sock.recv_multipart()[0] == P.READY:
                return
        raise TimeoutError("no READY")

    def add(self, request: EngineCoreRequest) -> None:
        self.sock.send_multipart([P.ADD, msgspec.msgpack.encode(request)])

    def finished(self, request_ids: set[str], timeout: float = WAIT) -> dict[str, P.EngineCoreOutput]:
        """The last output of each request, once all have finished."""
        done: dict[str, P.EngineCoreOutput] = {}
        deadline = time.monotonic() + timeout
        while set(done) != request_ids and time.monotonic() < deadline:
            if not self.sock.poll(200):
                continue
            kind, body = self.sock.recv_multipart()
            if kind != P.OUTPUTS:
                continue
            for out in msgspec.msgpack.decode(body, type=P.EngineCoreOutputs).outputs:
                if out.finish_reason is not None:
                    done[out.request_id] = out
        assert set(done) == request_ids, f"unfinished: {request_ids - set(done)}"
        return done

    def stats(self) -> P.SchedulerStats:
        self.sock.send_multipart([P.UTILITY, msgspec.msgpack.encode(P.UtilityCall(7, "get_stats"))])
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.sock.poll(200):
                kind, body = self.sock.recv_multipart()
                if kind == P.UTILITY_RESULT:
                    return msgspec.msgpack.decode(body, type=P.UtilityResult).result
        raise TimeoutError("no stats")

    def close(self) -> None:
        self.sock.send_multipart([P.GOODBYE, b""])
        self.sock.close()
