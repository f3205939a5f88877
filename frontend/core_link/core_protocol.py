"""A frontend's half of the conversation with one engine core, as a state machine with no IO.

Frames go in (`receive(kind, body, now)`), events come out; the frames to send come out of the methods
that make them (`hello_due`, `add_frames`, `abort_frames`, `utility_frames`, `heartbeat_due`), and the IO
side says when it sent one (`sent`). Time is always passed in, so the same machine runs under the sync
client's blocking loop, the async client's event loop, and a unit test's made-up clock.

What it knows: the handshake (HELLO repeated until READY or REJECTED; a repeated READY on the same
connection keeps the tokenizer files it had), when a heartbeat is due and when the core has been silent
too long, whether the core may have ended this frontend's session (then HELLO with resume), which core
requests are in flight there (those a session that did not resume has lost), and the utility calls that
wait for their answers, by call id. What the IO side keeps: sockets, the connection monitor, the core
child process, and what to do when the core is lost.
"""

import itertools
from dataclasses import dataclass

import msgspec

from common import wire_messages as P
from common.handshake import HELLO_INTERVAL_SECONDS, CoreRejected, hello_frames, read_answer
from common.transport import DEAD_AFTER_SECONDS, FRONTEND_SILENT_SECONDS, HEARTBEAT_SECONDS

_encoder = msgspec.msgpack.Encoder()
_outputs_decoder = msgspec.msgpack.Decoder(P.EngineCoreOutputs)
_result_decoder = msgspec.msgpack.Decoder(P.UtilityResult)
_text_decoder = msgspec.msgpack.Decoder(str)

HEARTBEAT_FRAMES = [P.HEARTBEAT, b""]


# ---- events ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CoreReady:
    """The handshake is done. `lost`: core requests a session that did not resume took with it."""
    info: P.Ready
    previous: P.Ready | None
    lost: tuple[str, ...] = ()


@dataclass(frozen=True)
class HelloRejected:
    reason: str


@dataclass(frozen=True)
class ReconnectNeeded:
    """A READY without tokenizer files from a core this client has none from: only a new connection brings them."""


@dataclass(frozen=True)
class OutputsArrived:
    outputs: P.EngineCoreOutputs


@dataclass(frozen=True)
class UtilityAnswered:
    call_id: int
    result: object
    error: str | None


@dataclass(frozen=True)
class CoreLost:
    reason: str


Event = CoreReady | HelloRejected | ReconnectNeeded | OutputsArrived | UtilityAnswered | CoreLost


