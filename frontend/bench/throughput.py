"""`nvllm bench throughput`: offline tokens/s on nano-vllm's bench.py workload, scaled down.

Random prompts of random lengths, random output lengths, EOS ignored, seeded. `--backend hf`
also runs the same workload through transformers' batched generate (left padding, one batch,
so every sequence runs to the longest output) and prints our ratio to it.
"""

import json
import random
import time

from common.sampling_params import SamplingParams


def make_workload(args):
    rng = random.Random(args.bench_seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(args.min_input_len, args.max_input_len))]
               for _ in range(args.num_prompts)]
    out_lens = [rng.randint(args.min_output_len, args.max_output_len) for _ in range(args.num_prompts)]
    return prompts, out_lens


def run_nvllm(args, prompts, out_lens) -> dict:
    from frontend.cli.engine_args import engine_args_from
    from frontend.llm import LLM

    engine = engine_args_from(args)
    kwargs = {k: getattr(engine, k) for k in engine.__struct_fields__ if k != "model"}
    llm = LLM(engine.model, multiprocess=args.engine_mode == "mp", **kwargs)
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in out_lens]
    llm.generate(["warm up"], SamplingParams(max_tokens=4), use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    info = {"dtype": llm.model_info.dtype, "model": llm.model_info.model_name}
    llm.shutdown()
    return _figures("nvllm", elapsed, prompts, out_tokens) | info


def run_hf(args, prompts, out_lens, dtype: str) -> dict:
    import torch
    import transformers

    from engine_core.weights.model_resolver import resolve_model

    folder = resolve_model(args.model)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch_dtype).eval()
    width = max(map(len, prompts))
    pad = 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    longest = max(out_lens)
    with torch.inference_mode():
        model.generate(ids[:1, -8:], attention_mask=mask[:1, -8:], max_new_tokens=2, do_sample=False)
        start = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                       do_sample=True, temperature=0.6, top_k=0, pad_token_id=pad)
        elapsed = time.perf_counter() - start
    # the workload asked for sum(out_lens) tokens; one batch must run every row to the longest
    return _figures("hf", elapsed, prompts, sum(out_lens))


def _figures(name, elapsed, prompts, out_tokens) -> dict:
    prompt_tokens = sum(map(len, prompts))
    return {"backend": name, "seconds": round(elapsed, 2), "prompt_tokens": prompt_tokens,
            "output_tokens": out_tokens, "output_tok_s": round(out_tokens / elapsed, 1),
            "total_tok_s": round((prompt_tokens + out_tokens) / elapsed, 1)}


def run_throughput(args) -> int:
    prompts, out_lens = make_workload(args)
    results = [run_nvllm(args, prompts, out_lens)]
    if args.backend == "hf":
        results.append(run_hf(args, prompts, out_lens, results[0]["dtype"]))
    for r in results:
        print(f"{r['backend']:>6}: {r['output_tok_s']:8.1f} output tok/s, {r['total_tok_s']:8.1f} total tok/s "
              f"({r['output_tokens']} output + {r['prompt_tokens']} prompt tokens in {r['seconds']} s)")
    if len(results) == 2:
        ratio = results[0]["output_tok_s"] / results[1]["output_tok_s"]
        print(f"nvllm / transformers output throughput: {ratio:.2f}x")
        results.append({"ratio_output_tok_s": round(ratio, 2)})
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(results, f, indent=2)
    return 0
