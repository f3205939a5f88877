"""The engine core refuses what it cannot serve and survives what goes wrong in a step.

Hostile EngineCoreRequests go straight to a real core process as raw ZeroMQ frames (no frontend
to check them first): each gets an ERROR output naming its field, the core keeps serving, and
nothing stays running or holds KV blocks. A step that raises fails only its own requests.
"""

import os
import time

import msgspec
import pytest
import zmq

from common import wire_messages as P
from common.wire_messages import EngineCoreRequest, FinishReason
from common.sampling_params import SamplingParams
from common.transport import private_ipc_address
from tests.support.core_peer import Peer, core_args

pytestmark = pytest.mark.integration

VOCAB = 49152
WAIT = 120  # the deadline of every wait for something expected within seconds


@pytest.fixture(scope="module")
def core(tiny_models):
    from frontend.core_link.core_process import start_core_process, stop_core_process

    address = private_ipc_address()
    proc = start_core_process(core_args(tiny_models["llama"], max_n=8), address)
    yield address, proc
    stop_core_process(proc)


def request(rid: str, prompt=(1, 2, 3), **params) -> EngineCoreRequest:
    params.setdefault("max_tokens", 2)
    return EngineCoreRequest(request_id=rid, prompt_token_ids=list(prompt), sampling_params=SamplingParams(**params),
                             eos_token_ids=[2])


# (what, the request, the field its error must name)
HOSTILE = [
    ("stop id outside vocab, min_tokens", request("a", min_tokens=1, stop_token_ids=[VOCAB]), "stop_token_ids"),
    ("logprobs 1e6", request("b", logprobs=1_000_000), "logprobs"),
    ("prompt id outside vocab", request("c", prompt=[1, VOCAB]), "prompt"),
    ("prompt id 2**63", request("d", prompt=[2**63]), "prompt"),
    ("prompt id 2**64-1", request("e", prompt=[2**64 - 1]), "prompt"),
    ("negative prompt id", request("f", prompt=[-1]), "prompt"),
    ("empty prompt", request("g", prompt=[]), "prompt"),
    ("temperature inf", request("h", temperature=float("inf")), "temperature"),
    ("temperature nan", request("i", temperature=float("nan")), "temperature"),
    ("repetition_penalty inf", request("j", repetition_penalty=float("inf")), "repetition_penalty"),
    ("top_k 2**40", request("k", top_k=2**40), "top_k"),
    ("n above --max-n", request("l", n=1024), "n"),
    ("200k stop strings", request("m", stop=["x"] * 200_000), "stop"),
    ("a 100k-character stop string", request("n", stop=["x" * 100_000]), "stop"),
    ("500k stop_token_ids", request("o", stop_token_ids=list(range(500_000))), "stop_token_ids"),
    ("max_tokens past max_model_len", request("p", max_tokens=600), "max_tokens"),
    ("min_tokens 2**62", request("q", min_tokens=2**62, max_tokens=None), "min_tokens"),
    ("seed 2**64-1", request("r", seed=2**64 - 1), "seed"),
    ("eos id outside vocab", msgspec.structs.replace(request("s"), eos_token_ids=[VOCAB + 5]), "eos_token_ids"),
    ("arrival_time nan", msgspec.structs.replace(request("t"), arrival_time=float("nan")), "arrival_time"),
    ("request id of 100k characters", request("u" * 100_000), "request_id"),
    ("cache_salt of 1M characters", msgspec.structs.replace(request("v"), cache_salt="s" * 1_000_000), "cache_salt"),
]


def test_hostile_requests_get_errors_naming_the_field(core):
    address, proc = core
    peer = Peer(address)
    try:
        for _, req, _ in HOSTILE:
            peer.add(req)
        peer.add(request("good", max_tokens=4, ignore_eos=True))
        done = peer.finished({r.request_id for _, r, _ in HOSTILE} | {"good"})
        for what, req, field in HOSTILE:
            out = done[req.request_id]
            assert out.finish_reason == FinishReason.ERROR, what
            assert out.error.startswith(field), (what, out.error[:200])
        assert done["good"].finish_reason == FinishReason.LENGTH
        assert proc.poll() is None
        stats = peer.stats()
        assert stats.gauges.num_running == 0 and stats.gauges.num_waiting == 0
        assert stats.gauges.num_free_blocks == stats.gauges.num_total_blocks
    finally:
        peer.close()


