"""POST /v1/embeddings on `nvllm serve --runner pooling` (a tiny Qwen3 with Matryoshka sizes, LAST pooling): the
openai client's embeddings.create (its default base64 and float) equals transformers' pooled hidden state; every
input form; `dimensions`; usage; the 400s (too long, empty, bad shape, a size the model was not trained for, text
generation on an embedding server)."""

import base64
import json
import os
import shutil
import struct

import httpx
import pytest
import torch
import transformers

from tests.support.http_helpers import openai_client, start_serve

pytestmark = pytest.mark.integration

ATOL = 1e-5
TOKENS = [int(t) for t in torch.randint(3, 49152, (40,), generator=torch.Generator().manual_seed(3))]


@pytest.fixture(scope="module")
def model_dir(tiny_models, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("embed") / "qwen3-matryoshka")
    shutil.copytree(tiny_models["qwen3"], path)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config | {"matryoshka_dimensions": [16, 32, 64]}, f)
    return path


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    base, _, proc = start_serve([model_dir, "--runner", "pooling", "--pooler-config", '{"pooling_type": "LAST"}',
                                 "--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "32MiB",
                                 "--served-model-name", "embedder", "--disable-uvicorn-access-log"],
                                str(tmp_path_factory.mktemp("serve") / "serve.log"))
    yield base
    assert proc.stop() == 0, proc.log()[-3000:]


@pytest.fixture(scope="module")
def hf(model_dir):
    return transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()


def expected(hf, tokens: list[int], dims: int | None = None) -> torch.Tensor:
    with torch.no_grad():
        last = hf(torch.tensor([tokens])).last_hidden_state[0, -1].float()
    return torch.nn.functional.normalize(last[:dims] if dims else last, dim=0)


def close(got, want: torch.Tensor) -> bool:
    got = torch.tensor(got)
    return got.shape == want.shape and (got - want).abs().max().item() <= ATOL


def post(base: str, body: dict) -> httpx.Response:
    return httpx.post(base + "/v1/embeddings", json=body, timeout=300)


def error_of(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    return response.json()["error"]


def test_openai_client_base64_and_float(server, hf):
    client = openai_client(server)
    # the client asks for base64 unless told otherwise, and decodes it to floats itself
    decoded = client.embeddings.create(model="embedder", input=[TOKENS, TOKENS[:20]])
    floats = client.embeddings.create(model="embedder", input=TOKENS, encoding_format="float")
    assert [d.index for d in decoded.data] == [0, 1] and decoded.model == "embedder"
    assert close(decoded.data[0].embedding, expected(hf, TOKENS))
    assert close(decoded.data[1].embedding, expected(hf, TOKENS[:20]))
    assert floats.data[0].embedding == decoded.data[0].embedding
    assert decoded.usage.prompt_tokens == decoded.usage.total_tokens == 60


def test_input_forms_and_raw_base64(server, hf):
    text = "The quick brown fox jumps over the lazy dog"
    ids = httpx.post(server + "/tokenize", json={"prompt": text}, timeout=60).json()["tokens"]
    one = post(server, {"input": text}).json()
    assert one["object"] == "list" and one["data"][0]["object"] == "embedding"
    assert close(one["data"][0]["embedding"], expected(hf, ids))
    many = post(server, {"input": [text, "Hello"], "encoding_format": "base64"}).json()
    raw = base64.b64decode(many["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == one["data"][0]["embedding"]
    nested = post(server, {"input": [ids, [5, 6, 7]]}).json()
    assert nested["data"][0]["embedding"] == one["data"][0]["embedding"]
    assert nested["usage"] == {"prompt_tokens": len(ids) + 3, "total_tokens": len(ids) + 3}


def test_dimensions(server, hf):
    body = post(server, {"input": TOKENS, "dimensions": 16}).json()
    assert close(body["data"][0]["embedding"], expected(hf, TOKENS, 16))
    error = error_of(post(server, {"input": TOKENS, "dimensions": 20}))
    assert error["param"] == "dimensions" and "[16, 32, 64]" in error["message"]


def test_bad_inputs_are_400s_naming_input(server):
    error = error_of(post(server, {"input": [5] * 257}))
    assert error["param"] == "input" and "257 tokens, more than max_model_len 256" in error["message"]
    for empty in ("", [], [[]]):
        assert error_of(post(server, {"input": empty}))["param"] == "input"
    error = error_of(post(server, {"input": [1.5]}))
    assert "input" in error["message"]
    assert error_of(post(server, {"input": "x", "encoding_format": "hex"}))["param"] == "encoding_format"


def test_metrics_count_embedding_requests(server):
    before = httpx.get(server + "/metrics", timeout=60).text
    post(server, {"input": [[5, 6, 7], [8, 9]]})
    after = httpx.get(server + "/metrics", timeout=60).text

    def value(text: str, name: str) -> float:
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))

    assert value(after, "nvllm:prompt_tokens_total") - value(before, "nvllm:prompt_tokens_total") == 5
    stop = 'nvllm:request_success_total{finished_reason="stop"}'
    assert value(after, stop) - (value(before, stop) if stop in before else 0) == 2


def test_text_generation_on_an_embedding_server_is_a_400(server):
    for path, body in [("/v1/completions", {"prompt": "Hello", "max_tokens": 2}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                       ("/v1/responses", {"input": "Hi"}), ("/v1/responses", {"input": "Hi", "stream": True})]:
        error = error_of(httpx.post(server + path, json=body, timeout=60))
        assert error["param"] == "model" and "served for embeddings (--runner pooling)" in error["message"]
