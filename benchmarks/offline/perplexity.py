"""`nvllm bench perplexity MODEL [--llama-perplexity PATH]`: perplexity of a fixed text, measured as llama.cpp's
`llama-perplexity` measures it, and (with --llama-perplexity) llama.cpp's own figure on the same file and text.

The method is llama-perplexity's: the text tokenized once (with the model's BOS where it adds one), cut into
chunks of N_CTX tokens (as many whole chunks as fit, or --chunks), each chunk computed on its own from an empty
context (its first token replaced by BOS where the model adds one), and only the second half of each chunk
scored: the tokens at positions N_CTX/2 + 1 .. N_CTX - 1, each given every token before it in its chunk. The
perplexity is exp of their mean negative log-likelihood. nvllm's log-likelihoods are its prompt logprobs
(SamplingParams.prompt_logprobs), computed by the engine core at every prompt position.

The default text is the source of Python's `textwrap` module as this Python has it (its sha256 goes into the
result file): a few thousand tokens every machine has, the same for both engines.
"""

import hashlib
import math
import os
import re
import subprocess
import textwrap
import time

from common.sampling_params import SamplingParams
from benchmarks.result_file import write_result


def default_text_file() -> str:
    return textwrap.__file__


def chunks_of(tokens: list[int], n_ctx: int, num_chunks: int | None, bos: int | None) -> list[list[int]]:
    """llama-perplexity's chunks: whole runs of n_ctx tokens, each starting with BOS where the model adds one."""
    count = len(tokens) // n_ctx if num_chunks is None else min(num_chunks, len(tokens) // n_ctx)
    chunks = [tokens[i * n_ctx:(i + 1) * n_ctx] for i in range(count)]
    if bos is not None:
        chunks = [[bos] + chunk[1:] for chunk in chunks]
    return chunks


def scored_nll(prompt_logprobs: list, chunk: list[int]) -> list[float]:
    """The negative log-likelihoods of the chunk's scored tokens (its second half, as llama-perplexity scores)."""
    return [-prompt_logprobs[p][chunk[p]].logprob for p in range(len(chunk) // 2 + 1, len(chunk))]


def perplexity(nll: list[float]) -> tuple[float, float]:
    """exp(mean NLL) and its standard error, as llama-perplexity prints them."""
    mean = sum(nll) / len(nll)
    var = sum(x * x for x in nll) / len(nll) - mean * mean
    return math.exp(mean), math.exp(mean) * math.sqrt(max(var, 0.0) / (len(nll) - 1))


def run_nvllm(args, text: str) -> dict:
    from common.cli.engine_args import engine_args_from
    from frontend.offline.llm import LLM

    engine = engine_args_from(args)
    engine.cpu_threads = args.threads
    kwargs = {k: getattr(engine, k) for k in engine.__struct_fields__ if k not in ("model", "usage")}
    llm = LLM(engine.model, **kwargs)
    try:
        tokenizer = llm.get_tokenizer()
        bos = tokenizer.bos_token_id
        adds_bos = bos is not None and tokenizer.encode("a")[:1] == [bos]
        tokens = tokenizer.encode(text)
        chunks = chunks_of(tokens, args.n_ctx, args.chunks, bos if adds_bos else None)
        if not chunks or len(tokens) < 2 * args.n_ctx:
            raise SystemExit(f"nvllm bench perplexity: the text has {len(tokens)} tokens; at least {2 * args.n_ctx} "
                             f"(two chunks of --n-ctx {args.n_ctx}) are needed")
        start = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": c} for c in chunks],
                               SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))
        seconds = time.perf_counter() - start
    finally:
        llm.shutdown()
    nll = [x for out, chunk in zip(outputs, chunks) for x in scored_nll(out.prompt_logprobs, chunk)]
    ppl, err = perplexity(nll)
    return {"ppl": round(ppl, 4), "ppl_error": round(err, 5), "text_tokens": len(tokens), "chunks": len(chunks),
            "scored_tokens": len(nll), "seconds": round(seconds, 1)}


FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
CHUNKS = re.compile(r"calculating perplexity over (\d+) chunks")


def run_llama(args, text_file: str) -> dict:
    cmd = [args.llama_perplexity, "-m", args.model, "-f", text_file, "-c", str(args.n_ctx), "-b", str(args.n_ctx),
           "-t", str(args.threads)]
    if args.chunks is not None:
        cmd += ["--chunks", str(args.chunks)]
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(os.path.abspath(args.llama_perplexity)))
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    seconds = time.perf_counter() - start
    log = out.stdout + out.stderr
    final, chunks = FINAL.search(log), CHUNKS.search(log)
    if out.returncode or final is None:
        raise SystemExit(f"llama-perplexity failed (exit {out.returncode}): {' '.join(cmd)}\n{log[-2000:]}")
    return {"ppl": float(final.group(1)), "ppl_error": float(final.group(2)),
            "chunks": int(chunks.group(1)) if chunks else None, "seconds": round(seconds, 1)}


def run_perplexity(args) -> int:
    if args.llama_perplexity and not os.access(args.llama_perplexity, os.X_OK):
        raise SystemExit(f"nvllm bench perplexity: --llama-perplexity {args.llama_perplexity} is not an executable")
    if args.n_ctx < 4:
        raise SystemExit(f"nvllm bench perplexity: --n-ctx must be at least 4, got {args.n_ctx}")
    text_file = args.text_file or default_text_file()
    with open(text_file, encoding="utf-8") as f:
        text = f.read()
    results = {"text_file": text_file, "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
               "n_ctx": args.n_ctx, "threads": args.threads}
    ours = run_nvllm(args, text)
    results["nvllm"] = ours
    print(f"nvllm: PPL {ours['ppl']:.4f} +/- {ours['ppl_error']:.4f} over {ours['chunks']} chunks of {args.n_ctx} "
          f"({ours['scored_tokens']} tokens scored, {ours['seconds']:.1f} s)")
    if args.llama_perplexity:
        llama = run_llama(args, text_file)
        results["llama_cpp"] = llama
        results["nvllm_over_llama_cpp"] = round(ours["ppl"] / llama["ppl"], 4)
        print(f"llama.cpp: PPL {llama['ppl']:.4f} +/- {llama['ppl_error']:.4f} over {llama['chunks']} chunks "
              f"({llama['seconds']:.1f} s); nvllm / llama.cpp = {results['nvllm_over_llama_cpp']:.4f}")
    if args.output_json:
        write_result(args, results)
    return 0


def register(kinds, formatter) -> None:
    from common.cli.engine_args import add_engine_args

    p = kinds.add_parser("perplexity", help="perplexity of a fixed text as llama-perplexity measures it "
                                            "(and llama.cpp's own figure beside it)", formatter_class=formatter)
    add_engine_args(p)
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                   help="logging level")
    p.add_argument("--text-file", default=None,
                   help="the text to score (default: the source of this Python's textwrap module)")
    p.add_argument("--n-ctx", type=int, default=512, help="tokens per chunk (llama-perplexity -c)")
    p.add_argument("--chunks", type=int, default=None, help="score at most this many chunks (default: all)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="threads, both engines")
    p.add_argument("--llama-perplexity", default=None, help="path of a llama-perplexity built from llama.cpp's source")
    p.add_argument("--timeout", type=int, default=3600, help="seconds llama-perplexity may take")
    p.add_argument("--output-json", default=None, help="also write the figures here")
    p.set_defaults(func=run_perplexity)
