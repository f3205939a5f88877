"""The client side of the core protocol as a state machine with no IO (frontend/core_link/core_protocol.py): frames in,
events and frames out, on a made-up clock; and both core clients drive that same machine."""

import msgspec
import pytest

from common import wire_messages as P
from common.handshake import HELLO_INTERVAL_SECONDS
from common.limits import RequestLimits
from common.sampling_params import SamplingParams
from common.transport import DEAD_AFTER_SECONDS, HEARTBEAT_SECONDS
from frontend.core_link.core_client_mp import AsyncMPClient, SyncMPClient
from frontend.core_link.core_protocol import (CoreLost, CoreProtocol, CoreReady, HelloRejected, OutputsArrived,
                                              ReconnectNeeded, UtilityAnswered)

pytestmark = pytest.mark.unit

enc = msgspec.msgpack.encode


def ready(core_id="core-1", files=None, resumed=False, frontend_timeout=10.0) -> bytes:
    return enc(P.Ready(protocol_version=P.PROTOCOL_VERSION, core_id=core_id, model_name="m", max_model_len=64,
                       vocab_size=100, eos_token_ids=[2], tokenizer_files={"tokenizer.json": "{}"} if files is None
                       else files, resumed=resumed, frontend_timeout=frontend_timeout, limits=RequestLimits()))


def request(rid: str) -> P.EngineCoreRequest:
    return P.EngineCoreRequest(request_id=rid, prompt_token_ids=[1, 2], sampling_params=SamplingParams(max_tokens=2))


def outputs(*finished: str, running=()) -> bytes:
    outs = [P.EngineCoreOutput(request_id=r, new_token_ids=[5], finish_reason=P.FinishReason.LENGTH) for r in finished]
    outs += [P.EngineCoreOutput(request_id=r, new_token_ids=[5]) for r in running]
    return enc(P.EngineCoreOutputs(outputs=outs))


def live(now=0.0) -> CoreProtocol:
    protocol = CoreProtocol("test", now)
    protocol.start_handshake()
    (event,) = protocol.receive(P.READY, ready(), now)
    assert isinstance(event, CoreReady)
    return protocol


def test_hello_is_repeated_until_ready():
    protocol = CoreProtocol("test", 0.0)
    assert protocol.hello_due(0.0) is None  # no handshake asked for
    protocol.start_handshake()
    hello = protocol.hello_due(0.0)
    assert hello[0] == P.HELLO and msgspec.msgpack.decode(hello[1], type=P.Hello) == P.Hello(P.PROTOCOL_VERSION, "test")
    protocol.sent(hello, 0.0)
    assert protocol.hello_due(HELLO_INTERVAL_SECONDS / 2) is None
    assert protocol.hello_due(HELLO_INTERVAL_SECONDS) == hello
    assert protocol.receive(P.OUTPUTS, outputs(), 1.0) == [OutputsArrived(P.EngineCoreOutputs())]
    (event,) = protocol.receive(P.READY, ready(), 1.5)
    assert isinstance(event, CoreReady) and event.previous is None and event.info.model_name == "m"
    assert protocol.model_info is event.info and not protocol.awaiting_ready
    assert protocol.hello_due(5.0) is None


def test_a_rejected_hello_says_why():
    protocol = CoreProtocol("test", 0.0)
    protocol.start_handshake()
    assert protocol.receive(P.REJECTED, enc("protocol version 1 is not 4"), 0.1) == \
        [HelloRejected("protocol version 1 is not 4")]


def test_a_repeated_ready_keeps_the_files_and_one_from_a_stranger_needs_a_new_connection():
    protocol = live()
    protocol.start_handshake(resume=True)
    assert msgspec.msgpack.decode(protocol.hello_due(1.0)[1], type=P.Hello).resume
    (event,) = protocol.receive(P.READY, ready(files={}, resumed=True), 1.0)
    assert event.info.tokenizer_files == {"tokenizer.json": "{}"} and event.previous.core_id == "core-1"
    protocol.start_handshake()
    assert protocol.receive(P.READY, ready(core_id="core-2", files={}), 2.0) == [ReconnectNeeded()]
    assert protocol.awaiting_ready


