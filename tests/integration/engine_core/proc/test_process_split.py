"""The core as its own process: several frontends, bad frames, engine death, cancelled streams."""

import asyncio
import os
import pickle  # noqa: used only to build a hostile payload the core must refuse
import re
import signal
import subprocess
import sys
import time

import msgspec
import pytest
import zmq

from common import wire_messages as P
from common.config import EngineArgs
from common.sampling_params import RequestOutputKind, SamplingParams
from common.transport import DEAD_AFTER_SECONDS, private_ipc_address
from frontend.core_link.core_client import EngineDeadError
from tests.support.paths import ROOT

pytestmark = pytest.mark.integration

WAIT = 120  # the deadline of every wait for something expected within a second or two
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,"]


def core_args(model: str, **kw) -> EngineArgs:
    return EngineArgs(model=model, dtype="float32", kv_cache_memory="64MiB", max_model_len=512, **kw)


@pytest.fixture(scope="module")
def core(tiny_models):
    """A standalone core process on a private ipc address."""
    from frontend.core_link.core_process import start_core_process, stop_core_process

    address = private_ipc_address()
    proc = start_core_process(core_args(tiny_models["llama"]), address)
    yield address, proc
    stop_core_process(proc)


def test_two_frontends_get_their_own_outputs(core, tiny_models):
    """Two LLM frontends on one core, generating at once, each gets exactly its own results,
    equal to the in-process engine's."""
    from frontend.offline.llm import LLM

    address, _ = core
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    inproc = LLM(tiny_models["llama"], dtype="float32", kv_cache_memory="64MiB", max_model_len=512)
    expected = [o.outputs[0].token_ids for o in inproc.generate(PROMPTS, params, use_tqdm=False)]
    inproc.shutdown()

    script = (
        "import sys, json; sys.path.insert(0, %r)\n"
        "from frontend.offline.llm import LLM\nfrom common.sampling_params import SamplingParams\n"
        "llm = LLM.connect(%r)\n"
        "outs = llm.generate(json.loads(sys.argv[1]), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)\n"
        "print(json.dumps([o.outputs[0].token_ids for o in outs]))\nllm.shutdown()\n" % (ROOT, address))
    import json
    # the two frontends use the same request ids ("0", "1", ...) on purpose
    a = subprocess.Popen([sys.executable, "-c", script, json.dumps(PROMPTS[:2])], stdout=subprocess.PIPE)
    b = subprocess.Popen([sys.executable, "-c", script, json.dumps(PROMPTS[2:])], stdout=subprocess.PIPE)
    out_a, _ = a.communicate(timeout=120)
    out_b, _ = b.communicate(timeout=120)
    assert a.returncode == 0 and b.returncode == 0
    assert json.loads(out_a.decode().strip().splitlines()[-1]) == expected[:2]
    assert json.loads(out_b.decode().strip().splitlines()[-1]) == expected[2:]


def test_multiprocess_llm_equals_inprocess(tiny_models):
    from frontend.offline.llm import LLM

    params = SamplingParams(temperature=0, max_tokens=10)
    results = []
    for mp in (False, True):
        llm = LLM(tiny_models["qwen3"], multiprocess=mp, dtype="float32", kv_cache_memory="64MiB", max_model_len=512)
        results.append([(o.outputs[0].token_ids, o.outputs[0].text) for o in llm.generate(PROMPTS, params, use_tqdm=False)])
        llm.shutdown()
    assert results[0] == results[1]