class CoreProtocol:
    def __init__(self, client_name: str, now: float):
        self.client_name = client_name
        self.model_info: P.Ready | None = None
        self.awaiting_ready = False
        self._resume = False
        self._next_hello = 0.0
        self.last_heard = now
        self.last_sent = now  # the core ends the session of a frontend silent too long
        self._call_ids = itertools.count()
        self.pending_calls: set[int] = set()
        self.in_flight: set[str] = set()  # core requests sent and neither finished nor aborted

    # ---- handshake --------------------------------------------------------------------------

    def start_handshake(self, resume: bool = False) -> None:
        """Say HELLO (now, then every HELLO_INTERVAL_SECONDS) until READY. resume: keep the session if the
        core still has it on this connection."""
        self.awaiting_ready, self._resume, self._next_hello = True, resume, 0.0

    def hello_due(self, now: float) -> list[bytes] | None:
        if not self.awaiting_ready or now < self._next_hello:
            return None
        return hello_frames(self.client_name, self._resume)

    # ---- what goes out ----------------------------------------------------------------------

    def sent(self, frames: list[bytes], now: float) -> None:
        """The IO side sent `frames`."""
        self.last_sent = now
        if frames[0] == P.HELLO:
            self._next_hello = now + HELLO_INTERVAL_SECONDS

    def add_frames(self, request: P.EngineCoreRequest) -> list[bytes]:
        self.in_flight.add(request.request_id)
        return [P.ADD, _encoder.encode(request)]

    def abort_frames(self, request_ids: list[str]) -> list[bytes] | None:
        """The ABORT to send; None when there is nothing to abort."""
        self.in_flight.difference_update(request_ids)
        return [P.ABORT, _encoder.encode(list(request_ids))] if request_ids else None

    def utility_frames(self, method: P.UtilityMethod, args=()) -> tuple[int, list[bytes]]:
        """A new call: its id (its answer comes as UtilityAnswered with it) and its frames. A name that is no
        UtilityMethod is a ValueError here, before anything is sent."""
        method = P.UtilityMethod(method)
        call_id = next(self._call_ids)
        self.pending_calls.add(call_id)
        return call_id, [P.UTILITY, _encoder.encode(P.UtilityCall(call_id, method, list(args)))]

    def forget_call(self, call_id: int) -> None:
        """The caller stopped waiting (a timeout): a late answer is dropped."""
        self.pending_calls.discard(call_id)

    def heartbeat_due(self, now: float) -> list[bytes] | None:
        return HEARTBEAT_FRAMES if now - self.last_sent >= HEARTBEAT_SECONDS else None

    # ---- time -------------------------------------------------------------------------------

    def core_silent(self, now: float) -> bool:
        """No word from the core for DEAD_AFTER_SECONDS (it speaks at least every heartbeat)."""
        return now - self.last_heard > DEAD_AFTER_SECONDS

    def session_may_be_gone(self, now: float) -> bool:
        """Quiet for half the core's limit: it may have ended this frontend's session (say HELLO, resume)."""
        limit = (self.model_info.frontend_timeout if self.model_info else 0.0) or FRONTEND_SILENT_SECONDS
        return now - self.last_sent > limit / 2

    # ---- what comes in ----------------------------------------------------------------------

    def receive(self, kind: bytes, body: bytes, now: float) -> list[Event]:
        """Events for one frame from the core (a malformed body raises one of P.MALFORMED)."""
        self.last_heard = now
        if kind == P.OUTPUTS:
            outputs = _outputs_decoder.decode(body)
            for out in outputs.outputs:
                if out.finish_reason is not None:
                    self.in_flight.discard(out.request_id)
            return [OutputsArrived(outputs)]
        if kind == P.UTILITY_RESULT:
            result = _result_decoder.decode(body)
            if result.call_id not in self.pending_calls:
                return []  # an answer nobody waits for any more
            self.pending_calls.discard(result.call_id)
            return [UtilityAnswered(result.call_id, result.result, result.error)]
        if self.awaiting_ready:
            return self._answer_to_hello(kind, body)
        if kind == P.SHUTDOWN:
            return [CoreLost(_text_decoder.decode(body))]
        if kind == P.UNKNOWN_FRONTEND:
            return [CoreLost("the engine core does not know this frontend (it restarted)")]
        if kind == P.READY and self.model_info is not None:
            if read_answer(kind, body).core_id != self.model_info.core_id:
                return [CoreLost("a restarted engine core answered")]
        return []

    def _answer_to_hello(self, kind: bytes, body: bytes) -> list[Event]:
        try:
            info = read_answer(kind, body)
        except CoreRejected as e:
            return [HelloRejected(str(e))]
        if info is None:
            return []  # SHUTDOWN, UNKNOWN_FRONTEND from before the HELLO: the READY will say what is there now
        if not info.tokenizer_files:  # a repeated READY: the files came before, from this core
            if self.model_info is None or self.model_info.core_id != info.core_id:
                return [ReconnectNeeded()]
            info.tokenizer_files = self.model_info.tokenizer_files
        previous, self.model_info, self.awaiting_ready = self.model_info, info, False
        lost = ()
        if not info.resumed:  # a fresh session: whatever was in flight in the old one is gone
            lost, self.in_flight = tuple(sorted(self.in_flight)), set()
        return [CoreReady(info, previous, lost)]
