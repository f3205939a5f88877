"""transformers' batched generate on the benchmark workload, the baseline of `nvllm bench throughput
--backend hf`: left padding, one batch, so every sequence runs to the longest output; on the GPU when
there is one."""

import time

import torch
import transformers

from engine_core.weights.model_resolver import resolve_model


def hf_generate_seconds(model: str | None, device: str, prompts: list[list[int]], out_lens: list[int],
                        dtype: str) -> float:
    """Seconds transformers takes to sample max(out_lens) tokens for every prompt in one batch."""
    folder = resolve_model(model)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    device = "cuda" if device != "cpu" and torch.cuda.is_available() else "cpu"
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch_dtype).to(device).eval()
    width = max(map(len, prompts))
    pad = 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    longest = max(out_lens)
    with torch.inference_mode():
        hf.generate(ids[:1, -8:], attention_mask=mask[:1, -8:], max_new_tokens=2, do_sample=False)
        start = time.perf_counter()
        hf.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                    do_sample=True, temperature=0.6, top_k=0, pad_token_id=pad)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start
