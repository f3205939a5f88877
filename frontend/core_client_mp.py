"""Clients for an engine core in another process: a sync one for `LLM`, an async one for AsyncLLM.

Both speak the same frames over a DEALER socket: HELLO until READY, then ADD / ABORT / UTILITY
out and OUTPUTS / UTILITY_RESULT / SHUTDOWN in. The core speaks at least every heartbeat; a
core that is silent for DEAD_AFTER_SECONDS, says SHUTDOWN, or whose child process exited, is dead.
"""

import asyncio
import itertools
import logging
import time
from collections import deque

import msgspec
import zmq
import zmq.asyncio

from common import protocol as P
from common.config import EngineArgs
from common.protocol import EngineCoreOutputs, EngineCoreRequest
from common.transport import DEAD_AFTER_SECONDS, limit_socket, new_identity, private_ipc_address
from frontend.core_client import EngineDeadError
from frontend.core_process import start_core_process, stop_core_process

logger = logging.getLogger("nvllm")

STARTUP_TIMEOUT_SECONDS = 600.0  # the first start may import the default model
_ready_decoder = msgspec.msgpack.Decoder(P.Ready)
_outputs_decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)
_result_decoder = msgspec.msgpack.Decoder(P.UtilityResult)
_text_decoder = msgspec.msgpack.Decoder(str)


