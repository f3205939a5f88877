"""LoRA's parts without a model: --lora-modules forms, the scheduler's max_loras admission and the step input's
adapter rows, the prefix-cache root of an adapter, the load/unload endpoints only with
--allow-runtime-lora-updating."""

import asyncio

import pytest
from fastapi.testclient import TestClient

from common.lora import LoRARequest, parse_lora_module
from common.sampling_params import SamplingParams
from engine_core.sched.kv_cache_manager import KVCacheManager, salt_hash
from engine_core.sched.request import Request
from engine_core.sched.scheduler import Scheduler, SchedulerConfig
from engine_core.worker.step_input import build_step_input
from frontend.http.app import build_app
from frontend.endpoints.serving.lora_adapters import LoRAAdapters

pytestmark = pytest.mark.unit

A, B = LoRARequest("a", 1, "/adapters/a"), LoRARequest("b", 2, "/adapters/b")


def test_lora_module_forms():
    assert parse_lora_module("sql=/x/sql") == ("sql", "/x/sql", None)
    assert parse_lora_module('{"name": "sql", "path": "/x", "base_model_name": "m"}') == ("sql", "/x", "m")
    for bad in ("sql", "=/x", "sql=", '{"name": "sql"}', '{"name": "a", "path": "b", "rank": 8}', "{oops"):
        with pytest.raises(ValueError, match="lora module"):
            parse_lora_module(bad)
    with pytest.raises(ValueError, match="twice"):
        LoRAAdapters(["a=/x", "a=/y"])


def test_scheduler_keeps_running_adapters_within_max_loras():
    """max_loras=1: a request on another adapter waits (keeping its place) until the first adapter's requests are
    done; base requests pass it; the step input says which sequence uses which adapter."""
    kv = KVCacheManager(64, 4)
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=64, block_size=4, max_loras=1), kv)
    params = SamplingParams(max_tokens=1)
    for rid, lora in (("1", A), ("2", B), ("3", None), ("4", A)):
        scheduler.add_request(Request(rid, [5, 6, 7], params, lora_request=lora))
    out = scheduler.schedule()
    assert [s.request.request_id for s in out.scheduled] == ["1", "3", "4"]
    assert out.active_loras == [A]
    step = build_step_input(out, 4).step
    assert step.lora_requests == [A] and step.seq_loras == [0, -1, 0]
    scheduler.update_from_output(out, {"1": [9], "3": [9], "4": [9]})  # max_tokens 1: all three finish
    out = scheduler.schedule()
    assert [s.request.request_id for s in out.scheduled] == ["2"] and out.active_loras == [B]


def test_an_adapter_roots_its_own_prefix_chain():
    assert salt_hash(None) is None  # base requests hash as before
    roots = {salt_hash(None, A.key), salt_hash(None, B.key), salt_hash("s", A.key), salt_hash("s")}
    assert None not in roots and len(roots) == 4
    assert salt_hash(None, ("a", 1, "/p")) != salt_hash(None, ("a", 1, "/p2"))


@pytest.mark.parametrize("allowed", [False, True])
def test_load_endpoints_exist_only_when_allowed(allowed):
    async def never_ready(on_starting):
        await asyncio.Event().wait()

    app = build_app(never_ready, loras=LoRAAdapters([], allow_runtime_updates=allowed))
    with TestClient(app) as client:
        reply = client.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/x"})
        # without the switch there is no such endpoint; with it, the engine is still starting
        assert reply.status_code == (503 if allowed else 404)
        reply = client.post("/v1/unload_lora_adapter", json={"lora_name": "a"})
        assert reply.status_code == (503 if allowed else 404)