def test_core_sends_its_limits_in_ready(core):
    from frontend.offline.llm import LLM

    llm = LLM.connect(core[0])
    try:
        limits = llm.model_info.limits
        assert limits.max_n == 8 and limits.vocab_size == VOCAB and limits.max_model_len == 512
        with pytest.raises(ValueError, match=r"^n must be at most 8 \(--max-n\)"):
            llm.generate("hi", SamplingParams(n=9))
        with pytest.raises(ValueError, match="^stop_token_ids holds token id 49152"):
            llm.generate("hi", SamplingParams(stop_token_ids=[VOCAB], min_tokens=1))
        out = llm.generate("hi", SamplingParams(max_tokens=3, ignore_eos=True, stop_token_ids=[VOCAB - 1]),
                           use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 3
    finally:
        llm.shutdown()


def test_cache_salt_separates_prefix_caches(core):
    """Same prompt: a hit with the same salt (or none twice), a miss with another salt."""
    peer = Peer(core[0])
    prompt = list(range(100, 180))  # 5 full blocks of 16
    try:
        def cached(rid: str, salt: str | None) -> int:
            peer.add(msgspec.structs.replace(request(rid, prompt=prompt), cache_salt=salt))
            return peer.finished({rid})[rid].num_cached_tokens

        assert cached("s1", "tenant-a") == 0
        assert cached("s2", "tenant-b") == 0
        assert cached("s3", "tenant-a") == 64
        assert cached("s4", None) == 0
        assert cached("s5", None) == 64
    finally:
        peer.close()


def test_step_counts_come_with_their_step_and_never_with_a_heartbeat(core):
    """Each token is counted once: the batch of the step that made it carries the step's counts; the
    heartbeats after it repeat gauges and totals only (they once repeated the counts too, and
    LLM.generate's progress bar counted the same tokens again during long steps)."""
    peer = Peer(core[0])
    try:
        peer.add(request("hb", max_tokens=5, ignore_eos=True))
        generated, heartbeats, deadline = 0, 0, time.monotonic() + WAIT
        while heartbeats < 3 and time.monotonic() < deadline:
            if not peer.sock.poll(200):
                continue
            kind, body = peer.sock.recv_multipart()
            if kind != P.OUTPUTS:
                continue
            batch = msgspec.msgpack.decode(body, type=P.EngineCoreOutputs)
            stats = batch.scheduler_stats
            if batch.outputs:
                assert stats.step is not None
                generated += stats.step.num_generation_tokens
            elif generated == 5:  # the request is done: what comes now are heartbeats
                assert stats is not None and stats.step is None and stats.gauges.num_total_blocks > 0
                heartbeats += 1
        assert generated == 5 and heartbeats == 3
    finally:
        peer.close()


def test_a_failing_step_fails_only_its_requests(tiny_models):
    """An exception inside execute fails that step's requests with ERROR outputs, frees their
    blocks, takes the blocks it never wrote out of the prefix cache, and the core goes on."""
    from engine_core.proc.core import EngineCore

    core = EngineCore(core_args(tiny_models["llama"]))
    try:
        real = core.executor.execute_model
        poisoned = {"poison"}

        def execute(sched_out):
            if any(s.request.request_id in poisoned for s in sched_out.scheduled):
                raise IndexError("index 99999 is out of bounds for dimension 0")
            return real(sched_out)

        core.executor.execute_model = execute
        prompt = list(range(200, 264))  # 4 full blocks
        core.add_request(request("poison", prompt=prompt, max_tokens=4))
        outputs = core.step().outputs
        assert [(o.request_id, o.finish_reason) for o in outputs] == [("poison", FinishReason.ERROR)]
        assert "IndexError: index 99999" in outputs[0].error
        stats = core.scheduler.get_stats()
        assert stats.gauges.num_running == 0 and stats.gauges.num_free_blocks == stats.gauges.num_total_blocks
        # the same prompt again: no prefix hit on blocks the failed step never wrote
        core.add_request(request("after", prompt=prompt, max_tokens=3, ignore_eos=True))
        finished = {}
        while core.has_unfinished_requests():
            for o in core.step().outputs:
                if o.finish_reason is not None:
                    finished[o.request_id] = o
        assert finished["after"].finish_reason == FinishReason.LENGTH
        assert finished["after"].num_cached_tokens == 0
    finally:
        core.shutdown()


def test_a_failing_schedule_fails_running_and_next_request(tiny_models):
    from engine_core.proc.core import EngineCore

    core = EngineCore(core_args(tiny_models["llama"]))
    try:
        core.add_request(request("x", max_tokens=50, ignore_eos=True))
        core.step()  # x runs
        real = core.scheduler.schedule
        core.scheduler.schedule = lambda: (_ for _ in ()).throw(RuntimeError("scheduler bug"))
        core.add_request(request("y"))
        core.add_request(request("z"))
        outputs = core.step().outputs
        assert {o.request_id for o in outputs} == {"x", "y"}
        assert all(o.finish_reason == FinishReason.ERROR for o in outputs)
        core.scheduler.schedule = real
        while core.has_unfinished_requests():
            core.step()
        stats = core.scheduler.get_stats()
        assert stats.gauges.num_free_blocks == stats.gauges.num_total_blocks
    finally:
        core.shutdown()


def test_fatal_errors_are_told_apart():
    from engine_core.executor.fatal_errors import FatalEngineError, is_fatal
    from engine_core.executor.multiproc import TensorParallelError

    assert is_fatal(TensorParallelError("rank 1 exited")) and is_fatal(FatalEngineError("x"))
    assert is_fatal(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_fatal(IndexError("index 5 is out of bounds"))
    assert not is_fatal(ValueError("bad"))


def test_a_failed_rank_wakes_the_core_once_and_stays_failed():
    """The TP monitor records the first failure and calls the core's wake-up (no signal); check_health
    raises it from then on; a wake-up registered after the failure is called at once."""
    import threading

    from engine_core.executor.multiproc import MultiprocExecutor, TensorParallelError

    def bare_executor(failure=None):
        executor = MultiprocExecutor.__new__(MultiprocExecutor)  # no processes: only the failure bookkeeping
        executor.cond, executor.failure, executor.wake, executor.closing = threading.Condition(), failure, None, False
        return executor

    woken = []
    executor = bare_executor()
    executor.on_failure(lambda: woken.append("first"))
    executor.check_health()
    executor._fail("tensor-parallel worker rank 1 (pid 5) exited with signal SIGKILL")
    executor._fail("a later failure")
    assert woken == ["first"]
    with pytest.raises(TensorParallelError, match="rank 1 .* SIGKILL"):
        executor.check_health()
    late = bare_executor("tensor-parallel rank 1 failed: boom")
    late.on_failure(lambda: woken.append("late"))
    assert woken == ["first", "late"]


def test_frontend_writes_tokenizer_files_under_their_base_names(tmp_path, default_model_dir, monkeypatch):
    """A core that names tokenizer files `../x` or `/abs/x` cannot make the frontend write there."""
    from frontend.request_path.tokenizer import tokenizer_from_files

    files = {n: open(os.path.join(default_model_dir, n)).read() for n in ("tokenizer.json", "tokenizer_config.json")}
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    evil = {**files, "../escaped.txt": "pwned", str(tmp_path / "absolute.txt"): "pwned"}
    tok = tokenizer_from_files(evil)
    assert tok.encode("Hello") == tokenizer_from_files(files).encode("Hello")
    assert not (tmp_path / "tmp" / "escaped.txt").exists() and not (tmp_path / "absolute.txt").exists()
    with pytest.raises(ValueError, match="no usable file name"):
        tokenizer_from_files({**files, "..": "x"})


def _rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1]) // 1024


