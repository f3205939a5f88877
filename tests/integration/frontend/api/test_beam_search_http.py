"""Beam search over HTTP (/v1/completions with vLLM's use_beam_search and length_penalty) through the official
openai client: the choices are the offline LLM.beam_search beams, best first; a width over the limit, streaming and
best_of other than n are 400s naming the field."""

import httpx
import openai
import pytest
import torch

from common.beam_search_params import BeamSearchParams
from frontend.offline.llm import LLM
from tests.support.http_helpers import openai_client, start_serve

pytestmark = pytest.mark.integration

PROMPTS = [[int(t) for t in torch.randint(3, 49152, (n,), generator=torch.Generator().manual_seed(n))] for n in (7, 19)]
ENGINE = ["--dtype", "float32", "--kv-cache-memory", "32MiB", "--max-model-len", "256", "--max-n", "6"]


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_models):
    path = tiny_models["llama"]
    base, _, proc = start_serve([path, "--disable-uvicorn-access-log", *ENGINE],
                                str(tmp_path_factory.mktemp("serve") / "serve.log"))
    client = openai_client(base)
    yield path, base, client, client.models.list().data[0].id
    proc.stop()


def test_beam_search_choices_are_the_offline_beams(served):
    path, _, client, model = served
    with LLM(path, dtype="float32", max_model_len=256, kv_cache_memory="32MiB", multiprocess=False) as llm:
        offline = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=3, max_tokens=10, length_penalty=0.5))
    # sampling settings are ignored by beam search: they must not change the beams
    response = client.completions.create(model=model, prompt=PROMPTS, n=3, max_tokens=10, temperature=1.3, top_p=0.5,
                                         seed=5, extra_body={"use_beam_search": True, "length_penalty": 0.5})
    assert [c.index for c in response.choices] == list(range(6))
    expected = [s for out in offline for s in out.sequences]
    assert [c.text for c in response.choices] == [s.output_text for s in expected]
    assert [c.finish_reason for c in response.choices] == [s.finish_reason for s in expected]
    assert response.usage.completion_tokens == sum(len(s.output_token_ids) for s in expected)


def test_beam_search_refusals_name_the_field(served):
    _, base, client, model = served
    cases = [({"n": 7}, "n"), ({"n": 2, "stream": True}, "stream"), ({"n": 2, "best_of": 3}, "best_of"),
             ({"n": 2, "max_tokens": None}, "max_tokens"), ({"n": 2, "length_penalty": "long"}, "length_penalty")]
    for extra, field in cases:
        body = {"model": model, "prompt": PROMPTS[0], "max_tokens": 4, "use_beam_search": True, **extra}
        r = httpx.post(base + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"]["param"] == field, (extra, r.text)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="Hello", n=7, max_tokens=4, extra_body={"use_beam_search": True})
    assert e.value.body["param"] == "n" and "at most 6" in e.value.body["message"]