class MPClientBase:
    """Owns the socket (and, with no address given, the core child process)."""

    def __init__(self, args: EngineArgs | None, address: str | None, asyncio_ctx: bool,
                 socket_setup=None, client_name: str = ""):
        self.proc = None
        if address is None:
            address = private_ipc_address()
            self.proc = start_core_process(args, address)
        self.address = address
        self.client_name = client_name
        self.ctx = zmq.asyncio.Context() if asyncio_ctx else zmq.Context()
        self.identity = new_identity()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.ROUTING_ID, self.identity)
        limit_socket(self.sock)
        if socket_setup is not None:
            socket_setup(self.sock)  # CURVE client keys
        self.sock.connect(address)
        self.encoder = msgspec.msgpack.Encoder()
        self.model_info: P.Ready | None = None
        self.dead_reason: str | None = None
        self.last_heard = time.monotonic()
        self._call_ids = itertools.count()

    def _hello(self) -> list[bytes]:
        return [P.HELLO, self.encoder.encode(P.Hello(P.PROTOCOL_VERSION, self.client_name))]

    def _check_process(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            self._die(f"the engine core process exited with code {self.proc.returncode}")

    def _die(self, reason: str) -> None:
        if self.dead_reason is None:
            self.dead_reason = reason
            logger.error("engine core is dead: %s", reason)
        raise EngineDeadError(self.dead_reason)

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        self._check_process()
        if time.monotonic() - self.last_heard > DEAD_AFTER_SECONDS:
            self._die(f"no word from the engine core for {DEAD_AFTER_SECONDS:.0f} s")

    def _handle_ready(self, kind: bytes, body: bytes) -> bool:
        if kind == P.READY:
            self.model_info = _ready_decoder.decode(body)
            self.last_heard = time.monotonic()
            return True
        if kind == P.REJECTED:
            raise RuntimeError(f"the engine core refused this frontend: {_text_decoder.decode(body)}")
        return False

    def _close(self) -> None:
        try:
            self.sock.send_multipart([P.GOODBYE, b""], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self.sock.close(linger=100)
        if self.proc is not None:
            stop_core_process(self.proc)
        self.ctx.term()


class SyncMPClient(MPClientBase):
    def __init__(self, args: EngineArgs | None, address: str | None = None, socket_setup=None):
        super().__init__(args, address, asyncio_ctx=False, socket_setup=socket_setup, client_name="LLM")
        self._pending_outputs: deque[EngineCoreOutputs] = deque()
        self._handshake()

    def _handshake(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            self._check_process_at_start()
            self.sock.send_multipart(self._hello())
            if self.sock.poll(1000):
                kind, body = self._recv()
                if self._handle_ready(kind, body):
                    return
        raise TimeoutError(f"the engine core at {self.address} did not answer within {STARTUP_TIMEOUT_SECONDS:.0f} s")

    def _check_process_at_start(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the engine core process failed to start (exit code {self.proc.returncode}); "
                               "its log above says why")

    def _recv(self) -> tuple[bytes, bytes]:
        frames = self.sock.recv_multipart()
        return frames[0], frames[1] if len(frames) > 1 else b""

    def add_request(self, request: EngineCoreRequest) -> None:
        self._check_alive()
        self.sock.send_multipart([P.ADD, self.encoder.encode(request)])

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids and self.dead_reason is None:
            self.sock.send_multipart([P.ABORT, self.encoder.encode(request_ids)])

    def get_output(self) -> EngineCoreOutputs:
        if self._pending_outputs:
            return self._pending_outputs.popleft()
        while True:
            self._check_alive()
            if not self.sock.poll(100):
                continue
            kind, body = self._recv()
            self.last_heard = time.monotonic()
            if kind == P.OUTPUTS:
                return _outputs_decoder.decode(body)
            if kind == P.SHUTDOWN:
                self._die(_text_decoder.decode(body))

    def call_utility(self, method: str, *args):
        call_id = next(self._call_ids)
        self.sock.send_multipart([P.UTILITY, self.encoder.encode(P.UtilityCall(call_id, method, list(args)))])
        while True:
            self._check_alive()
            if not self.sock.poll(100):
                continue
            kind, body = self._recv()
            self.last_heard = time.monotonic()
            if kind == P.OUTPUTS:
                outs = _outputs_decoder.decode(body)
                if outs.outputs:
                    self._pending_outputs.append(outs)
            elif kind == P.UTILITY_RESULT:
                result = _result_decoder.decode(body)
                if result.call_id == call_id:
                    if result.error:
                        raise RuntimeError(result.error)
                    return result.result
            elif kind == P.SHUTDOWN:
                self._die(_text_decoder.decode(body))

    def reset_prefix_cache(self) -> bool:
        return self.call_utility("reset_prefix_cache")

    def get_stats(self):
        return self.call_utility("get_stats")

    def shutdown(self) -> None:
        self._close()


class AsyncMPClient(MPClientBase):
    """Call `await start()` before use; `await get_output()` from one reader task."""

    def __init__(self, args: EngineArgs | None, address: str | None = None, socket_setup=None,
                 client_name: str = "AsyncLLM"):
        super().__init__(args, address, asyncio_ctx=True, socket_setup=socket_setup, client_name=client_name)
        self._results: dict[int, asyncio.Future] = {}

    async def start(self, timeout: float = STARTUP_TIMEOUT_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the engine core process failed to start (exit code {self.proc.returncode})")
            await self.sock.send_multipart(self._hello())
            if await self.sock.poll(1000):
                frames = await self.sock.recv_multipart()
                if self._handle_ready(frames[0], frames[1] if len(frames) > 1 else b""):
                    return
        raise TimeoutError(f"the engine core at {self.address} did not answer within {timeout:.0f} s")

    async def add_request(self, request: EngineCoreRequest) -> None:
        self._check_alive()
        await self.sock.send_multipart([P.ADD, self.encoder.encode(request)])

    async def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids and self.dead_reason is None:
            await self.sock.send_multipart([P.ABORT, self.encoder.encode(request_ids)])

    async def get_output(self) -> EngineCoreOutputs:
        """The next outputs batch; raises EngineDeadError when the core is gone."""
        while True:
            self._check_alive()
            if not await self.sock.poll(100):
                continue
            frames = await self.sock.recv_multipart()
            kind, body = frames[0], frames[1] if len(frames) > 1 else b""
            self.last_heard = time.monotonic()
            if kind == P.OUTPUTS:
                return _outputs_decoder.decode(body)
            if kind == P.UTILITY_RESULT:
                result = _result_decoder.decode(body)
                future = self._results.pop(result.call_id, None)
                if future is not None and not future.done():
                    if result.error:
                        future.set_exception(RuntimeError(result.error))
                    else:
                        future.set_result(result.result)
            elif kind == P.SHUTDOWN:
                self._die(_text_decoder.decode(body))

    async def call_utility(self, method: str, *args, timeout: float = 10.0):
        """Needs the reader task running get_output()."""
        self._check_alive()
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._results[call_id] = future
        await self.sock.send_multipart([P.UTILITY, self.encoder.encode(P.UtilityCall(call_id, method, list(args)))])
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._results.pop(call_id, None)

    def fail_pending_calls(self, error: Exception) -> None:
        for future in self._results.values():
            if not future.done():
                future.set_exception(error)
        self._results.clear()

    def shutdown(self) -> None:
        self._close()
