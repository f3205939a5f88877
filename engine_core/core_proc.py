"""EngineCoreProc: the engine core as its own process, serving frontends over ZeroMQ.

Threads:
- IO thread: owns the ROUTER socket. Decodes incoming frames (a bad frame is logged and dropped)
  into the input queue, answers HELLO, forwards encoded outputs from the busy loop to the
  frontend they belong to, and sends heartbeats when the core has been quiet.
- busy loop (main thread): applies queued inputs, then schedule -> execute -> update, and routes
  each step's outputs per frontend.

Request ids are namespaced by frontend inside the core, so two frontends may use the same ids and
an abort from one never touches another's requests. A frontend that says HELLO again (it lost the core
for a while and reconnects) starts afresh: its earlier requests are aborted. A frame from a frontend
that never said HELLO (this core restarted under it) is answered UNKNOWN_FRONTEND.

With CURVE keys the socket is a CURVE server and pyzmq's authenticator admits only the frontends
whose public keys the core was given (common/curve.py).
"""

import logging
import os
import queue
import signal
import threading
import time

import msgspec
import zmq

from common import protocol as P
from common.config import EngineArgs
from common.curve import Authenticator, ServerKeys, apply_server
from common.protocol import EngineCoreOutput, EngineCoreOutputs, FinishReason
from common.transport import HEARTBEAT_SECONDS, is_loopback, limit_socket
from common.validation import check_request
from engine_core.core import EngineCore
from engine_core.stats_log import ThroughputLog

logger = logging.getLogger("nvllm")

UTILITY_METHODS = ("reset_prefix_cache", "get_stats", "ping")

_decoders = {
    P.HELLO: msgspec.msgpack.Decoder(P.Hello),
    P.ADD: msgspec.msgpack.Decoder(P.EngineCoreRequest),
    P.ABORT: msgspec.msgpack.Decoder(list[str]),
    P.UTILITY: msgspec.msgpack.Decoder(P.UtilityCall),
}


def _tag(identity: bytes) -> str:
    return identity.hex()


