"""Clients for an engine core in another process: a sync one for `LLM`, an async one for AsyncLLM.

Both speak the same frames over a DEALER socket: HELLO until READY, then ADD / ABORT / UTILITY /
HEARTBEAT out and OUTPUTS / UTILITY_RESULT / SHUTDOWN in. The core speaks at least every heartbeat; a
core that is silent for DEAD_AFTER_SECONDS, says SHUTDOWN, drops the connection, answers
UNKNOWN_FRONTEND (it restarted, or ended this frontend's session), or whose child process exited, is dead.

The core ends the session of a frontend it has not heard from for READY.frontend_timeout (aborting its
requests), so a client sends HEARTBEAT every HEARTBEAT_SECONDS while it waits for outputs (the async
client's reader always does). The sync client is idle between calls: when it has been quiet for half the
core's limit it says HELLO (resume: keep the session if the core still has it) before its next ADD or
UTILITY; the core's repeated READY carries no tokenizer files (same core_id: the client keeps its own) and
says whether the session was resumed: if not, the requests the client still had there end with an error.

Aborts are never dropped while the core is connected and alive: a full send queue is waited on, for at
most ABORT_SEND_SECONDS (a core that does not read that long is dead anyway, and a dead or disconnected
core has ended this frontend's session, and so its requests, itself).

A client of a core it did not start (an address was given) can come back: `handshake()` again
says HELLO until a core answers READY, which may be a restarted core (a new core_id), even one
serving another model. The async client restarts a child-process core that died after it had been
up (restart_core=True, the default): it waits RESTART_DELAY_SECONDS, doubling after each restart
up to RESTART_DELAY_MAX_SECONDS (back to the first delay once a core stayed up that long), starts a
new core on the same address and says HELLO; a core that fails at its first start is an error.

The socket queues messages only on a finished connection (ZMQ_IMMEDIATE), so nothing piles up
for a core that is away, and a monitor tells when the connection drops or its CURVE handshake fails.

Both clients are IO loops around one CoreProtocol (frontend/core_link/core_protocol.py), which holds the protocol's
state (handshake, heartbeat timing, session resume, in-flight requests, pending utility calls) with no IO;
what stays here is the socket, the connection monitor and the core child process.
"""

import asyncio
import logging
import os
import time
import weakref
from collections import deque

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from common import wire_messages as P
from common.config import EngineArgs
from common.lora import LoRARequest
from common.start_failure import read_start_failure, start_error
from common.transport import DEAD_AFTER_SECONDS, limit_socket, new_identity, private_ipc_address
from common.wire_messages import EngineCoreOutputs, EngineCoreRequest
from frontend.core_link.core_client import EngineDeadError
from frontend.core_link.core_process import start_core_process, stop_core_process
from frontend.core_link.core_protocol import (CoreLost, CoreProtocol, CoreReady, HelloRejected, OutputsArrived,
                                              ReconnectNeeded, UtilityAnswered)

logger = logging.getLogger("nvllm")

STARTUP_TIMEOUT_SECONDS = 600.0  # the first start may import the default model
RETRY_FAILED_HANDSHAKE_SECONDS = 5.0  # ZeroMQ gives up after a refused CURVE handshake; we try again
ABORT_SEND_SECONDS = DEAD_AFTER_SECONDS  # the longest an abort waits for room in the send queue
RESTART_DELAY_SECONDS = 1.0  # before restarting a child core that died; doubles after each restart
RESTART_DELAY_MAX_SECONDS = 30.0

_MONITORED = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
              | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_DISCONNECTED)
_HANDSHAKE_PROBLEMS = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the engine core refused this frontend's CURVE key (is its public key among "
                                     "the core's authorized keys?)",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "the handshake with the engine core failed (CURVE on one side only?)",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "the CURVE handshake with the engine core failed (a wrong public key "
                                          "for the core?)",
}


