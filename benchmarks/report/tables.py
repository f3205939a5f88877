"""One table per kind of bench: the columns each result file's figures fill, a row per file (or per
workload, backend or variant in it). Every row starts with an anchor, so prose can cite the exact row."""

from statistics import median

from benchmarks.report.results import Result, model_name, slug


def ratio(value: float) -> str:
    return f"{value:.2f}x"


def num(value: float, digits: int = 1) -> str:
    return f"{value:.{digits}f}"


def anchored(anchor: str, text: str) -> str:
    return f'<a id="{anchor}"></a>{text}'


def vs_vllm(result: Result) -> list[list[str]]:
    """`nvllm bench cpu --vllm-venv`: each workload's figure for both engines, the ratio, TTFT for serve."""
    units = {"serve": "req/s"}
    rows = []
    for item in result.results["summary"]:
        workload = item["workload"]
        detail = ""
        if "mean_ttft_ms" in item:
            ttft = item["mean_ttft_ms"]
            detail = f"mean TTFT {num(ttft['nvllm'])} ms against {num(ttft['vllm'])} ms"
        elif "nvllm_fraction_of_peak" in item:
            detail = f"{item['nvllm_fraction_of_peak'] * 100:.0f}% of the GEMM peak"
        unit = units.get(workload, "tok/s")
        rows.append([anchored(f"{result.anchor}-{workload}", model_name(result)), workload,
                     f"{item['nvllm']} {unit}", f"{item['vllm']} {unit}", ratio(item["ratio"]), detail])
    return rows


VS_VLLM = ["model", "workload", "nvllm", "vLLM", "nvllm / vLLM", "notes"]


def vs_llama_cpp(result: Result) -> list[list[str]]:
    """`nvllm bench llama-cpp`: prefill against pp, decode against tg, on the same GGUF file and threads."""
    r = result.results
    return [[anchored(result.anchor, model_name(result)), str(r["threads"]),
             f"{num(r['nvllm_prefill_tok_s'])} tok/s", f"{num(r['llama_cpp_pp_tok_s'])} tok/s",
             ratio(r["prefill_nvllm_over_llama_cpp"]),
             f"{num(r['nvllm_decode_tok_s'])} tok/s", f"{num(r['llama_cpp_tg_tok_s'])} tok/s",
             ratio(r["decode_nvllm_over_llama_cpp"])]]


VS_LLAMA_CPP = ["model", "threads", "prefill nvllm", "llama.cpp pp", "ratio", "decode nvllm", "llama.cpp tg",
                "ratio"]


def perplexity(result: Result) -> list[list[str]]:
    r = result.results
    return [[anchored(result.anchor, model_name(result)), str(r["n_ctx"]), str(r["nvllm"]["scored_tokens"]),
             num(r["nvllm"]["ppl"], 4), num(r["llama_cpp"]["ppl"], 4), ratio(r["nvllm_over_llama_cpp"])]]


PERPLEXITY = ["model", "context", "scored tokens", "nvllm perplexity", "llama.cpp perplexity", "ratio"]


def latency(result: Result) -> list[list[str]]:
    """`nvllm bench latency`: one request at a time; TTFT, time per output token and its memory bound."""
    r = result.results
    stream = r.get("weight_stream") or {}
    speculative = r.get("speculative")
    how = ("n-gram, " + str(speculative["config"]["num_speculative_tokens"]) + " tokens: "
           + ratio(speculative["speedup"])) if speculative else ""
    return [[anchored(result.anchor, model_name(result)), _latency_variant(result), r["prompt"],
             f"{r['input_len']} / {r['output_len']}", f"{num(r['ttft_ms'])} ms",
             f"{num(r['ms_per_output_token'], 2)} ms", f"{num(r['output_tokens_per_s'])} tok/s",
             f"{num(stream['bound_ms'], 2)} ms" if stream else "",
             ratio(stream["one_token_step_over_bound"]) if stream else "", how]]


def _latency_variant(result: Result) -> str:
    words = result.data["command"].split()
    flags = [f"{w} {words[i + 1]}" for i, w in enumerate(words)
             if w in ("--dtype", "--quantization", "-q") and i + 1 < len(words)]
    return ", ".join(flags) or "defaults"


LATENCY = ["model", "flags", "prompt", "input / output tokens", "TTFT", "time per output token", "decode",
           "weight-streaming bound", "step / bound", "speculative decoding"]


def throughput(result: Result) -> list[list[str]]:
    """`nvllm bench throughput`: one row per backend (the median of its rounds when it ran several), and
    with `--backend hf` beside it, nvllm's output rate over transformers'."""
    backends = _by_backend(result)
    reference = median([x["output_tok_s"] for x in backends["hf"]]) if "hf" in backends else None
    rows = []
    for backend, runs in backends.items():
        rounds = f" (median of {len(runs)})" if len(runs) > 1 else ""
        value = median([x["output_tok_s"] for x in runs])
        rows.append([anchored(f"{result.anchor}-{slug(backend)}", model_name(result)), _backend_name(result, backend),
                     runs[0].get("dtype", ""), f"{runs[0]['prompt_tokens']} / {runs[0]['output_tokens']}",
                     f"{num(value)} tok/s{rounds}", f"{num(median([x['total_tok_s'] for x in runs]))} tok/s",
                     ratio(value / reference) if reference and backend != "hf" else ""])
    return rows


