"""`nvllm bench throughput`: offline tokens/s on nano-vllm's bench.py workload, scaled down.

Random prompts of random lengths, random output lengths, EOS ignored, seeded. `--backend hf`
also runs the same workload through transformers' batched generate (left padding, one batch,
so every sequence runs to the longest output; on the GPU when there is one) and prints our ratio to it.

`--random-model qwen3-0.6b` benchmarks a model of Qwen3-0.6B's shape with random weights, written
once into <cache>/models/random-qwen3-0.6b with the default model's tokenizer (SmolLM2's: token ids
up to 49151; the random prompts use ids below 10000). nano-vllm's bench.py workload on a GPU:

    nvllm bench throughput --random-model qwen3-0.6b --num-prompts 256 --min-input-len 100 \
        --max-input-len 1024 --min-output-len 100 --max-output-len 1024 --backend hf
"""

import json
import os
import random
import shutil
import tempfile
import time

from common.sampling_params import SamplingParams

# transformers config fields of the models --random-model can build
RANDOM_MODELS = {
    "qwen3-0.6b": dict(architecture="Qwen3", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
                       tie_word_embeddings=True, max_position_embeddings=40960, rope_theta=1000000.0,
                       rms_norm_eps=1e-6),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def random_model_folder(name: str, root: str | None = None, **overrides) -> str:
    """An HF folder with a random-weight model of RANDOM_MODELS[name] (fields replaced by overrides),
    bfloat16, seed 0, and the default model's tokenizer. Written once (to a temporary folder that is
    then renamed), reused after."""
    from engine_core.weights.model_resolver import cache_dir

    fields = RANDOM_MODELS[name] | overrides
    suffix = "".join(f"-{k}{v}" for k, v in sorted(overrides.items()))
    folder = os.path.join(root or os.path.join(cache_dir(), "models"), f"random-{name}{suffix}")
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".random-{name}-", dir=os.path.dirname(folder))
    try:
        _write_random_model(tmp, fields)
        os.replace(tmp, folder)
    except OSError:
        if not os.path.exists(os.path.join(folder, "config.json")):  # not another process winning the race
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _write_random_model(folder: str, fields: dict) -> None:
    import torch
    import transformers

    from engine_core.weights.model_resolver import resolve_model

    fields = dict(fields)
    arch = fields.pop("architecture")
    config = getattr(transformers, f"{arch}Config")(bos_token_id=1, eos_token_id=2, **fields)
    torch.manual_seed(0)
    model = getattr(transformers, f"{arch}ForCausalLM")(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer_dir = resolve_model(None)
    for file in TOKENIZER_FILES:
        if os.path.exists(os.path.join(tokenizer_dir, file)):
            shutil.copy(os.path.join(tokenizer_dir, file), folder)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2}, f)


def make_workload(args):
    rng = random.Random(args.bench_seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(args.min_input_len, args.max_input_len))]
               for _ in range(args.num_prompts)]
    out_lens = [rng.randint(args.min_output_len, args.max_output_len) for _ in range(args.num_prompts)]
    return prompts, out_lens


def run_nvllm(args, prompts, out_lens, mode: str) -> dict:
    from frontend.cli.engine_args import engine_args_from
    from frontend.llm import LLM

    engine = engine_args_from(args)
    kwargs = {k: getattr(engine, k) for k in engine.__struct_fields__ if k not in ("model", "usage")}
    llm = LLM(engine.model, multiprocess=mode == "mp", **kwargs)
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in out_lens]
    llm.generate(["warm up"], SamplingParams(max_tokens=4), use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    info = {"dtype": llm.model_info.dtype, "model": llm.model_info.model_name}
    llm.shutdown()
    return _figures("nvllm" if args.engine_mode != "both" else f"nvllm-{mode}", elapsed, prompts, out_tokens) | info


def run_hf(args, prompts, out_lens, dtype: str) -> dict:
    import torch
    import transformers

    from engine_core.weights.model_resolver import resolve_model

    folder = resolve_model(args.model)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    device = "cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch_dtype).to(device).eval()
    width = max(map(len, prompts))
    pad = 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    longest = max(out_lens)
    with torch.inference_mode():
        model.generate(ids[:1, -8:], attention_mask=mask[:1, -8:], max_new_tokens=2, do_sample=False)
        start = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                       do_sample=True, temperature=0.6, top_k=0, pad_token_id=pad)
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    # the workload asked for sum(out_lens) tokens; one batch must run every row to the longest
    return _figures("hf", elapsed, prompts, sum(out_lens))


def _figures(name, elapsed, prompts, out_tokens) -> dict:
    prompt_tokens = sum(map(len, prompts))
    return {"backend": name, "seconds": round(elapsed, 2), "prompt_tokens": prompt_tokens,
            "output_tokens": out_tokens, "output_tok_s": round(out_tokens / elapsed, 1),
            "total_tok_s": round((prompt_tokens + out_tokens) / elapsed, 1)}


def run_throughput(args) -> int:
    if getattr(args, "random_model", None):
        if args.model:
            raise SystemExit("pass either a model or --random-model, not both")
        args.model = random_model_folder(args.random_model)
    prompts, out_lens = make_workload(args)
    modes = ["inproc", "mp"] if args.engine_mode == "both" else [args.engine_mode]
    results = [run_nvllm(args, prompts, out_lens, mode) for mode in modes]
    if args.backend == "hf":
        results.append(run_hf(args, prompts, out_lens, results[0]["dtype"]))
    for r in results:
        print(f"{r['backend']:>12}: {r['output_tok_s']:8.1f} output tok/s, {r['total_tok_s']:8.1f} total tok/s "
              f"({r['output_tokens']} output + {r['prompt_tokens']} prompt tokens in {r['seconds']} s)")
    ratios = {}
    if len(modes) == 2:
        ratios["mp_over_inproc"] = round(results[1]["output_tok_s"] / results[0]["output_tok_s"], 3)
        print(f"background core process / in-process output throughput: {ratios['mp_over_inproc']:.3f}")
    if args.backend == "hf":
        ratios["ratio_output_tok_s"] = round(results[0]["output_tok_s"] / results[-1]["output_tok_s"], 2)
        print(f"nvllm / transformers output throughput: {ratios['ratio_output_tok_s']:.2f}x")
    if ratios:
        results.append(ratios)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=2)
    return 0
