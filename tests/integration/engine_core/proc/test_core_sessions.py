"""Frontend sessions on a shared engine core: heartbeats per frontend, frontends that vanish or fall
silent, HELLO floods, routing ids reused by a new connection, aborts that must not be dropped, and
`nvllm serve` restarting its engine core child."""

import asyncio
import os
import signal
import threading
import time

import httpx
import msgspec
import pytest
import zmq

from common import wire_messages as P
from common.config import EngineArgs
from common.sampling_params import RequestOutputKind, SamplingParams
from common.transport import DEAD_AFTER_SECONDS, ENV_FRONTEND_SILENT, private_ipc_address
from engine_core.proc.frontend_sessions import HELLO_ANSWER_SECONDS, FrontendSessions
from tests.support.http_helpers import Proc, free_port, metric, wait_healthy, wait_until

pytestmark = pytest.mark.integration

SILENT = 3.0  # `core` ends the session of a frontend silent this long: for the tests that wait for that
# `patient_core` waits this long: a test that must tell "ended at once" from "ended for silence", or stay
# inside (limit / 2, limit), gets seconds of margin however slowly a busy machine runs it
PATIENT = 12.0
WAIT = 120  # the deadline of every wait for something expected within a second or two
LONG = SamplingParams(max_tokens=480, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
# requests of LONG that a one-at-a-time core needs far longer than PATIENT to finish (each takes ~0.8 s
# here), so a core gone idle sooner aborted them
MANY = 100


def _start_core(tiny_models, silent: float):
    """(address, Popen) of a core that runs one request at a time (so queued requests take seconds)."""
    from frontend.core_link.core_process import start_core_process

    address = private_ipc_address()
    args = EngineArgs(model=tiny_models["llama"], dtype="float32", kv_cache_memory="64MiB", max_model_len=512,
                      max_num_seqs=1)
    os.environ[ENV_FRONTEND_SILENT] = str(silent)
    try:
        proc = start_core_process(args, address)
    finally:
        del os.environ[ENV_FRONTEND_SILENT]
    peer = Peer(address)
    peer.hello(timeout=300)  # the core is up
    peer.close()
    return address, proc


@pytest.fixture(scope="module")
def core(tiny_models):
    from frontend.core_link.core_process import stop_core_process

    address, proc = _start_core(tiny_models, SILENT)
    yield address, proc
    stop_core_process(proc)


@pytest.fixture(scope="module")
def patient_core(tiny_models):
    from frontend.core_link.core_process import stop_core_process

    address, proc = _start_core(tiny_models, PATIENT)
    yield address, proc
    stop_core_process(proc)


class Peer:
    """A frontend speaking raw frames through a DEALER socket."""

    def __init__(self, address: str, identity: bytes | None = None, rcvhwm: int | None = None):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        if identity is not None:
            self.sock.setsockopt(zmq.ROUTING_ID, identity)
        if rcvhwm is not None:  # a peer that does not read: let the core's queue, not this one's, fill
            self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
            self.sock.setsockopt(zmq.RCVBUF, 4096)
        self.sock.connect(address)

    def send(self, kind: bytes, message=None) -> None:
        self.sock.send_multipart([kind, b"" if message is None else msgspec.msgpack.encode(message)])

    def recv(self, timeout: float) -> tuple[bytes, bytes] | None:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        kind, body = self.sock.recv_multipart()
        return kind, body

    def hello(self, timeout: float = WAIT) -> P.Ready:
        self.send(P.HELLO, P.Hello(P.PROTOCOL_VERSION, "test"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            frame = self.recv(0.5)
            if frame is not None and frame[0] == P.READY:
                return msgspec.msgpack.decode(frame[1], type=P.Ready)
        raise TimeoutError("no READY")

    def add(self, request_id: str, params: SamplingParams = LONG) -> None:
        self.send(P.ADD, P.EngineCoreRequest(request_id=request_id, prompt_token_ids=[1, 2, 3, 4],
                                             sampling_params=params))

    def stats(self, timeout: float = WAIT) -> P.SchedulerStats:
        self.send(P.UTILITY, P.UtilityCall(7, "get_stats"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            frame = self.recv(0.5)
            if frame is not None and frame[0] == P.UTILITY_RESULT:
                return msgspec.msgpack.decode(frame[1], type=P.UtilityResult).result
            assert frame is None or frame[0] == P.OUTPUTS, frame
        raise TimeoutError("no UTILITY_RESULT")

    def close(self) -> None:
        self.sock.close(linger=0)  # vanishes: no GOODBYE


def drain(peer: Peer, seconds: float) -> list[tuple[bytes, bytes]]:
    """Every frame the peer receives in the next `seconds`."""
    frames, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        frame = peer.recv(left)
        if frame is not None:
            frames.append(frame)
    return frames


def drain_until(peer: Peer, done, timeout: float = WAIT) -> list[tuple[bytes, bytes]]:
    """Frames the peer receives until `done(frames)` holds (or `timeout` s have passed)."""
    frames, deadline = [], time.monotonic() + timeout
    while not done(frames) and (left := deadline - time.monotonic()) > 0:
        frame = peer.recv(min(left, 0.5))
        if frame is not None:
            frames.append(frame)
    return frames


def wait_idle(observer: Peer, timeout: float = WAIT) -> float:
    """Seconds until the core runs and queues nothing and every KV block is free."""
    started = time.monotonic()
    while True:
        s = observer.stats()
        g = s.gauges
        if g.num_running == 0 and g.num_waiting == 0 and g.num_free_blocks == g.num_total_blocks:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, s
        observer.send(P.HEARTBEAT)
        time.sleep(0.1)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


# ---- the session table alone ---------------------------------------------------------------------

def test_session_table_binds_connection_and_key():
    table = FrontendSessions(silent_seconds=10)
    a = table.start(b"id", fd=5, user_id="keyA", name="x", now=0.0)
    assert table.find(b"id", 5, "keyA") is a
    assert table.find(b"id", 6, "keyA") is None  # another connection with the same routing id
    assert table.find(b"id", 5, "keyB") is None  # another CURVE key
    assert table.take_full_ready(a) and not table.take_full_ready(a)  # the files once per connection
    assert table.may_answer_hello(a, 1.0) and not table.may_answer_hello(a, 1.1)
    assert table.silent(5.0) == [] and table.silent(10.5) == [a]
    assert table.connection_closed(5) == [a] and table.end(a) and not table.end(a)
    b = table.start(b"id", fd=5, user_id="keyA", name="x", now=0.0)
    assert b.key != a.key and table.by_key(a.key) is None  # an ended session's outputs go nowhere
    assert table.take_full_ready(b)  # a closed connection's record went with it


# ---- through a real core -------------------------------------------------------------------------

def test_idle_frontend_hears_the_core_while_another_streams(core):
    """A streams for > DEAD_AFTER_SECONDS; B, an AsyncLLM with nothing to do, keeps hearing the core
    (heartbeats are per frontend) and is never declared dead."""
    from frontend.async_engine.async_llm import AsyncLLM

    address, _ = core
    streamed: list[float] = []
    stop = threading.Event()

    def stream():
        a = Peer(address)
        a.hello()
        n, last_sent = 0, time.monotonic()
        while not stop.is_set():
            a.add(f"r{n}")
            n += 1
            while not stop.is_set():  # until this one finishes
                if time.monotonic() - last_sent > 0.5:  # a real frontend's heartbeat
                    a.send(P.HEARTBEAT)
                    last_sent = time.monotonic()
                frame = a.recv(0.5)
                if frame is None or frame[0] != P.OUTPUTS:
                    continue
                outs = msgspec.msgpack.decode(frame[1], type=P.EngineCoreOutputs).outputs
                if outs:
                    streamed.append(time.monotonic())
                if any(o.finish_reason is not None for o in outs):
                    break
        a.send(P.GOODBYE)
        a.close()

    async def idle_b():
        engine = await AsyncLLM.create(address=address)
        downs = []  # B reconnects at once after losing the core: count the losses, not the state
        core_down = engine.core_down
        engine.core_down = lambda link, error, lost: (downs.append(str(error)), core_down(link, error, lost))
        thread = threading.Thread(target=stream)
        thread.start()
        try:
            # as long as it takes A to stream for longer than B may go without a word from the core
            deadline = time.monotonic() + WAIT
            while not (streamed and streamed[-1] - streamed[0] > DEAD_AFTER_SECONDS + 0.5):
                assert time.monotonic() < deadline and thread.is_alive(), "A never streamed long enough"
                await asyncio.sleep(0.1)
            return downs
        finally:
            stop.set()
            thread.join(WAIT)
            engine.shutdown()

    assert asyncio.run(idle_b()) == []


def test_vanished_frontend_has_its_requests_aborted(patient_core):
    """A queues a minute of work and closes its socket without GOODBYE: the core aborts it at once, long
    before the work could end or the core would end A's session for silence."""
    address, _ = patient_core
    observer = Peer(address)
    observer.hello()
    a = Peer(address)
    a.hello()
    for i in range(MANY):  # 480 tokens each, one at a time
        a.add(f"r{i}")
    assert a.recv(WAIT) is not None
    wait_until(lambda: observer.stats().gauges.num_running, WAIT, what="A's first request to run")
    a.send(P.HEARTBEAT)  # A's last word: silence could end its session only PATIENT s after this
    last_word = time.monotonic()
    a.close()
    wait_idle(observer)
    assert time.monotonic() - last_word < PATIENT, "the core ended A's session for silence, not when it left"
    observer.close()


def test_silent_frontend_has_its_requests_aborted_and_its_session_ended(core):
    address, _ = core
    observer = Peer(address)
    observer.hello()
    a = Peer(address)
    a.hello()
    for i in range(2 * MANY):  # minutes of work
        a.add(f"r{i}")
    # A says nothing from here on but reads what comes: its session must end for silence, not because
    # its unread outputs filled the core's send queue (which a fast core reaches within seconds)
    reading = threading.Event()
    reading.set()

    def read_while_silent():
        while reading.is_set():
            a.recv(0.05)

    reader = threading.Thread(target=read_while_silent)
    reader.start()
    try:
        wait_until(lambda: observer.stats().gauges.num_running == 1, WAIT, what="A's first request to run")
        # far sooner than its work could end: the core aborted it (SILENT s after A's last word)
        assert wait_idle(observer) < 30
    finally:
        reading.clear()
        reader.join()
    a.send(P.ABORT, ["r0"])  # its session is gone
    frames = drain_until(a, lambda frames: P.UNKNOWN_FRONTEND in [kind for kind, _ in frames])
    assert P.UNKNOWN_FRONTEND in [kind for kind, _ in frames]
    a.close()
    observer.close()


def test_hello_flood_gets_one_full_ready_and_bounded_memory(core):
    """100 HELLOs from a peer that never reads: one READY with the tokenizer files (a few MB), later
    answers without them and rate-limited; the core's memory barely grows and it keeps serving."""
    address, proc = core
    observer = Peer(address)
    observer.hello()
    before = rss_kib(proc.pid)
    flood = Peer(address, rcvhwm=1)
    for _ in range(100):
        flood.send(P.HELLO, P.Hello(P.PROTOCOL_VERSION, "flood"))
    time.sleep(1.5)
    assert observer.stats() is not None  # responsive
    grown_mib = (rss_kib(proc.pid) - before) / 1024
    assert grown_mib < 50, f"the core grew by {grown_mib:.0f} MiB"

    def full_ready(frames):  # the files, megabytes through a small buffer: as long as that takes
        return any(kind == P.READY and msgspec.msgpack.decode(body, type=P.Ready).tokenizer_files
                   for kind, body in frames)

    full = lite = 0
    for kind, body in drain_until(flood, full_ready) + drain(flood, 1.5):
        if kind == P.READY:
            ready = msgspec.msgpack.decode(body, type=P.Ready)
            full += bool(ready.tokenizer_files)
            lite += not ready.tokenizer_files
    assert full == 1 and lite <= 5, (full, lite)
    flood.close()
    observer.close()


def test_reused_routing_id_gets_unknown_frontend_not_outputs(core):
    address, _ = core
    identity = os.urandom(8)
    observer = Peer(address)
    observer.hello()
    a = Peer(address, identity)
    a.hello()
    a.add("secret", SamplingParams(max_tokens=480, ignore_eos=True, output_kind=RequestOutputKind.DELTA))
    assert a.recv(WAIT)[0] == P.OUTPUTS
    a.close()
    wait_idle(observer)  # the core saw A's connection go (and aborted "secret")
    observer.close()
    time.sleep(0.3)  # and its socket let go of the routing id
    b = Peer(address, identity)  # the same routing id on a new connection, without HELLO
    b.send(P.ABORT, ["secret"])
    frames = drain_until(b, lambda frames: frames)  # the answer, however long a busy core takes
    frames += drain(b, 1.0)  # and nothing after it
    assert [kind for kind, _ in frames] == [P.UNKNOWN_FRONTEND], frames
    ready = b.hello()  # a new session, a new connection: the files again
    assert ready.tokenizer_files
    for kind, body in drain(b, 1.0):
        if kind == P.OUTPUTS:
            assert msgspec.msgpack.decode(body, type=P.EngineCoreOutputs).outputs == []
    b.close()


def test_repeated_hello_within_a_session_keeps_its_requests_until_it_sent_work(patient_core):
    """HELLO repeated during the handshake changes nothing; after ADD, HELLO means starting afresh: the
    core aborts its requests at once (long before they could end, or its session end for silence)."""
    address, _ = patient_core
    a = Peer(address)
    first = a.hello()
    time.sleep(HELLO_ANSWER_SECONDS + 0.1)  # the core answers a session's HELLO at most this often
    again = a.hello()  # no work yet: the same session, a READY without the files
    assert first.tokenizer_files and not again.tokenizer_files and again.core_id == first.core_id
    observer = Peer(address)
    observer.hello()
    for i in range(MANY):  # a minute of work, one request at a time
        a.add(f"r{i}")
    wait_until(lambda: observer.stats().gauges.num_running, WAIT, what="A's first request to run")
    time.sleep(HELLO_ANSWER_SECONDS + 0.1)
    last_word = time.monotonic()
    a.hello()  # after work: its requests are aborted
    wait_idle(observer)
    assert time.monotonic() - last_word < PATIENT, "the requests ended for silence, not for the HELLO"
    observer.close()
    a.close()


def test_sync_client_works_after_a_long_idle(core):
    """The offline LLM sends nothing between generate() calls: after longer than the core's limit it
    says HELLO again by itself and the next call just works."""
    from frontend.offline.llm import LLM

    address, _ = core
    llm = LLM.connect(address)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    assert len(llm.generate("Hello", params, use_tqdm=False)[0].outputs[0].token_ids) == 3
    assert llm.client.model_info.frontend_timeout == SILENT
    time.sleep(SILENT + 3)  # the core has ended its session by then, however late its check runs
    assert len(llm.generate("Hello", params, use_tqdm=False)[0].outputs[0].token_ids) == 3
    assert llm.get_stats().gauges.num_running == 0
    assert llm.tokenizer is not None and llm.client.model_info.tokenizer_files
    llm.shutdown()


# (core, quiet seconds, requests queued, tokens each). Quieter than the limit: past half of it (the client
# then says HELLO first) and seconds short of it, with few enough outputs that the core's send queue to
# the unread client never fills. Longer: seconds past it, with far more work than could end before it.
QUIET = {"shorter": ("patient_core", PATIENT * 0.6, 6, 100), "longer": ("core", SILENT + 5, MANY, 480)}


@pytest.mark.parametrize("case", QUIET)
def test_sync_client_quiet_with_requests_queued(request, case):
    """The sync client is quiet (it does not read) with requests queued in the core, then adds one.
    Quiet for less than the core's limit: its HELLO resumes the session and every request finishes.
    Longer: the core ended the session; the requests it lost end with an error, the new one runs."""
    from frontend.core_link.core_client_mp import SyncMPClient

    which, quiet, queued, tokens = QUIET[case]
    address, _ = request.getfixturevalue(which)
    limit = PATIENT if which == "patient_core" else SILENT
    client = SyncMPClient(None, address)
    try:
        for i in range(queued):  # seconds of work, one at a time
            client.add_request(P.EngineCoreRequest(request_id=f"r{i}", prompt_token_ids=[1, 2, 3],
                                                   sampling_params=SamplingParams(max_tokens=tokens, ignore_eos=True,
                                                                                  output_kind=RequestOutputKind.DELTA)))
        time.sleep(quiet)
        client.add_request(P.EngineCoreRequest(request_id="last", prompt_token_ids=[1, 2, 3],
                                               sampling_params=SamplingParams(max_tokens=2, ignore_eos=True)))
        finished, deadline = {}, time.monotonic() + WAIT
        while len(finished) < queued + 1 and time.monotonic() < deadline:
            for out in client.get_output().outputs:
                if out.finish_reason is not None:
                    finished[out.request_id] = out.finish_reason
        assert len(finished) == queued + 1 and finished.pop("last") == P.FinishReason.LENGTH, finished
        reasons = set(finished.values())
        if quiet < limit:
            assert reasons == {P.FinishReason.LENGTH}, finished
        else:
            assert P.FinishReason.ERROR in reasons and reasons <= {P.FinishReason.LENGTH, P.FinishReason.ERROR}
    finally:
        client.shutdown()


# ---- aborts ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sync", "async"])
def test_abort_waits_for_room_instead_of_being_dropped(kind):
    """A fake core answers HELLO, then stops reading until the client's send queue is full: an abort
    sent then still arrives once the core reads again (it used to be dropped on zmq.Again)."""
    from frontend.core_link.core_client_mp import AsyncMPClient, SyncMPClient

    address = private_ipc_address()
    ctx = zmq.Context.instance()
    fake = ctx.socket(zmq.ROUTER)
    fake.linger = 0
    fake.setsockopt(zmq.RCVHWM, 1)
    fake.setsockopt(zmq.RCVBUF, 4096)
    fake.bind(address)
    ready = msgspec.msgpack.encode(P.Ready(protocol_version=P.PROTOCOL_VERSION, core_id="fake", model_name="m",
                                           max_model_len=8, vocab_size=8, eos_token_ids=[], tokenizer_files={"a": "b"}))
    reading = threading.Event()
    got: list[bytes] = []

    def fake_core():
        identity, kind_, _ = fake.recv_multipart()
        assert kind_ == P.HELLO
        fake.send_multipart([identity, P.READY, ready])
        reading.wait(WAIT)
        deadline = time.monotonic() + WAIT
        while P.ABORT not in got and time.monotonic() < deadline:  # until the abort comes, however slowly
            if fake.poll(200):
                got.append(fake.recv_multipart()[1])

    def tight(sock):
        sock.setsockopt(zmq.SNDHWM, 1)
        sock.setsockopt(zmq.SNDBUF, 4096)

    thread = threading.Thread(target=fake_core)
    thread.start()
    junk = [P.UTILITY, b"x" * 1_000_000]

    def fill(sock):
        for _ in range(200):
            try:
                sock.send_multipart(junk, zmq.NOBLOCK)
            except zmq.Again:
                return
        raise AssertionError("the send queue never filled")

    if kind == "sync":
        client = SyncMPClient(None, address, socket_setup=tight)
        fill(client.sock)
        threading.Timer(0.5, reading.set).start()  # the core reads again while the abort waits
        client.abort_requests(["r1"])
    else:
        async def scenario():
            client = AsyncMPClient(None, address, socket_setup=tight)
            await client.handshake(WAIT)
            fill(zmq.Socket.shadow(client.sock.underlying))
            threading.Timer(0.5, reading.set).start()
            await client.abort_requests(["r1"])
            return client
        client = asyncio.run(scenario())
    thread.join(WAIT)
    client.shutdown()
    fake.close()
    assert P.ABORT in got


# ---- nvllm serve restarts its core ----------------------------------------------------------------

def test_serve_restarts_a_killed_engine_core(tiny_models, tmp_path):
    """SIGKILL serve's core: the request in flight fails, /health says 503, then a new core starts
    (logged with the exit code) and serve answers again, all in the same serve process."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = Proc(["serve", tiny_models["llama"], "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                 "--kv-cache-memory", "32MiB", "--max-model-len", "512", "--max-num-seqs", "1",
                 "--disable-uvicorn-access-log"], str(tmp_path / "serve.log"))
    try:
        wait_healthy(base, proc)
        [core_pid] = proc.children()
        body = {"prompt": "hi", "max_tokens": 480, "ignore_eos": True}
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(
            httpx.post(base + "/v1/completions", json=body, timeout=WAIT))) for _ in range(4)]
        for t in threads:
            t.start()
        wait_until(lambda: metric(httpx.get(base + "/metrics", timeout=WAIT).text, "nvllm:num_requests_running"),
                   WAIT, what="a request to run")
        os.kill(core_pid, signal.SIGKILL)
        # serve says so while it waits to restart the core (a second) and the new one loads
        wait_until(lambda: httpx.get(base + "/health", timeout=WAIT).status_code == 503, WAIT, 0.05,
                   what="/health to say 503")
        for t in threads:
            t.join(WAIT)
        assert any(r.status_code == 503 for r in answers), [r.text for r in answers]
        wait_healthy(base, proc, timeout=WAIT)
        r = httpx.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 4, "ignore_eos": True},
                       timeout=WAIT)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert proc.children() and proc.children() != [core_pid]
        assert "exited with code -9" in proc.log()
    finally:
        code = proc.stop(signal.SIGTERM)
    assert code == 0, proc.log()[-3000:]
