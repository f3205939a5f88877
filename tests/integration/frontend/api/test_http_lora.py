"""LoRA adapters over HTTP (one `nvllm serve` of a tiny Llama with --enable-lora): a request names an adapter as
its `model`, /v1/models lists adapters with their parent, adapters load and unload at run time, an unloaded name
is a 404 model_not_found, a bad adapter is a 400 and the server goes on serving."""

import os
import signal

import httpx
import pytest
import torch
import transformers

from tests.support.tiny_models import build_tiny_model
from tests.support.http_helpers import openai_client, start_serve
from tests.support.lora_adapters import make_adapter, peft_greedy

pytestmark = pytest.mark.integration

PROMPT = [int(t) for t in torch.randint(3, 49152, (9,), generator=torch.Generator().manual_seed(3))]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, default_model_dir):
    root = tmp_path_factory.mktemp("http-lora")
    path = build_tiny_model(str(root / "llama"), "llama", default_model_dir, seed=11)
    base = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    adapters = {"small": make_adapter(base, str(root / "small"), seed=1),
                "wide": make_adapter(base, str(root / "wide"), seed=2, r=16, alpha=16,
                                     targets=["q_proj", "o_proj", "gate_proj", "down_proj"]),
                "dora": make_adapter(base, str(root / "dora"), seed=3, use_dora=True)}
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    return path, base, adapters, tokenizer


@pytest.fixture(scope="module")
def server(setup, tmp_path_factory):
    path, _, adapters, _ = setup
    args = [path, "--dtype", "float32", "--kv-cache-memory", "64MiB", "--disable-uvicorn-access-log",
            "--enable-lora", "--max-loras", "2", "--allow-runtime-lora-updating",
            "--lora-modules", f"small={adapters['small']}"]
    base_url, _, proc = start_serve(args, str(tmp_path_factory.mktemp("serve") / "serve.log"))
    yield base_url, proc
    assert proc.stop(signal.SIGTERM) == 0, proc.log()[-3000:]


def complete(server, model: str) -> httpx.Response:
    return httpx.post(server[0] + "/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 4,
                                                            "temperature": 0}, timeout=300)


def expected_text(setup, adapter: str | None) -> str:
    _, base, adapters, tokenizer = setup
    tokens, _ = peft_greedy(base, adapters[adapter] if adapter else None, PROMPT, 4)
    return tokenizer.decode(tokens)


def test_models_lists_the_adapter_with_its_parent(server, setup):
    cards = httpx.get(server[0] + "/v1/models", timeout=30).json()["data"]
    base, small = cards[0], cards[1]
    assert small["id"] == "small" and small["parent"] == base["id"] and small["root"] == setup[2]["small"]
    assert base["parent"] is None


def test_model_name_picks_the_adapter(server, setup):
    base_id = httpx.get(server[0] + "/v1/models", timeout=30).json()["data"][0]["id"]
    for model, adapter in ((base_id, None), ("small", "small")):
        reply = complete(server, model)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == model
        assert reply.json()["choices"][0]["text"] == expected_text(setup, adapter)
    chat = openai_client(server[0]).chat.completions.create(
        model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert chat.model == "small" and chat.choices[0].finish_reason == "length"


def test_load_use_unload_at_run_time(server, setup):
    load = httpx.post(server[0] + "/v1/load_lora_adapter", json={"lora_name": "wide", "lora_path": setup[2]["wide"]},
                      timeout=60)
    assert load.status_code == 200, load.text
    again = httpx.post(server[0] + "/v1/load_lora_adapter", json={"lora_name": "wide", "lora_path": setup[2]["wide"]},
                       timeout=60)
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    inplace = httpx.post(server[0] + "/v1/load_lora_adapter", timeout=60,
                         json={"lora_name": "wide", "lora_path": setup[2]["wide"], "load_inplace": True})
    assert inplace.status_code == 200, inplace.text
    assert "wide" in [c["id"] for c in httpx.get(server[0] + "/v1/models", timeout=30).json()["data"]]
    reply = complete(server, "wide")
    assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == expected_text(setup, "wide")
    unload = httpx.post(server[0] + "/v1/unload_lora_adapter", json={"lora_name": "wide"}, timeout=60)
    assert unload.status_code == 200, unload.text
    gone = complete(server, "wide")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    twice = httpx.post(server[0] + "/v1/unload_lora_adapter", json={"lora_name": "wide"}, timeout=60)
    assert twice.status_code == 404


def test_bad_adapter_is_a_400_and_the_server_goes_on(server, setup, tmp_path):
    for name, path, why in (("dora", setup[2]["dora"], "DoRA"), ("nowhere", str(tmp_path / "none"), "not a folder")):
        reply = httpx.post(server[0] + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path},
                           timeout=60)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert f"LoRA adapter {name!r}" in error["message"] and why in error["message"]
        assert complete(server, name).status_code == 404
    reply = complete(server, "small")
    assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == expected_text(setup, "small")
    assert os.path.isdir(setup[2]["small"])
