"""EngineCoreProc: the engine core as its own process, serving frontends over ZeroMQ.

Threads:
- IO thread: owns the ROUTER socket and the table of frontend sessions (engine_core/proc/frontend_sessions.py).
  Decodes incoming frames (a bad frame is logged and dropped) into the input queue, answers HELLO,
  forwards encoded outputs from the busy loop to the session they belong to, and sends each frontend the
  latest stats as a heartbeat when it has heard nothing from the core for HEARTBEAT_SECONDS.
- busy loop (main thread): applies queued inputs, then schedule -> execute -> update, and routes
  each step's outputs per frontend session.

Sessions: a frontend's session begins with HELLO and ends on GOODBYE, when its connection drops (a
monitor on the socket reports it at once), when it has been silent for FRONTEND_SILENT_SECONDS (frontends
send HEARTBEAT while they wait for outputs), when it does not read what the core sends (CORE_SNDHWM frames
queued), or when it says HELLO again after it sent work (it lost the core for a while and starts afresh;
a HELLO with `resume` set keeps the session: the sync client, quiet between calls, checks it is still known).
An ended session's requests are aborted. The busy loop knows a session by its own key, not by the
routing id, so outputs of an ended session are dropped, never delivered to a later connection with the
same routing id; a frame from a connection (or, with CURVE, a public key) other than the one that said
HELLO is answered UNKNOWN_FRONTEND, as is one from a frontend this core does not know (it restarted).
Request ids are namespaced by session inside the core, so two frontends may use the same ids and an
abort from one never touches another's requests.

HELLO is answered with READY at most every HELLO_ANSWER_SECONDS per session; the READY with the tokenizer
files (megabytes) at most once per connection, later ones carry no files (the frontend keeps its own).

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
from zmq.utils.monitor import recv_monitor_message

from common import wire_messages as P
from common.config import EngineArgs
from common.heap import freeze_startup_heap
from common.curve import Authenticator, ServerKeys, apply_server
from common.lora import LoRARequest
from common.wire_messages import EngineCoreOutput, EngineCoreOutputs, FinishReason
from common.request_ids import scoped_id, unscoped_id
from common.transport import (CORE_RCVHWM, CORE_SNDHWM, HEARTBEAT_SECONDS, MAX_REQUEST_FRAME_BYTES,
                              frontend_silent_seconds, is_loopback, limit_socket)
from common.validation import check_request
from common.start_failure import write_start_failure
from engine_core.proc.core import EngineCore
from engine_core.proc.frontend_sessions import FrontendSessions, Session
from engine_core.proc.stats_log import ThroughputLog

logger = logging.getLogger("nvllm")

RECEIVE_BATCH = 64  # frames read per IO loop turn (then outputs, heartbeats and silence are looked at)
# decoded frames waiting for the busy loop, counted and by their decoded size; beyond either the IO thread
# stops reading (checked before every frame, not once per batch: 64 big frames decode to ~230 MB), so a
# flood waits in ZeroMQ's bounded queues (and then in its senders) instead of growing this process
MAX_PENDING_INPUTS = 1024
MAX_PENDING_INPUT_BYTES = 16 * 1024 * 1024
DECODED_TOKEN_BYTES = 36  # a prompt token decodes to a Python int (28 bytes) and its list slot (8)
# an `inputs` item with no frame: the executor failed (its monitor thread put it), look at its health now
WAKE = "wake"

_decoders = {
    P.HELLO: msgspec.msgpack.Decoder(P.Hello),
    P.ADD: msgspec.msgpack.Decoder(P.EngineCoreRequest),
    P.ABORT: msgspec.msgpack.Decoder(list[str]),
    P.UTILITY: msgspec.msgpack.Decoder(P.UtilityCall),
}


def _tag(identity: bytes) -> str:
    return identity.hex()


def _user_id(frame: zmq.Frame) -> str | None:
    """The CURVE public key (Z85) the authenticator admitted this frame's connection with."""
    try:
        return frame.get("User-Id")
    except zmq.ZMQError:  # no ZAP user id on this connection
        return None


