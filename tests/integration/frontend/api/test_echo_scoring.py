"""Scoring a prompt through /v1/completions, as evaluation harnesses do: `echo` + `logprobs` returns each prompt
token's logprob (the first token's null), `max_tokens: 0` returns the scored prompt alone, and vLLM's
`prompt_logprobs` field returns them in vLLM's shape. The numbers are transformers' log-softmax over the prompt
in float32, through the official `openai` client, whole and streamed, with and without a prefix-cache hit, in
prefill chunks. Then lm-eval itself (its `local-completions` model) against the server gives the accuracy and
per-item log-likelihoods its `hf` model gives on the same weights."""

import json
import math
import signal

import httpx
import pytest
import torch
import transformers

from tests.support.http_helpers import openai_client, start_serve

pytestmark = pytest.mark.integration

ATOL = 1e-4
PROMPT = [int(t) for t in torch.randint(3, 49152, (40,), generator=torch.Generator().manual_seed(11))]


@pytest.fixture(scope="module")
def tiny(tiny_models):
    path = tiny_models["llama"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    return path, hf


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    # 16-token prefill chunks: a 40-token prompt is scored over three steps
    base, _, proc = start_serve([tiny[0], "--dtype", "float32", "--max-num-batched-tokens", "16",
                                 "--max-model-len", "256", "--kv-cache-memory", "64MiB", "--disable-uvicorn-access-log"],
                                str(tmp_path_factory.mktemp("serve") / "serve.log"))
    yield base, proc
    assert proc.stop(signal.SIGTERM) == 0, proc.log()[-3000:]


def reference(hf, tokens: list[int]) -> torch.Tensor:
    """transformers' logprobs of each prompt token given the tokens before it: [len(tokens) - 1, vocab]."""
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([tokens])).logits[0, :-1].float(), dim=-1)


def check_scored(lp, tokens: list[int], expected: torch.Tensor, num_top: int) -> None:
    """An echoed prompt's logprobs (OpenAI's shape, as a dict) against transformers' rows."""
    assert len(lp["token_logprobs"]) >= len(tokens)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for p in range(1, len(tokens)):
        row, value, top = expected[p - 1], lp["token_logprobs"][p], lp["top_logprobs"][p]
        assert value == pytest.approx(row[tokens[p]].item(), abs=ATOL), p
        assert top[lp["tokens"][p]] == value
        best = row.max().item()
        assert max(top.values()) == pytest.approx(best, abs=ATOL), p  # what lm-eval's is_greedy compares
        assert len(top) <= num_top + 1


def test_echo_with_max_tokens_0_scores_the_prompt_as_transformers(server, tiny):
    path, hf = tiny
    client = openai_client(server[0])
    expected = reference(hf, PROMPT)
    # what lm-eval's local-completions sends for a loglikelihood request (with max_tokens 0, as OpenAI's old API)
    for attempt in range(2):  # the second finds the prompt in the prefix cache and must compute it again
        out = client.completions.create(model=path, prompt=[PROMPT], max_tokens=0, echo=True, logprobs=1,
                                        temperature=0, seed=1234)
        choice = out.model_dump()["choices"][0]
        assert len(choice["logprobs"]["tokens"]) == len(PROMPT), attempt  # the prompt alone
        check_scored(choice["logprobs"], PROMPT, expected, 1)
        assert choice["finish_reason"] == "length"
        assert out.usage.prompt_tokens == len(PROMPT) and out.usage.completion_tokens == 0
    # lm-eval today sends max_tokens 1: the prompt's logprobs, then the generated token's
    out = client.completions.create(model=path, prompt=[PROMPT], max_tokens=1, echo=True, logprobs=3, temperature=0)
    lp = out.model_dump()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(PROMPT) + 1
    check_scored(lp, PROMPT, expected, 3)
    following = reference(hf, PROMPT + [0])[-1]
    assert lp["token_logprobs"][-1] == pytest.approx(following.max().item(), abs=ATOL)


def test_streamed_echo_equals_whole(server, tiny):
    path, _ = tiny
    text = "The quick brown fox jumps over the lazy dog"
    for body in ({"max_tokens": 0}, {"max_tokens": 3, "n": 2, "ignore_eos": True}):
        body = {"model": path, "prompt": text, "echo": True, "logprobs": 2, "temperature": 0, **body}
        whole = httpx.post(server[0] + "/v1/completions", json=body, timeout=300).json()
        chunks = []
        with httpx.stream("POST", server[0] + "/v1/completions", json={**body, "stream": True}, timeout=300) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        for choice in whole["choices"]:
            parts = [c for chunk in chunks for c in chunk["choices"] if c["index"] == choice["index"]]
            assert "".join(c["text"] for c in parts) == choice["text"]
            assert choice["text"].startswith(text)
            joined = [v for c in parts if c["logprobs"] for v in c["logprobs"]["token_logprobs"]]
            assert joined == pytest.approx(choice["logprobs"]["token_logprobs"])
            assert parts[-1]["finish_reason"] == choice["finish_reason"] == "length"


