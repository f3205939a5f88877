"""`nvllm bench perplexity`: llama-perplexity's method (chunks, second halves scored) on nvllm's prompt logprobs,
checked against the same method run on transformers' float32 logits."""

import json
import math
import subprocess
import sys

import pytest
import torch
import transformers

from benchmarks.offline.perplexity import FINAL, chunks_of, perplexity

pytestmark = pytest.mark.integration

TEXT = "The quick brown fox jumps over the lazy dog, then naps in the sun while the farmer counts his hens. " * 6


def test_chunks_and_scoring_follow_llama_perplexity():
    tokens = list(range(10, 33))  # 23 tokens: two whole chunks of 8 (the rest is left out), then BOS first
    assert chunks_of(tokens, 8, None, None) == [list(range(10, 18)), list(range(18, 26))]
    assert chunks_of(tokens, 8, 1, 1) == [[1] + list(range(11, 18))]
    ppl, err = perplexity([1.0, 2.0, 3.0])
    assert ppl == pytest.approx(math.exp(2.0)) and err == pytest.approx(math.exp(2.0) * math.sqrt((14 / 3 - 4) / 2))
    line = "perplexity: ...\nFinal estimate: PPL = 12.3456 +/- 0.07890\n"
    assert FINAL.search(line).groups() == ("12.3456", "0.07890")


def test_bench_perplexity_equals_transformers_by_the_same_method(tiny_models, tmp_path):
    path = tiny_models["llama"]
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT)
    out = tmp_path / "ppl.json"
    subprocess.run([sys.executable, "-m", "frontend.cli.main", "bench", "perplexity", path, "--dtype",
                    "float32", "--kv-cache-memory", "16MiB", "--text-file", str(text_file), "--n-ctx", "32",
                    "--output-json", str(out)], check=True, timeout=300)
    ours = json.loads(out.read_text())["results"]["nvllm"]

    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    tokens = tokenizer.encode(TEXT)
    bos = tokenizer.bos_token_id if tokenizer.encode("a")[:1] == [tokenizer.bos_token_id] else None
    nll = []
    for chunk in chunks_of(tokens, 32, None, bos):
        with torch.no_grad():
            logprobs = torch.log_softmax(hf(torch.tensor([chunk])).logits[0].float(), dim=-1)
        nll += [-logprobs[p - 1, chunk[p]].item() for p in range(17, 32)]
    expected, _ = perplexity(nll)
    assert ours["chunks"] == len(tokens) // 32 >= 2 and ours["scored_tokens"] == len(nll)
    assert ours["ppl"] == pytest.approx(expected, rel=1e-4)