class EngineCoreProc:
    def __init__(self, args: EngineArgs, listen: str, engine_index: int = 0, parent_pid: int | None = None,
                 curve: ServerKeys | None = None):
        self.core = EngineCore(args)
        self.throughput_log = ThroughputLog()
        self.engine_index = engine_index
        silent_seconds = frontend_silent_seconds()
        info = msgspec.structs.replace(self.core.model_info(), engine_index=engine_index,
                                       frontend_timeout=silent_seconds)
        self.ready = msgspec.msgpack.encode(info)
        self.ready_again = msgspec.msgpack.encode(msgspec.structs.replace(info, tokenizer_files={}))
        self.ready_resumed = msgspec.msgpack.encode(msgspec.structs.replace(info, tokenizer_files={}, resumed=True))
        self.parent_pid = parent_pid
        # SimpleQueue: its put is reentrant, so the signal handlers may use it even when the signal lands
        # while the main thread is inside get (a Queue's lock is taken there: the handler would deadlock).
        # Items: (kind, session key, message, size) from the IO thread; None: stop; WAKE: check the executor
        self.inputs: queue.SimpleQueue = queue.SimpleQueue()
        self.queued_bytes = self.applied_bytes = 0  # frame bytes put on / taken off `inputs`
        self.encoder = msgspec.msgpack.Encoder()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        limit_socket(self.sock)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_FRAME_BYTES)
        self.sock.setsockopt(zmq.RCVHWM, CORE_RCVHWM)
        self.sock.setsockopt(zmq.SNDHWM, CORE_SNDHWM)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full queue or a gone peer is an error we act on, not a drop
        # connections accepted and closed, by file descriptor (ZMQ_ROUTER_NOTIFY is a draft API pyzmq lacks)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self.auth = None
        if curve is not None:  # the authenticator must run before the first frontend connects
            self.auth = Authenticator(self.ctx, curve)
            self.auth.start()
            apply_server(self.sock, curve)
            logger.info("CURVE on: %d frontend public key(s) authorized", len(curve.authorized))
        elif not is_loopback(listen):
            logger.warning("the engine core listens on %s WITHOUT CURVE: traffic is neither authenticated nor "
                           "encrypted", listen)
        self.sock.bind(listen)
        self.listen = listen
        # the busy loop hands encoded frames to the IO thread through an inproc pipe
        self.out_addr = f"inproc://outputs-{id(self)}"
        self.out_pull = self.ctx.socket(zmq.PULL)
        self.out_pull.bind(self.out_addr)
        self.out_push = self.ctx.socket(zmq.PUSH)
        self.out_push.connect(self.out_addr)
        self.sessions = FrontendSessions(silent_seconds)
        self._last_unknown_warning = -1.0
        self.owner: dict[str, bytes] = {}  # core request id -> frontend session key
        self.stats = msgspec.msgpack.encode(EngineCoreOutputs())
        self.stopping = threading.Event()
        self.io_thread = threading.Thread(target=self._io_loop, name="nvllm-core-io", daemon=True)

    # ---- IO thread ----------------------------------------------------------------------------

    def _io_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.out_pull, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        while not self.stopping.is_set():
            events = dict(poller.poll(timeout=int(HEARTBEAT_SECONDS * 1000 / 2)))
            # connection events first: a closed connection's session ends before a frame from a new
            # connection (which may reuse its file descriptor and routing id) is read
            self._connection_events()
            for _ in range(RECEIVE_BATCH if self.sock in events else 0):
                if self._backlog():
                    break
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._receive(frames)
                self._connection_events()
            backlog = self._backlog()
            if self.out_pull in events:
                while True:
                    try:
                        key, kind, body = self.out_pull.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    session = self.sessions.by_key(key)
                    if session is not None:  # else the session ended: its outputs go nowhere
                        self._send(session, kind, body)
            now = time.monotonic()
            for session in self.sessions.heartbeat_due(now, HEARTBEAT_SECONDS):
                self._send(session, P.OUTPUTS, self.stats)
            for session in self.sessions.silent(now) if not backlog else ():  # unread is not silent
                self._end(session, f"silent for {now - session.last_heard:.0f} s")
            if backlog:  # the busy loop is behind: give it time rather than spin on a readable socket
                time.sleep(0.005)
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                logger.error("the frontend that started this engine core is gone; shutting down")
                self.stopping.set()
                self.inputs.put(None)

    def _backlog(self) -> bool:
        return (self.inputs.qsize() >= MAX_PENDING_INPUTS
                or self.queued_bytes - self.applied_bytes >= MAX_PENDING_INPUT_BYTES)

    def _connection_events(self) -> None:
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            # ACCEPTED too: a new connection on a file descriptor means any earlier one there is gone
            for session in self.sessions.connection_closed(int(event["value"])):
                self._end(session, "its connection closed")

    def _end(self, session: Session, why: str | None) -> None:
        """Ends a session (`why` None: the frontend said GOODBYE); the busy loop aborts its requests."""
        if not self.sessions.end(session):
            return
        if why is not None:
            logger.log(logging.DEBUG if session.name == "healthcheck" else logging.INFO,
                       "frontend %s%s: %s; its session ends", session.tag,
                       f" ({session.name})" if session.name else "", why)
        self.inputs.put((P.GOODBYE, session.key, None, 0))

    def _send(self, session: Session, kind: bytes, body: bytes) -> None:
        try:
            self.sock.send_multipart([session.identity, kind, body], zmq.NOBLOCK)
            session.last_sent = time.monotonic()
        except zmq.Again:
            self._end(session, f"it does not read what the core sends ({CORE_SNDHWM} frames queued)")
        except zmq.ZMQError as e:  # EHOSTUNREACH: its connection is gone
            self._end(session, f"cannot send to it ({e})")

    def _reply(self, identity: bytes, kind: bytes, text: str) -> None:
        """A short answer to a peer that has no session; dropped if it does not read."""
        try:
            self.sock.send_multipart([identity, kind, self.encoder.encode(text)], zmq.NOBLOCK)
        except zmq.ZMQError as e:
            logger.debug("could not answer %s: %s", _tag(identity)[:8], e)

    def _receive(self, frames: list[zmq.Frame]) -> None:
        if len(frames) not in (2, 3):
            logger.warning("dropped a frame with %d parts (expected type + body)", len(frames) - 1)
            return
        identity, kind, body = frames[0].bytes, frames[1].bytes, frames[2].bytes if len(frames) == 3 else b""
        fd = frames[1].get(zmq.SRCFD)  # the connection it came on
        user_id = _user_id(frames[1]) if self.auth is not None else None
        if kind == P.HELLO:
            try:
                hello = _decoders[P.HELLO].decode(body)
            except P.MALFORMED as e:
                logger.warning("dropped a malformed HELLO from %s: %s", _tag(identity)[:8], e)
                return
            self._hello(identity, fd, user_id, hello)
            return
        session = self.sessions.find(identity, fd, user_id)
        if session is None and kind == P.GOODBYE:  # nothing to end
            return
        if session is None:
            if time.monotonic() - self._last_unknown_warning >= 1.0:  # a flood must not flood the log
                self._last_unknown_warning = time.monotonic()
                logger.warning("dropped a frame from %s, which has no session with this core (such drops are "
                               "logged at most once a second)", _tag(identity)[:8])
            self._reply(identity, P.UNKNOWN_FRONTEND, "this engine core does not know this frontend (it restarted, or "
                                                      "ended the session): say HELLO again")
            return
        session.last_heard = time.monotonic()
        if kind == P.HEARTBEAT:
            return
        if kind == P.GOODBYE:
            self._end(session, None)
            return
        decoder = _decoders.get(kind)
        if decoder is None:
            logger.warning("dropped a frame of unknown type %r from %s", kind[:8], session.tag)
            return
        try:
            message = decoder.decode(body)
        except P.MALFORMED as e:
            logger.warning("dropped a malformed %s frame from %s: %s", kind.hex(), session.tag, e)
            return
        size = len(body)
        if kind == P.ADD:
            session.has_work = True
            size += DECODED_TOKEN_BYTES * len(message.prompt_token_ids)
        self.queued_bytes += size  # only this thread writes it; the busy loop writes applied_bytes
        self.inputs.put((kind, session.key, message, size))

    def _hello(self, identity: bytes, fd: int, user_id: str | None, hello: P.Hello) -> None:
        if hello.protocol_version != P.PROTOCOL_VERSION:
            self._reply(identity, P.REJECTED, f"protocol version {hello.protocol_version} is not {P.PROTOCOL_VERSION}")
            return
        now = time.monotonic()
        session = self.sessions.get(identity)
        resumed = False
        if session is not None:
            if session.fd != fd or session.user_id != user_id:
                self._end(session, "it connected again")
                session = None
            elif session.has_work and not hello.resume:  # it lost the core for a while: its requests are abandoned
                self._end(session, "it started afresh")
                session = None
            else:  # a HELLO repeated before READY arrived, or a resume: the same session
                session.last_heard = now
                resumed = hello.resume
        if session is None:
            session = self.sessions.start(identity, fd, user_id, hello.client_name, now)
            logger.log(logging.DEBUG if hello.client_name == "healthcheck" else logging.INFO,
                       "frontend %s connected%s", session.tag, f" ({hello.client_name})" if hello.client_name else "")
        if self.sessions.may_answer_hello(session, now):
            if self.sessions.take_full_ready(session):
                self._send(session, P.READY, self.ready)
            else:
                self._send(session, P.READY, self.ready_resumed if resumed else self.ready_again)

    # ---- busy loop ----------------------------------------------------------------------------

    def run(self) -> int:
        for stop_signal in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop_signal, lambda *_: self.inputs.put(None))  # no locks in a signal handler
        self.core.on_executor_failure(lambda: self.inputs.put(WAKE))
        self.io_thread.start()
        logger.info("engine core %d listening on %s", self.engine_index, self.listen)
        try:
            while not self.stopping.is_set():
                self._apply_inputs(block=not self.core.has_unfinished_requests())
                if self.stopping.is_set():
                    break
                try:
                    self.core.check_health()  # a tensor-parallel rank died while the core waited
                    if not self.core.has_unfinished_requests():
                        continue
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
            if item is WAKE:  # the executor failed: the loop looks at its health before anything else
                return
            kind, identity, message, size = item
            self.applied_bytes += size
            try:
                self._apply(kind, identity, message)
            except Exception as e:  # a request the engine cannot take must not take the engine down
                logger.exception("could not apply a %s frame: %s", kind.hex(), e)

    def _apply(self, kind: bytes, identity: bytes, message) -> None:
        tag = _tag(identity)
        if kind == P.ADD:
            rid = scoped_id(tag, message.request_id)
            try:  # every field, before the scheduler sees it: a bad one is this request's ERROR, nothing more
                check_request(message, self.core.limits)
                if message.lora_request is not None:
                    self.core.add_lora(message.lora_request)
                if rid in self.owner:
                    raise ValueError(f"request_id {message.request_id!r} is already running")
            except ValueError as e:
                self._push_outputs(identity, [EngineCoreOutput(
                    request_id=message.request_id, new_token_ids=[], finish_reason=FinishReason.ERROR,
                    failure=P.RequestRejected(str(e)))])
                return
            self.owner[rid] = identity
            self.core.add_request(msgspec.structs.replace(message, request_id=rid))
        elif kind == P.ABORT:
            scoped = [scoped_id(tag, r) for r in message]
            self.core.abort_requests([rid for rid in scoped if rid in self.owner])
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
        result = P.UtilityResult(call.call_id)  # the decoder let only a UtilityMethod through
        if call.method is P.UtilityMethod.RESET_PREFIX_CACHE:
            result.result = self.core.reset_prefix_cache()
        elif call.method is P.UtilityMethod.GET_STATS:
            result.result = self.core.scheduler.get_stats()
        elif call.method is P.UtilityMethod.PING:
            result.result = True
        elif call.method in (P.UtilityMethod.ADD_LORA, P.UtilityMethod.REMOVE_LORA):
            try:
                lora = msgspec.convert(call.args, LoRARequest)
                if call.method is P.UtilityMethod.ADD_LORA:
                    self.core.add_lora(lora)
                    result.result = True
                else:
                    result.result = self.core.remove_lora(lora)
            except (ValueError, msgspec.ValidationError) as e:
                result.error = str(e)
        self.out_push.send_multipart([identity, P.UTILITY_RESULT, self.encoder.encode(result)])

    def _route(self, outputs: EngineCoreOutputs) -> None:
        per_frontend: dict[bytes, list[EngineCoreOutput]] = {}
        for out in outputs.outputs:
            identity = self.owner.get(out.request_id)
            if identity is None:
                continue
            if out.finish_reason is not None:
                del self.owner[out.request_id]
            out.request_id = unscoped_id(out.request_id)
            per_frontend.setdefault(identity, []).append(out)
        stats = outputs.scheduler_stats
        # what heartbeats repeat: the gauges and totals, not this step's counts
        latest = msgspec.structs.replace(stats, step=None) if stats is not None else None
        self.stats = self.encoder.encode(EngineCoreOutputs(scheduler_stats=latest, timestamp=outputs.timestamp))
        for identity, outs in per_frontend.items():
            self._push_outputs(identity, outs, stats, outputs.timestamp)

    def _push_outputs(self, identity, outs, stats=None, timestamp=None) -> None:
        batch = EngineCoreOutputs(outputs=outs, scheduler_stats=stats or self.core.scheduler.get_stats(),
                                  timestamp=timestamp or time.time())
        self.out_push.send_multipart([identity, P.OUTPUTS, self.encoder.encode(batch)])

    def _shutdown(self) -> None:
        logger.info("engine core shutting down: aborting %d in-flight requests", len(self.owner))
        if self.owner:
            self.core.abort_requests(list(self.owner))
            aborted = self.core.step()
            for out in aborted.outputs:
                out.failure = P.CoreShutDown("the engine core shut down")
            self._route(aborted)
        for identity in self.sessions.keys():
            self.out_push.send_multipart([identity, P.SHUTDOWN, self.encoder.encode("the engine core shut down")])
        time.sleep(0.2)  # let the IO thread flush the last frames
        self.stopping.set()
        self.io_thread.join(timeout=2)
        self.core.shutdown()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.destroy(linger=0)


def run_engine_core(args: EngineArgs, listen: str, engine_index: int = 0, parent_pid: int | None = None,
                    curve: ServerKeys | None = None, start_failure_file: str | None = None) -> int:
    try:
        proc = EngineCoreProc(args, listen, engine_index, parent_pid, curve)
    except Exception as e:
        if start_failure_file is not None:  # the frontend that started this process raises it where its user called
            write_start_failure(start_failure_file, e)
        raise
    freeze_startup_heap()  # the model and imports: out of the garbage collector's walks from here on
    logger.info("engine core ready: model %s, max_model_len %d", proc.core.model_info().model_name,
                proc.core.max_model_len)
    return proc.run()