def _raw_peer(address: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    return sock


def test_bad_frames_are_dropped(core, tiny_models):
    """Random bytes, truncated msgpack, wrong types, a string that is not UTF-8 and a pickle payload: the
    core drops each, runs nothing, and then serves a real request."""
    from frontend.offline.llm import LLM

    address, proc = core
    peer = _raw_peer(address)
    peer.send_multipart([P.HELLO, msgspec.msgpack.encode(P.Hello(P.PROTOCOL_VERSION, "fuzz"))])
    assert peer.poll(WAIT * 1000)
    assert peer.recv_multipart()[0] == P.READY
    good = msgspec.msgpack.encode(P.EngineCoreRequest(request_id="x", prompt_token_ids=[1, 2, 3],
                                                      sampling_params=SamplingParams(max_tokens=2)))

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch /tmp/nvllm-pwned",))

    hostile = [
        [os.urandom(64)],
        [P.ADD, os.urandom(200)],
        [P.ADD, good[: len(good) // 2]],
        [P.ADD, msgspec.msgpack.encode({"request_id": 5, "prompt_token_ids": "no"})],
        [P.ADD, msgspec.msgpack.encode([1, 2, 3])],
        [P.ABORT, msgspec.msgpack.encode({"a": 1})],
        [P.UTILITY, msgspec.msgpack.encode(["x"])],
        [P.ADD, pickle.dumps(Evil())],
        [b"\x80", pickle.dumps(Evil())],
        [P.HELLO, pickle.dumps(Evil())],
        [P.ADD, good, b"extra", b"parts"],
        [P.ADD, good.replace(b"\xa1x", b"\xa1\xff")],  # a request_id that is not UTF-8 (msgspec: UnicodeDecodeError)
    ]
    for frames in hostile:
        peer.send_multipart(frames)
    # nothing ran: the only thing back is heartbeats with nothing in them
    deadline = time.time() + 2
    while time.time() < deadline:
        if peer.poll(200):
            kind, body = peer.recv_multipart()
            if kind == P.OUTPUTS:
                assert msgspec.msgpack.decode(body, type=P.EngineCoreOutputs).outputs == []
    assert proc.poll() is None
    assert not os.path.exists("/tmp/nvllm-pwned")
    peer.close()
    llm = LLM.connect(address)
    out = llm.generate("Hello", SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    llm.shutdown()


def test_cancelled_stream_frees_blocks(core):
    from frontend.async_engine.async_llm import AsyncLLM

    address, _ = core

    async def scenario():
        engine = await AsyncLLM.create(address=address)
        params = SamplingParams(max_tokens=400, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        gen = engine.generate("A long story about a cat", params, "cancel-me")
        got = 0
        async for _ in gen:
            got += 1
            if got == 3:
                break
        await gen.aclose()
        total, deadline = None, time.monotonic() + WAIT
        while time.monotonic() < deadline:  # until the abort has freed them, however long a busy core takes
            stats = await engine.get_stats()
            total = stats
            if stats.gauges.num_running == 0 and stats.gauges.num_free_blocks == stats.gauges.num_total_blocks:
                break
            await asyncio.sleep(0.1)
        engine.shutdown()
        return total

    stats = asyncio.run(scenario())
    assert stats.gauges.num_running == 0
    assert stats.gauges.num_free_blocks == stats.gauges.num_total_blocks


def test_stream_yields_deltas_that_join_to_the_full_text(core):
    from frontend.async_engine.async_llm import AsyncLLM

    address, _ = core

    async def scenario():
        engine = await AsyncLLM.create(address=address)
        pieces = []
        async for out in engine.generate("Tell me", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                                                   output_kind=RequestOutputKind.DELTA), "d"):
            pieces.append(out.outputs[0].text)
        final = None
        async for out in engine.generate("Tell me", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                                                                   output_kind=RequestOutputKind.FINAL_ONLY), "f"):
            final = out
        engine.shutdown()
        return pieces, final

    pieces, final = asyncio.run(scenario())
    assert len(pieces) > 1
    assert "".join(pieces) == final.outputs[0].text


def test_core_killed_mid_generation(tiny_models):
    """SIGKILL the core: in-flight requests fail within seconds (not at a long timeout), new ones fail fast
    while it is down, the client lives and starts a new core, which then serves."""
    from frontend.async_engine.async_llm import AsyncLLM

    async def scenario():
        engine = await AsyncLLM.create(core_args(tiny_models["llama"]))
        params = SamplingParams(max_tokens=500, ignore_eos=True, output_kind=RequestOutputKind.DELTA)

        started = [asyncio.Event() for _ in range(3)]

        async def consume(i):
            async for _ in engine.generate(f"prompt {i}", params, f"r{i}"):
                started[i].set()

        tasks = [asyncio.create_task(consume(i)) for i in range(3)]
        # kill as soon as every request streams: a fixed sleep let the tiny model finish all 500 tokens
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), timeout=WAIT)
        assert not any(t.done() for t in tasks), "a request finished before the core was killed"
        os.kill(engine.client.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=WAIT)
        elapsed = time.monotonic() - killed_at
        with pytest.raises(EngineDeadError):
            async for _ in engine.generate("again", params, "late"):
                pass
        assert "restarting" in str(engine.dead)
        while engine.dead is not None:  # the first restart waits a second, then the core loads
            assert time.monotonic() - killed_at < WAIT, engine.dead
            await asyncio.sleep(0.1)
        short = SamplingParams(max_tokens=3, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
        outs = [o async for o in engine.generate("back", short, "after")]
        engine.shutdown()
        assert len(outs[-1].outputs[0].token_ids) == 3
        return results, elapsed

    results, elapsed = asyncio.run(scenario())
    assert all(isinstance(r, EngineDeadError) for r in results), results
    assert elapsed < 10 * DEAD_AFTER_SECONDS  # the client sees the process exit: within a second when idle


def test_no_pickle_in_the_services():
    pattern = re.compile(r"\b(import pickle|from pickle|pickle\.loads?|recv_pyobj|send_pyobj|cloudpickle)\b")
    offenders = []
    for package in ("common", "engine_core", "frontend"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as f:
                        if pattern.search(f.read()):
                            offenders.append(path)
    assert offenders == []


def test_frontend_imports_no_torch(core):
    address, _ = core
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import frontend\nfrom frontend.offline.llm import LLM\nfrom frontend.async_engine.async_llm import AsyncLLM\n"
            "from frontend.core_link.core_client_mp import SyncMPClient\n"
            "llm = LLM.connect(%r)\n"
            "from common.sampling_params import SamplingParams\n"
            "llm.generate('hi', SamplingParams(max_tokens=2), use_tqdm=False)\n"
            "llm.shutdown()\n"
            "assert 'torch' not in sys.modules, 'frontend imported torch'\nprint('ok')\n" % (ROOT, address))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ok" in out.stdout


STOP_UNDER_SIGNALS = """
import logging, signal, sys
sys.path.insert(0, {root!r})
logging.basicConfig(level="INFO")
from common.config import EngineArgs
from common.transport import private_ipc_address
from engine_core.proc.core_proc import EngineCoreProc

core = EngineCoreProc(EngineArgs(model={model!r}, dtype="float32", kv_cache_memory="16MiB", max_model_len=128),
                      private_ipc_address())

def sigterm_at_every_call(frame, event, arg):
    # a SIGTERM each time the main thread enters queue or threading code, so the handler runs while
    # the main thread is inside those (holding a queue's lock, if the inputs had one)
    if event == "call" and frame.f_code.co_filename.endswith(("/queue.py", "/threading.py")):
        signal.raise_signal(signal.SIGTERM)

sys.setprofile(sigterm_at_every_call)
code = core.run()
sys.setprofile(None)
print("exited", code, flush=True)
"""


def test_core_stops_on_sigterm_wherever_it_lands(tiny_models):
    """The core's SIGTERM handler runs in the main thread between any two bytecodes: it must take no
    lock that thread may hold (it once put to a queue.Queue, and a SIGTERM landing inside the busy
    loop's Queue.get hung the core until its parent killed it 10 s later)."""
    script = STOP_UNDER_SIGNALS.format(root=ROOT, model=tiny_models["llama"])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0 and "exited 0" in done.stdout, done.stderr[-3000:]
    assert "engine core shutting down" in done.stderr