def test_heartbeat_is_due_after_a_quiet_spell_and_silence_is_death():
    protocol = live(now=0.0)
    protocol.sent([P.ADD, b""], 0.0)
    assert protocol.heartbeat_due(HEARTBEAT_SECONDS / 2) is None
    assert protocol.heartbeat_due(HEARTBEAT_SECONDS) == [P.HEARTBEAT, b""]
    assert not protocol.core_silent(DEAD_AFTER_SECONDS)
    assert protocol.core_silent(DEAD_AFTER_SECONDS + 0.1)
    protocol.receive(P.OUTPUTS, outputs(), DEAD_AFTER_SECONDS)  # any frame is word from the core
    assert not protocol.core_silent(DEAD_AFTER_SECONDS + 0.1)


def test_resume_after_unknown_frontend_reports_the_requests_the_old_session_took():
    protocol = live(now=0.0)
    protocol.add_frames(request("a"))
    protocol.add_frames(request("b"))
    protocol.add_frames(request("c"))
    protocol.receive(P.OUTPUTS, outputs("a"), 1.0)  # finished: no longer in flight
    assert protocol.abort_frames(["b"]) == [P.ABORT, enc(["b"])]
    assert not protocol.session_may_be_gone(4.0) and protocol.session_may_be_gone(5.1)  # half the core's 10 s
    assert protocol.receive(P.UNKNOWN_FRONTEND, enc("who?"), 6.0) == \
        [CoreLost("the engine core does not know this frontend (it restarted)")]
    protocol.start_handshake(resume=True)
    (event,) = protocol.receive(P.READY, ready(files={}, resumed=False), 6.5)
    assert event.lost == ("c",) and protocol.in_flight == set()


def test_a_resumed_session_keeps_its_requests():
    protocol = live()
    protocol.add_frames(request("a"))
    protocol.start_handshake(resume=True)
    (event,) = protocol.receive(P.READY, ready(files={}, resumed=True), 1.0)
    assert event.lost == () and protocol.in_flight == {"a"}


def test_utility_results_are_matched_by_call_id():
    protocol = live()
    first, frames = protocol.utility_frames(P.UtilityMethod.GET_STATS)
    call = msgspec.msgpack.decode(frames[1], type=P.UtilityCall)
    assert frames[0] == P.UTILITY and (call.call_id, call.method) == (first, P.UtilityMethod.GET_STATS)
    second, _ = protocol.utility_frames(P.UtilityMethod.PING)
    assert protocol.receive(P.UTILITY_RESULT, enc(P.UtilityResult(second, True)), 1.0) == \
        [UtilityAnswered(second, True, None)]
    protocol.forget_call(first)  # its caller gave up: a late answer is dropped
    assert protocol.receive(P.UTILITY_RESULT, enc(P.UtilityResult(first, True)), 1.0) == []
    assert protocol.pending_calls == set()


def test_shutdown_and_a_restarted_core_are_a_lost_core():
    protocol = live()
    assert protocol.receive(P.SHUTDOWN, enc("bye"), 1.0) == [CoreLost("bye")]
    assert protocol.receive(P.READY, ready(), 1.0) == []  # the same core saying READY again
    assert protocol.receive(P.READY, ready(core_id="core-2"), 1.0) == [CoreLost("a restarted engine core answered")]


def test_an_abort_of_nothing_is_no_frame():
    assert live().abort_frames([]) is None


def test_both_clients_drive_the_same_protocol_machine():
    address = "tcp://127.0.0.1:9"  # nothing answers there: the clients are only built
    sync_client = SyncMPClient.__new__(SyncMPClient)
    sync_client._pending_outputs = None
    async_client = AsyncMPClient(None, address)
    try:
        from frontend.core_link.core_client_mp import MPClientBase
        MPClientBase.__init__(sync_client, None, address, asyncio_ctx=False, client_name="LLM")
        assert type(sync_client.protocol) is type(async_client.protocol) is CoreProtocol
        assert sync_client.protocol is not async_client.protocol
    finally:
        sync_client.shutdown()
        async_client.shutdown()
