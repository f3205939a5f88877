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

import random
import time

from common.lora import LoRARequest
from common.sampling_params import SamplingParams
from common.structured_outputs import StructuredOutputsParams
from benchmarks.offline.structured import BENCH_SCHEMA, compile_times, constrained_indices
from benchmarks.result_file import write_result


def make_workload(args):
    rng = random.Random(args.bench_seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(args.min_input_len, args.max_input_len))]
               for _ in range(args.num_prompts)]
    out_lens = [rng.randint(args.min_output_len, args.max_output_len) for _ in range(args.num_prompts)]
    return prompts, out_lens


def run_nvllm(args, prompts, out_lens, mode: str, label: str | None = None) -> dict:
    from common.cli.engine_args import engine_args_from
    from frontend.offline.llm import LLM

    engine = engine_args_from(args)
    kwargs = {k: getattr(engine, k) for k in engine.__struct_fields__ if k not in ("model", "usage")}
    llm = LLM(engine.model, multiprocess=mode == "mp", **kwargs)
    schema = constrained_indices(len(out_lens), getattr(args, "structured_share", 0.0), args.bench_seed)
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n, structured_outputs=(
        StructuredOutputsParams(json=BENCH_SCHEMA) if i in schema else None)) for i, n in enumerate(out_lens)]
    loras = lora_requests(args, len(prompts))
    llm.generate(["warm up"], SamplingParams(max_tokens=4), use_tqdm=False, lora_request=loras[0] if loras else None)
    if schema:  # the vocabulary index is built once per core: not part of the timed run
        llm.generate(["warm up"], SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
            json_object=True)), use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, lora_request=loras or None)
    elapsed = time.perf_counter() - start
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    info = {"dtype": llm.model_info.dtype, "model": llm.model_info.model_name, "constrained_requests": len(schema),
            "lora_adapters": getattr(args, "lora_adapters", 0) or 0}
    if schema:
        info |= compile_times(llm.model_info.tokenizer_files["tokenizer.json"], llm.model_info.vocab_size,
                              llm.model_info.eos_token_ids)
    llm.shutdown()
    label = label or ("nvllm" if args.engine_mode != "both" else f"nvllm-{mode}")
    return _figures(label, elapsed, prompts, out_tokens) | info


def lora_requests(args, count: int) -> list:
    """With --lora-adapters N: N random adapters (made once per run), the requests taking them in turn."""
    n = getattr(args, "lora_adapters", 0) or 0
    if not n:
        return []
    if getattr(args, "_lora_folders", None) is None:
        from benchmarks.torch_side.random_lora import random_lora_adapters
        args._lora_folders = random_lora_adapters(args.model, n, args.lora_rank)
    adapters = [LoRARequest(f"bench-{i}", i + 1, path) for i, path in enumerate(args._lora_folders)]
    return [adapters[i % n] for i in range(count)]


def run_hf(args, prompts, out_lens, dtype: str) -> dict:
    from benchmarks.torch_side.hf_baseline import hf_generate_seconds
    elapsed = hf_generate_seconds(args.model, args.device, prompts, out_lens, dtype)
    # the workload asked for sum(out_lens) tokens; one batch must run every row to the longest
    return _figures("hf", elapsed, prompts, sum(out_lens))


def _figures(name, elapsed, prompts, out_tokens) -> dict:
    prompt_tokens = sum(map(len, prompts))
    return {"backend": name, "seconds": round(elapsed, 2), "prompt_tokens": prompt_tokens,
            "output_tokens": out_tokens, "output_tok_s": round(out_tokens / elapsed, 1),
            "total_tok_s": round((prompt_tokens + out_tokens) / elapsed, 1)}


def _print(r: dict) -> None:
    print(f"{r['backend']:>12}: {r['output_tok_s']:8.1f} output tok/s, {r['total_tok_s']:8.1f} total tok/s "
          f"({r['output_tokens']} output + {r['prompt_tokens']} prompt tokens in {r['seconds']} s)")
    if r.get("constrained_requests"):
        print(f"{'':>12}  {r['constrained_requests']} requests with a JSON schema; llguidance compiles it in "
              f"{r['schema_compile_ms']} ms (the vocabulary index, once per core: {r['vocabulary_ms']} ms)")


def _compare_pairs(args, prompts, out_lens, pairs: int, variants: list[tuple[str, dict]], ratio_name: str,
                   what: str, more: list[tuple[str, int, int, str]] = ()) -> int:
    """The workload under two (or more) settings (attributes of args), in alternating rounds (this machine's load
    drifts: runs taken side by side compare fairly); prints the median ratio of the first to the second, and of
    each `more` (name, variant i, variant j, what): variant i to variant j."""
    mode = "inproc" if args.engine_mode == "both" else args.engine_mode
    results, ratios = [], {name: [] for name, *_ in [(ratio_name, 0, 1, what), *more]}
    for _ in range(pairs):
        pair = []
        for label, settings in variants:
            for name, value in settings.items():
                setattr(args, name, value)
            pair.append(run_nvllm(args, prompts, out_lens, mode, label))
            _print(pair[-1])
        results += pair
        for name, i, j, _ in [(ratio_name, 0, 1, what), *more]:
            ratios[name].append(round(pair[i]["output_tok_s"] / pair[j]["output_tok_s"], 3))
    summary = {}
    for name, _, _, text in [(ratio_name, 0, 1, what), *more]:
        median = sorted(ratios[name])[len(ratios[name]) // 2]
        print(f"{text} output throughput: {median:.3f} (median of {ratios[name]})")
        summary[name] = median
        summary["pairs" if name == ratio_name else f"{name}_rounds"] = ratios[name]
    results.append(summary)
    if args.output_json:
        write_result(args, results)
    return 0


def run_throughput(args) -> int:
    if getattr(args, "random_model", None):
        if args.model:
            raise SystemExit("pass either a model or --random-model, not both")
        from benchmarks.torch_side.random_model import random_model_folder
        args.model = random_model_folder(args.random_model)
    prompts, out_lens = make_workload(args)
    if getattr(args, "compare_batch_invariant", 0):
        return _compare_pairs(args, prompts, out_lens, args.compare_batch_invariant,
                              [("invariant", {"batch_invariant": True}), ("shape-tuned", {"batch_invariant": False})],
                              "invariant_over_shape_tuned", "batch-invariant / shape-tuned")
    if getattr(args, "compare_lora", 0):
        n = args.lora_adapters or 4
        return _compare_pairs(args, prompts, out_lens, args.compare_lora,
                              [(f"{n} adapters", {"lora_adapters": n, "enable_lora": True, "max_loras": n}),
                               ("base", {"lora_adapters": 0, "enable_lora": False}),
                               ("base, lora on", {"lora_adapters": 0, "enable_lora": True, "max_loras": n})],
                              "lora_over_base", f"{n} LoRA adapters mixed / the base model alone",
                              [("lora_on_base_over_base", 2, 1, "the base model with --enable-lora / without")])
    if getattr(args, "compare_structured", 0):
        share = args.structured_share or 0.5
        return _compare_pairs(args, prompts, out_lens, args.compare_structured,
                              [("constrained", {"structured_share": share}), ("plain", {"structured_share": 0.0})],
                              "constrained_over_plain", f"{share:.0%} schema-constrained / unconstrained")
    modes = ["inproc", "mp"] if args.engine_mode == "both" else [args.engine_mode]
    results = [run_nvllm(args, prompts, out_lens, mode) for mode in modes]
    if args.backend == "hf":
        results.append(run_hf(args, prompts, out_lens, results[0]["dtype"]))
    for r in results:
        _print(r)
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
        write_result(args, results)
    return 0
