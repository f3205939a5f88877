"""The offline API on a tiny model: batch invariance, seeds, sampling parameters, stop
conditions, logprobs, n > 1, input forms and validation."""

import math

import pytest
import torch

from common.sampling_params import SamplingParams

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def llm(tiny_models):
    from frontend.offline.llm import LLM
    engine = LLM(tiny_models["qwen2"], dtype="float32", kv_cache_memory="64MiB", max_model_len=256)
    yield engine
    engine.shutdown()


def _ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


def test_batch_invariance_greedy_and_seeded(llm):
    target = _ids(37, 0)
    others = [_ids(5 + 7 * i % 60, 100 + i) for i in range(32)]
    for params in (SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                   SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=20, ignore_eos=True)):
        alone = llm.generate([target], params, use_tqdm=False)[0].outputs[0].token_ids
        other_params = SamplingParams(temperature=0.8, max_tokens=25, ignore_eos=True)
        batch = llm.generate(others[:16] + [target] + others[16:], [other_params] * 16 + [params] + [other_params] * 16,
                             use_tqdm=False)
        assert batch[16].outputs[0].token_ids == alone


def test_seed_reproducible_and_different_seeds_differ(llm):
    p = _ids(10, 1)
    a = llm.generate([p], SamplingParams(temperature=1.0, seed=7, max_tokens=30, ignore_eos=True), use_tqdm=False)
    b = llm.generate([p], SamplingParams(temperature=1.0, seed=7, max_tokens=30, ignore_eos=True), use_tqdm=False)
    c = llm.generate([p], SamplingParams(temperature=1.0, seed=8, max_tokens=30, ignore_eos=True), use_tqdm=False)
    assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids
    assert a[0].outputs[0].token_ids != c[0].outputs[0].token_ids


def test_top_k_one_is_greedy_and_min_p_one_is_greedy(llm):
    p = _ids(12, 2)
    greedy = llm.generate([p], SamplingParams(temperature=0, max_tokens=15, ignore_eos=True), use_tqdm=False)
    for params in (SamplingParams(temperature=1.5, top_k=1, max_tokens=15, ignore_eos=True),
                   SamplingParams(temperature=1.5, min_p=1.0, max_tokens=15, ignore_eos=True),
                   SamplingParams(temperature=1.5, top_p=1e-6, max_tokens=15, ignore_eos=True)):
        out = llm.generate([p], params, use_tqdm=False)
        assert out[0].outputs[0].token_ids == greedy[0].outputs[0].token_ids


def test_penalties_change_repetition(llm):
    p = _ids(8, 3)
    plain = llm.generate([p], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False)
    tokens = plain[0].outputs[0].token_ids
    assert len(set(tokens)) < len(tokens), "the tiny model should repeat itself greedily"
    for params in (SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, repetition_penalty=10.0),
                   SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, frequency_penalty=2.0),
                   SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, presence_penalty=2.0)):
        out = llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids
        assert len(set(out)) > len(set(tokens))