def test_vllm_prompt_logprobs_field(server, tiny):
    path, hf = tiny
    expected = reference(hf, PROMPT)
    r = httpx.post(server[0] + "/v1/completions", json={"model": path, "prompt": PROMPT, "max_tokens": 2,
                                                        "temperature": 0, "prompt_logprobs": 2}, timeout=300)
    assert r.status_code == 200, r.text
    scored = r.json()["choices"][0]["prompt_logprobs"]
    assert len(scored) == len(PROMPT) and scored[0] is None
    for p in range(1, len(PROMPT)):
        entry = scored[p][str(PROMPT[p])]
        assert entry["logprob"] == pytest.approx(expected[p - 1, PROMPT[p]].item(), abs=ATOL)
        ranks = sorted(e["rank"] for e in scored[p].values())
        assert ranks[:2] == [1, 2] or entry["rank"] > 2


@pytest.mark.parametrize("body, field", [
    ({"max_tokens": 0}, "max_tokens"),  # nothing to return without echo
    ({"max_tokens": 0, "echo": True, "prompt_logprobs": 21}, "prompt_logprobs"),
    ({"max_tokens": -1, "echo": True}, "max_tokens"),
])
def test_bad_scoring_requests_name_the_field(server, tiny, body, field):
    r = httpx.post(server[0] + "/v1/completions", json={"model": tiny[0], "prompt": "hi", **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


# ---- lm-eval as the client ------------------------------------------------------------------------------

ITEMS = [
    {"question": "The sky is", "choices": [" blue", " green", " loud"], "answer": 0},
    {"question": "Two plus two is", "choices": [" four", " five"], "answer": 0},
    {"question": "Water boils at one hundred degrees", "choices": [" Celsius", " Fahrenheit", " Kelvin"], "answer": 0},
    {"question": "The opposite of hot is", "choices": [" cold", " warm", " spicy", " red"], "answer": 0},
    {"question": "A cat says", "choices": [" meow", " woof"], "answer": 0},
]


def write_task(folder) -> str:
    """A multiple-choice loglikelihood task on local data (no hub download)."""
    data = folder / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    (folder / "nvllm_tiny_mc.yaml").write_text(
        "task: nvllm_tiny_mc\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\n"
        "metric_list:\n  - metric: acc\n")
    return "nvllm_tiny_mc"


def evaluate(model: str, model_args: dict, folder):
    import lm_eval
    from lm_eval.tasks import TaskManager
    task = write_task(folder)
    results = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[task], log_samples=True,
                                      task_manager=TaskManager(include_path=str(folder)), batch_size=1)
    samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
    lls = [[resp[0][0] for resp in sample["resps"]] for sample in samples]
    return results["results"][task]["acc,none"], lls


def test_lm_eval_local_completions_equals_its_hf_model(server, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path, _ = tiny
    served_acc, served = evaluate("local-completions", {
        "base_url": server[0] + "/v1/completions", "model": path, "tokenizer": path,
        "tokenizer_backend": "huggingface", "num_concurrent": 1, "max_retries": 1}, tmp_path)
    hf_acc, local = evaluate("hf", {"pretrained": path, "dtype": "float32", "device": "cpu"}, tmp_path)
    assert len(served) == len(local) == len(ITEMS)
    for item, (ours, theirs) in enumerate(zip(served, local)):
        assert len(ours) == len(ITEMS[item]["choices"])
        assert ours == pytest.approx(theirs, abs=ATOL), item
        assert all(math.isfinite(x) and x < 0 for x in ours)
    assert served_acc == hf_acc


def test_chat_prompt_logprobs_score_the_rendered_prompt(server, tiny):
    path, hf = tiny
    messages = [{"role": "user", "content": "Name a colour."}]
    ids = httpx.post(server[0] + "/tokenize", json={"model": path, "messages": messages}, timeout=60).json()["tokens"]
    expected = reference(hf, ids)
    r = httpx.post(server[0] + "/v1/chat/completions", json={"model": path, "messages": messages, "max_tokens": 1,
                                                             "prompt_logprobs": 0}, timeout=300)
    assert r.status_code == 200, r.text
    scored = r.json()["prompt_logprobs"]
    assert len(scored) == len(ids) == r.json()["usage"]["prompt_tokens"] and scored[0] is None
    for p in range(1, len(ids)):
        assert scored[p][str(ids[p])]["logprob"] == pytest.approx(expected[p - 1, ids[p]].item(), abs=ATOL)
    streamed = httpx.post(server[0] + "/v1/chat/completions", json={"model": path, "messages": messages,
                                                                    "prompt_logprobs": 0, "stream": True}, timeout=60)
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "prompt_logprobs"