THROUGHPUT = ["model", "engine", "dtype", "prompt / output tokens", "output", "total", "against transformers"]


def _by_backend(result: Result) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for run in result.results:
        if "backend" not in run:  # a --compare-* run's summary
            continue
        found.setdefault(run["backend"], []).append(run)
    return found


def _backend_name(result: Result, backend: str) -> str:
    words = result.data["command"].split()
    if backend == "nvllm" and "-tp" in words:
        return f"nvllm, tensor parallel {words[words.index('-tp') + 1]}"
    return {"hf": "transformers"}.get(backend, backend)


# the variant each `--compare-*` run is measured against
REFERENCE = {"--compare-batch-invariant": "shape-tuned", "--compare-structured": "plain", "--compare-lora": "base"}


def compare(result: Result) -> list[list[str]]:
    """`nvllm bench throughput --compare-*`: each variant's median throughput over alternated rounds, and the
    median of its per-round ratios to the variant it is compared with (the bench's own summary)."""
    option = next(w for w in result.data["command"].split() if w in REFERENCE)
    summary = next(x for x in result.results if "backend" not in x)
    rows = []
    for backend, items in _by_backend(result).items():
        value = median([x["output_tok_s"] for x in items])
        key = _summary_key(backend)
        rows.append([anchored(f"{result.anchor}-{slug(backend)}", option), backend, str(len(items)),
                     f"{num(value)} tok/s", ratio(summary[key]) if key in summary else "reference"])
    return rows


def _summary_key(backend: str) -> str:
    """The bench's summary field for a variant: its ratio to the reference, median over rounds."""
    if backend.endswith("adapters"):
        return "lora_over_base"
    return {"invariant": "invariant_over_shape_tuned", "constrained": "constrained_over_plain",
            "base, lora on": "lora_on_base_over_base"}.get(backend, "")


COMPARE = ["comparison", "variant", "rounds", "output (median)", "against the reference"]


def serve(result: Result) -> list[list[str]]:
    """`nvllm bench serve`: requests at a fixed concurrency against a running server."""
    r = result.results
    return [[anchored(result.anchor, r["model"]), str(r["max_concurrency"]), f"{r['random_input_len']} / "
             f"{r['random_output_len']}", f"{r['request_throughput']} req/s", f"{num(r['output_throughput'])} tok/s",
             f"{num(r['mean_ttft_ms'])} ms", f"{num(r['mean_tpot_ms'])} ms"]]


SERVE = ["model", "concurrency", "input / output tokens", "requests", "output", "mean TTFT", "mean TPOT"]


def overhead(result: Result) -> list[list[str]]:
    """`nvllm bench overhead`: tiny requests per second through frontend and core; with --compare-tracing,
    tracing to no collector and to a live one against tracing off."""
    r = result.results
    if "median_ratio_to_off" not in r:
        return [[anchored(result.anchor, "tracing off"), str(r["concurrency"]), "1",
                 f"{num(r['requests_per_s'])} req/s", ""]]
    rows = []
    for variant, value in r["median_requests_per_s"].items():
        ratio_cell = ratio(r["median_ratio_to_off"][variant]) if variant in r["median_ratio_to_off"] else ""
        rows.append([anchored(f"{result.anchor}-{slug(variant)}", variant.replace("_", " ")),
                     str(r["concurrency"]), str(r["max_tokens"]), f"{num(value)} req/s", ratio_cell])
    return rows


OVERHEAD = ["tracing", "concurrency", "tokens per request", "requests (median)", "against tracing off"]


# the bench that wrote a result file -> (kind of table, its columns, its rows)
TABLES = {"cpu": ("vs-vllm", VS_VLLM, vs_vllm), "llama-cpp": ("llama-cpp", VS_LLAMA_CPP, vs_llama_cpp),
          "perplexity": ("perplexity", PERPLEXITY, perplexity), "latency": ("latency", LATENCY, latency),
          "throughput": ("throughput", THROUGHPUT, throughput), "serve": ("serve", SERVE, serve),
          "overhead": ("overhead", OVERHEAD, overhead)}


def table_for(result: Result) -> tuple[str, list[str], list[list[str]]]:
    """(kind, columns, rows) of one result file."""
    if result.bench == "throughput" and any(w in REFERENCE for w in result.data["command"].split()):
        return "compare", COMPARE, compare(result)
    if result.bench not in TABLES:
        raise ValueError(f"{result.path}: no table for `nvllm bench {result.bench}`")
    kind, columns, rows = TABLES[result.bench]
    return kind, columns, rows(result)