def test_stop_token_ids_min_tokens_max_tokens(llm):
    p = _ids(9, 4)
    free = llm.generate([p], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True), use_tqdm=False)
    tokens = free[0].outputs[0].token_ids
    stop_at = tokens[5]
    first = tokens.index(stop_at)
    out = llm.generate([p], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_at], ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == tokens[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at
    # min_tokens keeps the stop token from being sampled before it
    out = llm.generate([p], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_at],
                                           min_tokens=first + 2, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert stop_at not in out.token_ids[: first + 2]
    out = llm.generate([p], SamplingParams(temperature=0, max_tokens=7, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 7 and out.finish_reason == "length"


def test_logprobs(llm):
    p = _ids(9, 5)
    out = llm.generate([p], SamplingParams(temperature=0, max_tokens=6, logprobs=3, ignore_eos=True),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 6
    total = 0.0
    for tid, entry in zip(out.token_ids, out.logprobs):
        assert tid in entry and entry[tid].rank == 1  # greedy: the sampled token is the top one
        assert len(entry) == 3
        values = sorted((lp.logprob for lp in entry.values()), reverse=True)
        assert values[0] == entry[tid].logprob and all(v <= 0 for v in values)
        total += entry[tid].logprob
    assert math.isclose(out.cumulative_logprob, total, rel_tol=1e-6)


def test_n_and_input_forms(llm):
    tok = llm.get_tokenizer()
    outs = llm.generate("Hello there", SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=8, ignore_eos=True),
                        use_tqdm=False)
    assert len(outs) == 1 and [c.index for c in outs[0].outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in outs[0].outputs}) > 1
    ids = tok.encode("Hello there")
    by_text = llm.generate(["Hello there", "Bye"], SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)
    by_ids = llm.generate([ids, tok.encode("Bye")], SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in by_text] == [o.outputs[0].token_ids for o in by_ids]
    assert by_text[0].prompt == "Hello there" and by_text[0].prompt_token_ids == ids
    single = llm.generate(ids, SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)
    assert single[0].outputs[0].token_ids == by_ids[0].outputs[0].token_ids


@pytest.mark.parametrize("params, field", [
    (SamplingParams(temperature=-1), "temperature"),
    (SamplingParams(top_p=0), "top_p"),
    (SamplingParams(top_p=1.5), "top_p"),
    (SamplingParams(n=0), "n"),
    (SamplingParams(max_tokens=0), "max_tokens"),
    (SamplingParams(max_tokens=1000), "max_tokens"),
    (SamplingParams(min_p=2), "min_p"),
    (SamplingParams(top_k=-5), "top_k"),
    (SamplingParams(logprobs=100), "logprobs"),
    (SamplingParams(repetition_penalty=0), "repetition_penalty"),
    (SamplingParams(min_tokens=10, max_tokens=5), "min_tokens"),
])
def test_bad_parameters_name_the_field(llm, params, field):
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        llm.generate("Hello", params, use_tqdm=False)


def test_bad_prompts(llm):
    with pytest.raises(ValueError, match="prompt"):
        llm.generate("", SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[5, 49152]], SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([[5] * 300], SamplingParams(max_tokens=2), use_tqdm=False)
    # the engine is still fine afterwards, with every block back in the pool
    assert llm.generate("ok", SamplingParams(max_tokens=2), use_tqdm=False)[0].finished
    stats = llm.get_stats()
    assert stats.gauges.num_free_blocks == stats.gauges.num_total_blocks


def test_docs_offline_example(default_model_dir):
    """docs/offline.md's "Generate offline" example runs as written (the default model, its core in a child
    process)."""
    import subprocess
    import sys

    from tests.support.doc_pages import ROOT, code_blocks, page, section

    blocks = code_blocks(section(page("offline.md"), "Generate offline"), "python")
    assert len(blocks) == 1
    out = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("'The capital of France is' -> ") and lines[1].startswith("'Once upon a time' -> ")
    assert "4" in lines[-1]  # SmolLM2 knows 2 + 2


def test_readme_and_getting_started_offline_example(default_model_dir):
    """README's offline example, the same one as the getting-started page's, runs as written."""
    import subprocess
    import sys

    from tests.support.doc_pages import ROOT, code_blocks, page

    blocks = [[b for b in code_blocks(page(name), "python") if "from frontend import LLM" in b]
              for name in ("README.md", "getting-started.md")]
    assert len(blocks[0]) == 1 and blocks[0] == blocks[1], "README and getting-started show the same example"
    out = subprocess.run([sys.executable, "-c", blocks[0][0]], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("'The capital of France is' -> ") and lines[1].startswith("'Once upon a time' -> ")


def test_bench_throughput_and_overhead_run_and_report(tiny_models, tmp_path):
    """`nvllm bench throughput` (both engine modes and transformers) and `bench overhead` on a tiny workload."""
    import json

    from frontend.cli.main import main

    model = ["--dtype", "float32", "--kv-cache-memory", "32MiB", "--max-model-len", "128"]
    out = tmp_path / "throughput.json"
    assert main(["bench", "throughput", tiny_models["llama"], *model, "--num-prompts", "3", "--min-input-len", "4",
                 "--max-input-len", "12", "--min-output-len", "2", "--max-output-len", "6", "--engine-mode", "both",
                 "--backend", "hf", "--output-json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["command"].startswith("nvllm bench throughput ") and written["cpu"]["model"]
    assert written["machine"] and written["commit"] and written["date"].startswith("20")
    inproc, mp, hf, ratios = written["results"]
    assert (inproc["backend"], mp["backend"], hf["backend"]) == ("nvllm-inproc", "nvllm-mp", "hf")
    assert inproc["output_tokens"] == mp["output_tokens"] == hf["output_tokens"]  # EOS ignored: all asked for
    assert ratios["mp_over_inproc"] > 0 and ratios["ratio_output_tok_s"] > 0
    out = tmp_path / "overhead.json"
    assert main(["bench", "overhead", tiny_models["llama"], *model, "--num-requests", "50", "--concurrency", "8",
                 "--output-json", str(out)]) == 0
    assert json.loads(out.read_text())["results"]["requests_per_s"] > 0


@pytest.mark.parametrize("option, ratio", [("--compare-batch-invariant", "invariant_over_shape_tuned"),
                                           ("--compare-structured", "constrained_over_plain")])
def test_bench_throughput_compare_options_report_paired_ratios(tiny_models, tmp_path, option, ratio):
    """The costs pages' commands: `nvllm bench throughput --compare-batch-invariant N` / `--compare-structured N`."""
    import json

    from frontend.cli.main import main

    out = tmp_path / "compare.json"
    assert main(["bench", "throughput", tiny_models["llama"], "--dtype", "float32", "--kv-cache-memory", "32MiB",
                 "--max-model-len", "128", "--num-prompts", "3", "--min-input-len", "4", "--max-input-len", "12",
                 "--min-output-len", "2", "--max-output-len", "6", option, "2", "--output-json", str(out)]) == 0
    *runs, summary = json.loads(out.read_text())["results"]
    assert len(runs) == 4 and len(summary["pairs"]) == 2
    for first, second, pair_ratio in zip(runs[::2], runs[1::2], summary["pairs"]):
        assert pair_ratio == round(first["output_tok_s"] / second["output_tok_s"], 3)
    assert summary[ratio] in summary["pairs"]


def test_bench_cpu_runs_the_workloads_alone_and_busy(tiny_models, tmp_path):
    """`nvllm bench cpu` without a vLLM venv: the GEMM peak, prefill and decode, alone and beside a busy process."""
    import json

    from frontend.cli.main import main

    out = tmp_path / "cpu.json"
    assert main(["bench", "cpu", tiny_models["llama"], "--workloads", "prefill,decode", "--repeat", "1", "--busy",
                 "--num-prompts", "4", "--settle-timeout", "5", "--output-json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["command"].startswith("nvllm bench cpu ")
    result = written["results"]
    assert result["gemm_peak"]["peak_gflops"] > 0
    assert all(rate > 0 for rate in result["quantized_kernels"]["gflops_by_kernel"]["nvllm"].values())
    assert result["requests"] == {"prefill": 4, "decode": 4}  # --num-prompts: the first 4 of each workload's 32
    rows = {(r["workload"], r["condition"]): r for r in result["summary"]}
    assert set(rows) == {(w, c) for w in ("prefill", "decode") for c in ("alone", "busy")}
    assert all(r["nvllm"] > 0 for r in rows.values())
    assert 0 <= rows[("prefill", "alone")]["nvllm_fraction_of_peak"] < 1.5  # rounds to 0 on a tiny model
    assert rows[("decode", "busy")]["nvllm_loss"] == round(
        1 - rows[("decode", "busy")]["nvllm"] / rows[("decode", "alone")]["nvllm"], 3)


def test_offline_steps_take_a_bigger_token_budget_than_serving(llm):
    from common.config import EngineArgs
    assert EngineArgs().token_budget("cpu") == 512  # serving: prompts of a burst start streaming sooner
    assert EngineArgs(usage="offline").token_budget("cpu") == 2048
    assert EngineArgs(usage="offline", max_num_batched_tokens=64).token_budget("cpu") == 64
    assert EngineArgs().token_budget("cuda") == 2048
    with pytest.raises(ValueError, match="usage must be server or offline"):
        EngineArgs(usage="batch").validate()
    assert llm.engine_args.usage == "offline"  # what the core's scheduler sizes its steps by