class EngineCoreProc:
    def __init__(self, args: EngineArgs, listen: str, engine_index: int = 0, parent_pid: int | None = None,
                 socket_setup=None, curve: ServerKeys | None = None):
        self.core = EngineCore(args)
        self.throughput_log = ThroughputLog()
        self.engine_index = engine_index
        self.ready = msgspec.msgpack.encode(msgspec.structs.replace(self.core.model_info(), engine_index=engine_index))
        self.parent_pid = parent_pid
        # SimpleQueue: its put is reentrant, so the signal handlers may use it even when the signal lands
        # while the main thread is inside get (a Queue's lock is taken there: the handler would deadlock)
        self.inputs: queue.SimpleQueue = queue.SimpleQueue()
        self.encoder = msgspec.msgpack.Encoder()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        limit_socket(self.sock)
        self.auth = None
        if curve is not None:  # the authenticator must run before the first frontend connects
            self.auth = Authenticator(self.ctx, curve)
            self.auth.start()
            apply_server(self.sock, curve)
            logger.info("CURVE on: %d frontend public key(s) authorized", len(curve.authorized))
        elif not is_loopback(listen):
            logger.warning("the engine core listens on %s WITHOUT CURVE: traffic is neither authenticated nor "
                           "encrypted", listen)
        if socket_setup is not None:
            socket_setup(self.sock)  # set before bind
        self.sock.bind(listen)
        self.listen = listen
        # the busy loop hands encoded frames to the IO thread through an inproc pipe
        self.out_addr = f"inproc://outputs-{id(self)}"
        self.out_pull = self.ctx.socket(zmq.PULL)
        self.out_pull.bind(self.out_addr)
        self.out_push = self.ctx.socket(zmq.PUSH)
        self.out_push.connect(self.out_addr)
        self.frontends: set[bytes] = set()
        self.owner: dict[str, bytes] = {}  # core request id -> frontend identity
        self.stats = msgspec.msgpack.encode(EngineCoreOutputs(engine_index=engine_index))
        self.stopping = threading.Event()
        self.io_thread = threading.Thread(target=self._io_loop, name="nvllm-core-io", daemon=True)

    # ---- IO thread ----------------------------------------------------------------------------

    def _io_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.out_pull, zmq.POLLIN)
        last_sent = time.monotonic()
        while not self.stopping.is_set():
            events = dict(poller.poll(timeout=int(HEARTBEAT_SECONDS * 1000 / 2)))
            if self.sock in events:
                self._receive(self.sock.recv_multipart(copy=True))
            if self.out_pull in events:
                while True:
                    try:
                        identity, kind, body = self.out_pull.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._send(identity, kind, body)
                    last_sent = time.monotonic()
            if time.monotonic() - last_sent >= HEARTBEAT_SECONDS:
                for identity in list(self.frontends):
                    self._send(identity, P.OUTPUTS, self.stats)
                last_sent = time.monotonic()
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                logger.error("the frontend that started this engine core is gone; shutting down")
                self.stopping.set()
                self.inputs.put(None)

    def _send(self, identity: bytes, kind: bytes, body: bytes) -> None:
        try:
            self.sock.send_multipart([identity, kind, body], zmq.NOBLOCK)
        except zmq.ZMQError as e:  # a frontend that went away; its requests are aborted on GOODBYE
            logger.debug("could not send to frontend %s: %s", _tag(identity), e)

    def _receive(self, frames: list[bytes]) -> None:
        if len(frames) not in (2, 3):
            logger.warning("dropped a frame with %d parts (expected type + body)", len(frames) - 1)
            return
        identity, kind, body = frames[0], frames[1], frames[2] if len(frames) == 3 else b""
        if kind == P.GOODBYE:
            self.frontends.discard(identity)
            self.inputs.put((kind, identity, None))
            return
        decoder = _decoders.get(kind)
        if decoder is None:
            logger.warning("dropped a frame of unknown type %r from %s", kind[:8], _tag(identity))
            return
        try:
            message = decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            logger.warning("dropped a malformed %s frame from %s: %s", kind.hex(), _tag(identity), e)
            return
        if kind == P.HELLO:
            if message.protocol_version != P.PROTOCOL_VERSION:
                self._send(identity, P.REJECTED, self.encoder.encode(
                    f"protocol version {message.protocol_version} is not {P.PROTOCOL_VERSION}"))
                return
            if identity not in self.frontends:  # a frontend repeats HELLO until READY arrives: log it once
                logger.log(logging.DEBUG if message.client_name == "healthcheck" else logging.INFO,
                           "frontend %s connected%s", _tag(identity)[:8],
                           f" ({message.client_name})" if message.client_name else "")
            else:  # HELLO again: the frontend starts afresh, whatever it had running here is abandoned
                self.inputs.put((P.GOODBYE, identity, None))
            self.frontends.add(identity)
            self._send(identity, P.READY, self.ready)
            return
        if identity not in self.frontends:
            logger.warning("dropped a frame from %s, which has not said HELLO", _tag(identity)[:8])
            self._send(identity, P.UNKNOWN_FRONTEND, self.encoder.encode(
                "this engine core does not know this frontend (it restarted?): say HELLO again"))
            return
        self.inputs.put((kind, identity, message))

    # ---- busy loop ----------------------------------------------------------------------------

    def run(self) -> int:
        for stop_signal in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop_signal, lambda *_: self.inputs.put(None))  # no locks in a signal handler
        self.io_thread.start()
        logger.info("engine core %d listening on %s", self.engine_index, self.listen)
        try:
            while not self.stopping.is_set():
                self._apply_inputs(block=not self.core.has_unfinished_requests())
                if self.stopping.is_set():
                    break
                if self.core.has_unfinished_requests():
                    try:
                        outputs = self.core.step()  # a request's failure comes back as its ERROR output
                    except BaseException as e:
                        logger.critical("the engine cannot go on: %s: %s", type(e).__name__, e, exc_info=e)
                        raise
                    self.throughput_log.record(outputs.scheduler_stats)
                    self._route(outputs)
        finally:
            self._shutdown()
        return 0

    def _apply_inputs(self, block: bool) -> None:
        while True:
            try:
                item = self.inputs.get(timeout=HEARTBEAT_SECONDS) if block else self.inputs.get_nowait()
            except queue.Empty:
                return
            block = False
            if item is None:  # a stop: a signal, or the IO thread saw the parent frontend go
                self.stopping.set()
                return
            kind, identity, message = item
            try:
                self._apply(kind, identity, message)
            except Exception as e:  # a request the engine cannot take must not take the engine down
                logger.exception("could not apply a %s frame: %s", kind.hex(), e)

    def _apply(self, kind: bytes, identity: bytes, message) -> None:
        tag = _tag(identity)
        if kind == P.ADD:
            rid = f"{tag}|{message.request_id}"
            try:  # every field, before the scheduler sees it: a bad one is this request's ERROR, nothing more
                check_request(message, self.core.limits)
                if rid in self.owner:
                    raise ValueError(f"request_id {message.request_id!r} is already running")
            except ValueError as e:
                self._push_outputs(identity, [EngineCoreOutput(
                    request_id=message.request_id, new_token_ids=[], finish_reason=FinishReason.ERROR,
                    error=str(e))])
                return
            self.owner[rid] = identity
            self.core.add_request(msgspec.structs.replace(message, request_id=rid))
        elif kind == P.ABORT:
            self.core.abort_requests([f"{tag}|{r}" for r in message if f"{tag}|{r}" in self.owner])
            self._flush_if_idle()
        elif kind == P.GOODBYE:
            mine = [rid for rid, who in self.owner.items() if who == identity]
            if mine:
                logger.info("aborting %d request(s) of frontend %s, which left or started afresh", len(mine), tag[:8])
            self.core.abort_requests(mine)
            self._flush_if_idle()
        elif kind == P.UTILITY:
            self._utility(identity, message)

    def _flush_if_idle(self) -> None:
        # with nothing left to run the busy loop would not step again: route the abort notices (which
        # releases their owner entries) and fresh stats (heartbeats repeat the last ones) now
        if not self.core.has_unfinished_requests():
            self._route(self.core.step())

    def _utility(self, identity: bytes, call: P.UtilityCall) -> None:
        result = P.UtilityResult(call.call_id)
        if call.method == "reset_prefix_cache":
            result.result = self.core.reset_prefix_cache()
        elif call.method == "get_stats":
            result.result = self.core.scheduler.get_stats()
        elif call.method == "ping":
            result.result = True
        else:
            result.error = f"unknown utility method {call.method!r}; known: {', '.join(UTILITY_METHODS)}"
        self.out_push.send_multipart([identity, P.UTILITY_RESULT, self.encoder.encode(result)])

    def _route(self, outputs: EngineCoreOutputs) -> None:
        per_frontend: dict[bytes, list[EngineCoreOutput]] = {}
        for out in outputs.outputs:
            identity = self.owner.get(out.request_id)
            if identity is None:
                continue
            if out.finish_reason is not None:
                del self.owner[out.request_id]
            out.request_id = out.request_id.split("|", 1)[1]
            per_frontend.setdefault(identity, []).append(out)
        stats = outputs.scheduler_stats
        self.stats = self.encoder.encode(EngineCoreOutputs(scheduler_stats=stats, timestamp=outputs.timestamp,
                                                           engine_index=self.engine_index))
        for identity, outs in per_frontend.items():
            self._push_outputs(identity, outs, stats, outputs.timestamp)

    def _push_outputs(self, identity, outs, stats=None, timestamp=None) -> None:
        batch = EngineCoreOutputs(outputs=outs, scheduler_stats=stats or self.core.scheduler.get_stats(),
                                  timestamp=timestamp or time.time(), engine_index=self.engine_index)
        self.out_push.send_multipart([identity, P.OUTPUTS, self.encoder.encode(batch)])

    def _shutdown(self) -> None:
        logger.info("engine core shutting down: aborting %d in-flight requests", len(self.owner))
        if self.owner:
            self.core.abort_requests(list(self.owner))
            aborted = self.core.step()
            for out in aborted.outputs:
                out.error = "the engine core shut down"
            self._route(aborted)
        for identity in list(self.frontends):
            self.out_push.send_multipart([identity, P.SHUTDOWN, self.encoder.encode("the engine core shut down")])
        time.sleep(0.2)  # let the IO thread flush the last frames
        self.stopping.set()
        self.io_thread.join(timeout=2)
        self.core.shutdown()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.destroy(linger=0)


def run_engine_core(args: EngineArgs, listen: str, engine_index: int = 0, parent_pid: int | None = None,
                    socket_setup=None, curve: ServerKeys | None = None) -> int:
    proc = EngineCoreProc(args, listen, engine_index, parent_pid, socket_setup, curve)
    logger.info("engine core ready: model %s, max_model_len %d", proc.core.model_info().model_name,
                proc.core.max_model_len)
    return proc.run()