def test_a_flood_of_big_requests_does_not_grow_the_core(core):
    """A frontend sending 360 KB requests as fast as it can while the core is busy: the core reads no
    faster than it applies them (the rest waits in ZeroMQ's bounded queues and in the sender), so its
    memory stays bounded. Without that bound this grew the core by about 400 MiB here."""
    address, proc = core
    peer = Peer(address)
    try:
        before = _rss_mib(proc.pid)
        peer.add(request("busy", prompt=[5] * 400, max_tokens=100, ignore_eos=True))
        frame = msgspec.msgpack.encode(request("big", prompt=list(range(300, 100_300))))
        peer.sock.setsockopt(zmq.SNDHWM, 100_000)
        # at least 5 s, and on a machine too busy to send 1000 in that time, until it has
        peak, sent = before, 0
        at_least, deadline = time.monotonic() + 5, time.monotonic() + WAIT
        while time.monotonic() < at_least or (sent <= 1000 and time.monotonic() < deadline):
            try:
                peer.sock.send_multipart([P.ADD, frame], zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                time.sleep(0.01)
            if sent % 50 == 0:
                peak = max(peak, _rss_mib(proc.pid))
        assert sent > 1000
        assert peak - before < 150, (before, peak)
        assert proc.poll() is None
    finally:
        peer.sock.close()
    # the core serves others afterwards
    other = Peer(address)
    try:
        other.add(request("after", max_tokens=2, ignore_eos=True))
        assert other.finished({"after"})["after"].finish_reason == FinishReason.LENGTH
    finally:
        other.close()