class MPClientBase:
    """Owns the socket (and, with no address given, the core child process)."""

    def __init__(self, args: EngineArgs | None, address: str | None, asyncio_ctx: bool,
                 socket_setup=None, client_name: str = "", restart_core: bool = False):
        self.args = args
        self.proc = None
        self.restart_core = restart_core
        # where a child core says why it could not start; its address's path with a suffix (a private folder)
        self._start_failure_file = None
        if address is None:
            address = private_ipc_address()
            self._start_failure_file = address.removeprefix("ipc://") + ".start-failure"
            self.proc = start_core_process(args, address, start_failure_file=self._start_failure_file)
        self._procs = [self.proc]  # the current child core, for the finalizer (a restart replaces it)
        self.address = address
        self.client_name = client_name
        self.ctx = zmq.asyncio.Context() if asyncio_ctx else zmq.Context()
        self.identity = new_identity()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.ROUTING_ID, self.identity)
        self.sock.setsockopt(zmq.IMMEDIATE, 1)
        limit_socket(self.sock)
        if socket_setup is not None:
            socket_setup(self.sock)  # CURVE client keys
        # connection events, read without blocking through a plain socket on the same context
        self._monitor_ctx = zmq.Context.shadow(self.ctx.underlying)
        monitor_address = f"inproc://nvllm-monitor-{self.identity.hex()}"
        self.sock.monitor(monitor_address, _MONITORED)
        self.monitor = self._monitor_ctx.socket(zmq.PAIR)
        self.monitor.connect(monitor_address)
        self.sock.connect(address)
        # a client dropped without shutdown() must still close its sockets (else the context's own
        # finalizer blocks forever in term()) and stop its child core
        self._release = weakref.finalize(self, _release, self.sock, self.monitor, self.ctx, self._procs,
                                         self._start_failure_file)
        self.protocol = CoreProtocol(client_name, time.monotonic())
        self.dead_reason: str | None = None
        self.connected = False  # a finished (CURVE) handshake with the core's socket
        self.connect_problem: str | None = None  # why the last handshake failed, if it did
        self._last_reconnect = time.monotonic()
        self._restart_delay = RESTART_DELAY_SECONDS
        self._ready_at = time.monotonic()

    @property
    def model_info(self) -> P.Ready | None:
        """What the core said in its latest READY."""
        return self.protocol.model_info

    @property
    def owns_core(self) -> bool:
        """The core is this client's child process."""
        return self.proc is not None

    @property
    def reconnects(self) -> bool:
        """A core this client did not start may come back; a child process is restarted if restart_core."""
        return self.proc is None or self.restart_core

    def _hello_if_due(self) -> list[bytes] | None:
        """One turn of waiting for READY: connection events, a retry after a refused CURVE handshake;
        then the HELLO to send if one is due."""
        self._drain_monitor()
        self._retry_failed_connection()
        return self.protocol.hello_due(time.monotonic())

    def _handshake_timeout(self, timeout: float) -> TimeoutError:
        return TimeoutError(f"the engine core at {self.address} did not answer within {timeout:.0f} s "
                            f"({self.waiting_reason()})")

    def _abort_frames(self, request_ids: list[str]) -> list[bytes] | None:
        """The ABORT to send; None when there is nothing to abort or no live core to tell."""
        frames = self.protocol.abort_frames(request_ids)
        return frames if self.dead_reason is None else None

    def _check_process(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            self._die(f"the engine core process exited with code {self.proc.returncode}")

    def _check_process_at_start(self) -> None:
        """A child core that exited is a start error, unless it had been up and is to be restarted."""
        restartable = self.restart_core and self.model_info is not None
        if self.proc is not None and self.proc.poll() is not None and not restartable:
            raise start_error(read_start_failure(self._start_failure_file), self.proc.returncode)

    def _die(self, reason: str) -> None:
        if self.dead_reason is None:
            if self.owns_core and self.restart_core:
                self.dead_reason = f"{reason}; restarting it"
                logger.error("engine core is dead: %s", self.dead_reason)
            elif self.reconnects:
                self.dead_reason = f"lost the engine core at {self.address}: {reason}; reconnecting"
                logger.warning("%s", self.dead_reason)
            else:
                self.dead_reason = reason
                logger.error("engine core is dead: %s", reason)
        raise EngineDeadError(self.dead_reason)

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        self._check_process()
        self._drain_monitor()
        if self.protocol.core_silent(time.monotonic()) and not self._frames_waiting():
            # frames waiting unread mean this side was busy (not reading), not that the core went quiet
            self._die(f"no word from the engine core for {DEAD_AFTER_SECONDS:.0f} s")

    def _frames_waiting(self) -> bool:
        return bool(self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN)


    def _abort_can_wait(self, deadline: float) -> bool:
        """Whether an abort that found the send queue full should wait: the core is connected and alive.
        A dead or disconnected core has ended this frontend's session, and its requests, itself."""
        try:
            self._check_alive()
        except EngineDeadError:
            return False
        if not self.connected:
            return False
        if time.monotonic() >= deadline:
            logger.warning("could not send an abort to the engine core at %s for %.0f s", self.address,
                           ABORT_SEND_SECONDS)
            return False
        return True

    def _drain_monitor(self) -> None:
        """Applies pending connection events; a dropped connection to a ready core kills it."""
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)["event"]
            except zmq.Again:
                return
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected, self.connect_problem = True, None
            elif event in _HANDSHAKE_PROBLEMS:
                if self.connect_problem != _HANDSHAKE_PROBLEMS[event]:
                    logger.error("%s: %s", self.address, _HANDSHAKE_PROBLEMS[event])
                self.connect_problem = _HANDSHAKE_PROBLEMS[event]
            elif event == zmq.EVENT_DISCONNECTED:
                was_connected, self.connected = self.connected, False
                if was_connected and self.model_info is not None and self.dead_reason is None:
                    self._die("the connection closed")

    def _retry_failed_connection(self) -> None:
        """ZeroMQ does not reconnect after a refused CURVE handshake: keys may have been fixed since."""
        if self.connect_problem is not None and time.monotonic() - self._last_reconnect > RETRY_FAILED_HANDSHAKE_SECONDS:
            self._reconnect_socket()

    def _reconnect_socket(self) -> None:
        self._last_reconnect = time.monotonic()
        try:
            self.sock.disconnect(self.address)
        except zmq.ZMQError:
            pass
        self.sock.connect(self.address)

    def _child_exited(self) -> bool:
        """The child core died after it had been up, and is to be restarted."""
        if self.proc is None or self.proc.poll() is None:
            return False
        self._check_process_at_start()  # the first start failed, or no restarts: an error
        return True

    def _next_restart_delay(self) -> float:
        if time.monotonic() - self._ready_at > RESTART_DELAY_MAX_SECONDS:  # it had stayed up: start over
            self._restart_delay = RESTART_DELAY_SECONDS
        delay = self._restart_delay
        self._restart_delay = min(delay * 2, RESTART_DELAY_MAX_SECONDS)
        return delay

    def _start_new_core(self) -> None:
        self.proc = start_core_process(self.args, self.address, start_failure_file=self._start_failure_file)
        self._procs[0] = self.proc

    def waiting_reason(self) -> str:
        """Why there is no READY yet, for messages."""
        if self.connect_problem:
            return self.connect_problem
        if not self.connected:
            return f"no connection to {self.address} yet"
        return f"the engine core at {self.address} has not answered HELLO yet"

    def _receive(self, kind: bytes, body: bytes) -> list:
        """The protocol's events for one frame; connection events before a READY are applied first, so
        that they do not count against the connection it comes on."""
        if kind == P.READY and self.protocol.awaiting_ready:
            self._drain_monitor()
        return self.protocol.receive(kind, body, time.monotonic())

    def _handshake_event(self, event) -> bool:
        """Acts on an event while waiting for READY; True once READY came."""
        if isinstance(event, HelloRejected):
            raise RuntimeError(f"the engine core refused this frontend: {event.reason}")
        if isinstance(event, ReconnectNeeded):
            logger.warning("the engine core at %s answered without its tokenizer files; reconnecting", self.address)
            self._reconnect_socket()
        elif isinstance(event, CoreReady):
            self._ready_at = time.monotonic()
            if event.previous is not None:
                logger.info("engine core at %s is back%s, serving %s", self.address,
                            "" if event.previous.core_id == event.info.core_id else " (a new core)",
                            event.info.model_name)
            self.dead_reason = None
            return True
        return False

    def _live_event(self, event) -> None:
        """Acts on an event of a live client that is not outputs or an answer."""
        if isinstance(event, CoreLost):
            self._die(event.reason)

    def _close(self) -> None:
        try:  # through a plain socket: an asyncio one would leave a future nobody awaits
            zmq.Socket.shadow(self.sock.underlying).send_multipart([P.GOODBYE, b""], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self._release()


def _release(sock: zmq.Socket, monitor: zmq.Socket, ctx: zmq.Context, procs: list,
             start_failure_file: str | None) -> None:
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass
    monitor.close(linger=0)
    sock.close(linger=100)
    if procs[0] is not None:
        stop_core_process(procs[0])
    if start_failure_file is not None and os.path.exists(start_failure_file):
        os.remove(start_failure_file)
    ctx.term()


class SyncMPClient(MPClientBase):
    def __init__(self, args: EngineArgs | None, address: str | None = None, socket_setup=None):
        super().__init__(args, address, asyncio_ctx=False, socket_setup=socket_setup, client_name="LLM")
        self._pending_outputs: deque[EngineCoreOutputs] = deque()
        self._handshake(STARTUP_TIMEOUT_SECONDS)

    def _handshake(self, timeout: float, resume: bool = False) -> CoreReady:
        deadline = time.monotonic() + timeout
        self.protocol.start_handshake(resume)
        while time.monotonic() < deadline:
            self._check_process_at_start()
            hello = self._hello_if_due()
            if hello:
                self._send_now(hello)
            if self.sock.poll(100):
                for event in self._receive(*self._recv()):
                    if self._handshake_event(event):
                        return event
                    if resume and isinstance(event, OutputsArrived):  # outputs that came while this client was quiet
                        self._keep(event.outputs)
        raise self._handshake_timeout(timeout)

    def _keep(self, outputs: EngineCoreOutputs) -> None:
        if outputs.outputs:
            self._pending_outputs.append(outputs)

    def _resume_session(self) -> None:
        """After a quiet spell (between generate() calls) the core may have ended this frontend's session:
        say HELLO again, resuming the session if the core still has it, and go on with the same core."""
        if self.model_info is None or not self.protocol.session_may_be_gone(time.monotonic()):
            return
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        self._check_process()  # not the silence check: the core is quiet to a frontend it has forgotten
        core_id = self.model_info.core_id
        try:
            ready = self._handshake(DEAD_AFTER_SECONDS, resume=True)
        except TimeoutError:
            self._die(f"the engine core did not answer HELLO within {DEAD_AFTER_SECONDS:.0f} s")
        if self.model_info.core_id != core_id:
            self._die("a restarted engine core answered")
        if ready.lost:  # the core ended the session, and its requests
            logger.warning("the engine core had ended this frontend's session (silent for %.0f s): %d request(s) "
                           "lost", self.model_info.frontend_timeout, len(ready.lost))
            why = P.SessionLost("the engine core ended this frontend's session: it was silent too long")
            lost = [P.EngineCoreOutput(request_id=rid, new_token_ids=[], finish_reason=P.FinishReason.ERROR,
                                       failure=why) for rid in ready.lost]
            self._keep(EngineCoreOutputs(outputs=lost))

    def _recv(self) -> tuple[bytes, bytes]:
        frames = self.sock.recv_multipart()
        return frames[0], frames[1] if len(frames) > 1 else b""

    def _send_now(self, frames: list[bytes]) -> bool:
        """Sends without waiting; False when the queue to the core has no room (or no connection)."""
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            return False
        self.protocol.sent(frames, time.monotonic())
        return True

    def _heartbeat(self) -> None:
        frames = self.protocol.heartbeat_due(time.monotonic())
        if frames:
            self._send_now(frames)  # a full queue: the core hears those frames instead

    def _send(self, frames: list[bytes]) -> None:
        while True:
            self._check_alive()
            if self._send_now(frames):
                return
            self.sock.poll(100, zmq.POLLOUT)  # the queue to the core is full, or the connection is down

    def add_request(self, request: EngineCoreRequest) -> None:
        self._resume_session()
        self._send(self.protocol.add_frames(request))

    def abort_requests(self, request_ids: list[str]) -> None:
        frames, deadline = self._abort_frames(request_ids), time.monotonic() + ABORT_SEND_SECONDS
        # a dropped abort would leave the requests running: wait for room
        while frames and not self._send_now(frames) and self._abort_can_wait(deadline):
            self.sock.poll(50, zmq.POLLOUT)

    def _wait_events(self) -> list:
        """The events of the next frame from the core; none after a short wait (heartbeats go out meanwhile)."""
        self._check_alive()
        self._heartbeat()
        if not self.sock.poll(100):
            return []
        return self._receive(*self._recv())

    def get_output(self) -> EngineCoreOutputs:
        if self._pending_outputs:
            return self._pending_outputs.popleft()
        while True:
            for event in self._wait_events():
                if isinstance(event, OutputsArrived):
                    return event.outputs
                self._live_event(event)

    def call_utility(self, method: P.UtilityMethod, *args):
        self._resume_session()
        call_id, frames = self.protocol.utility_frames(method, args)
        try:
            self._send(frames)
            while True:
                for event in self._wait_events():
                    if isinstance(event, OutputsArrived):
                        self._keep(event.outputs)
                    elif isinstance(event, UtilityAnswered):
                        if event.call_id == call_id:
                            if event.error:
                                raise RuntimeError(event.error)
                            return event.result
                    else:
                        self._live_event(event)
        finally:
            self.protocol.forget_call(call_id)

    def reset_prefix_cache(self) -> bool:
        return self.call_utility(P.UtilityMethod.RESET_PREFIX_CACHE)

    def add_lora(self, lora: LoRARequest) -> None:
        """The core reads and checks the adapter; ValueError with its reason if it refuses it."""
        try:
            self.call_utility(P.UtilityMethod.ADD_LORA, *lora_args(lora))
        except RuntimeError as e:
            raise ValueError(str(e)) from None

    def remove_lora(self, lora: LoRARequest) -> bool:
        return self.call_utility(P.UtilityMethod.REMOVE_LORA, *lora_args(lora))

    def get_stats(self):
        return self.call_utility(P.UtilityMethod.GET_STATS)

    def shutdown(self) -> None:
        self._close()


def lora_args(lora: LoRARequest) -> list:
    """A LoRARequest as a UtilityCall's args (the core converts them back)."""
    return [lora.lora_name, lora.lora_int_id, lora.lora_path]


class AsyncMPClient(MPClientBase):
    """Call `await handshake()` before use (again after EngineDeadError, to reconnect, or to restart a
    child core that died); `await get_output()` from one reader task."""

    def __init__(self, args: EngineArgs | None, address: str | None = None, socket_setup=None,
                 client_name: str = "AsyncLLM", restart_core: bool = True):
        super().__init__(args, address, asyncio_ctx=True, socket_setup=socket_setup, client_name=client_name,
                         restart_core=restart_core)
        self._results: dict[int, asyncio.Future] = {}  # the callers waiting on the protocol's pending calls

    async def handshake(self, timeout: float | None = STARTUP_TIMEOUT_SECONDS) -> P.Ready:
        """HELLO (repeated) until READY; timeout None: until a core answers or this is cancelled.
        Anything else that arrives meanwhile (the last outputs of a lost core) is dropped.
        A child core that died after it had been up is restarted first (after a growing delay)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.protocol.start_handshake()
        while deadline is None or time.monotonic() < deadline:
            if self._child_exited():
                delay = self._next_restart_delay()
                logger.error("the engine core process exited with code %s; starting a new one in %.0f s",
                             self.proc.returncode, delay)
                await asyncio.sleep(delay)
                self._start_new_core()
                logger.info("started a new engine core process (pid %d)", self.proc.pid)
                self.protocol.start_handshake()
            hello = self._hello_if_due()
            if hello:
                await self._send_now(hello)
            if await self.sock.poll(100):
                frames = await self.sock.recv_multipart()
                for event in self._receive(frames[0], frames[1] if len(frames) > 1 else b""):
                    if self._handshake_event(event):
                        return self.model_info
        raise self._handshake_timeout(timeout)

    async def _send_now(self, frames: list[bytes]) -> bool:
        """Sends without waiting; False when the queue to the core has no room (or no connection)."""
        try:
            await self.sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        self.protocol.sent(frames, time.monotonic())
        return True

    async def _heartbeat(self) -> None:
        frames = self.protocol.heartbeat_due(time.monotonic())
        if frames:
            await self._send_now(frames)  # a full queue: the core hears those frames instead

    async def _send(self, frames: list[bytes]) -> None:
        while True:
            self._check_alive()
            if await self._send_now(frames):
                return
            await self.sock.poll(100, zmq.POLLOUT)  # the queue to the core is full, or the connection is down

    async def add_request(self, request: EngineCoreRequest) -> None:
        await self._send(self.protocol.add_frames(request))

    async def abort_requests(self, request_ids: list[str]) -> None:
        frames, deadline = self._abort_frames(request_ids), time.monotonic() + ABORT_SEND_SECONDS
        # a dropped abort would leave the requests running: wait for room
        while frames and not await self._send_now(frames) and self._abort_can_wait(deadline):
            await self.sock.poll(50, zmq.POLLOUT)

    async def get_output(self) -> EngineCoreOutputs:
        """The next outputs batch; raises EngineDeadError when the core is gone. Sends the heartbeats."""
        while True:
            self._check_alive()
            await self._heartbeat()
            if not await self.sock.poll(100):
                continue
            frames = await self.sock.recv_multipart()
            for event in self._receive(frames[0], frames[1] if len(frames) > 1 else b""):
                if isinstance(event, OutputsArrived):
                    return event.outputs
                if isinstance(event, UtilityAnswered):
                    future = self._results.pop(event.call_id, None)
                    if future is not None and not future.done():
                        if event.error:
                            future.set_exception(RuntimeError(event.error))
                        else:
                            future.set_result(event.result)
                else:
                    self._live_event(event)

    async def call_utility(self, method: P.UtilityMethod, *args, timeout: float = 10.0):
        """Needs the reader task running get_output()."""
        call_id, frames = self.protocol.utility_frames(method, args)
        future = asyncio.get_running_loop().create_future()
        self._results[call_id] = future
        try:
            await self._send(frames)
            return await asyncio.wait_for(future, timeout)
        finally:
            self._results.pop(call_id, None)
            self.protocol.forget_call(call_id)

    def fail_pending_calls(self, error: Exception) -> None:
        for future in self._results.values():
            if not future.done():
                future.set_exception(error)
        self._results.clear()
        self.protocol.pending_calls.clear()

    def shutdown(self) -> None:
        self._close()
