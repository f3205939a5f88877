"""Tensor parallelism on CPU (gloo): TP=2 gives TP=1's greedy tokens, across two "nodes" on
loopback too; each rank keeps its shard of GGUF weights quantized; a dying worker ends the engine with an error naming its rank; a missing rank is a
time-out error, not a hang; `nvllm serve -tp 2` serves HTTP."""

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch

from common.config import EngineArgs
from common.sampling_params import SamplingParams
from tests.support.tiny_models import build_tiny_model
from tests.support.cpu_tier_helpers import forced_tier, tier_params
from engine_core.executor import rendezvous as rdv
from engine_core.distributed.parallel_state import HeadShard, partition_heads, split_evenly
from engine_core.layers import cpu_packing
from engine_core.cpu_kernels.linear import quant_bf16_dot, quant_exact_f32
from engine_core.layers.linear import RowParallelLinear
from engine_core.weights import quantized
from tests.support.http_helpers import NVLLM, ROOT, Proc, free_port, pid_alive, wait_healthy, wait_until

pytestmark = pytest.mark.integration

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,"]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
ENGINE = dict(dtype="float32", kv_cache_memory="64MiB", max_model_len=512)
ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
WAIT = 120  # the deadline of every wait for something expected within seconds


# ---- how heads and rows split over ranks ------------------------------------------------------

def test_split_evenly():
    assert [split_evenly(9, 2, r) for r in range(2)] == [(0, 5), (5, 4)]
    assert [split_evenly(8, 4, r) for r in range(4)] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert split_evenly(1536, 1, 0) == (0, 1536)


def test_partition_heads():
    # SmolLM2: 9 heads, 3 KV heads on 2 ranks -> rank 0 KV 0-1 (q 0-5), rank 1 KV 2 (q 6-8)
    assert partition_heads(9, 3, 0, 2) == HeadShard(0, 6, 0, 2)
    assert partition_heads(9, 3, 1, 2) == HeadShard(6, 3, 2, 1)
    assert partition_heads(9, 3, 0, 1) == HeadShard(0, 9, 0, 3)
    # split KV heads
    assert [partition_heads(4, 2, r, 2) for r in range(2)] == [HeadShard(0, 2, 0, 1), HeadShard(2, 2, 1, 1)]
    # one KV head, replicated: each rank its share of the query heads
    assert [partition_heads(4, 1, r, 2) for r in range(2)] == [HeadShard(0, 2, 0, 1), HeadShard(2, 2, 0, 1)]
    assert [partition_heads(8, 2, r, 4) for r in range(4)] == [
        HeadShard(0, 2, 0, 1), HeadShard(2, 2, 0, 1), HeadShard(4, 2, 1, 1), HeadShard(6, 2, 1, 1)]
    # every query head is computed by exactly one rank
    for heads, kv, size in [(9, 3, 2), (12, 4, 3), (12, 3, 4), (6, 2, 5), (32, 8, 6)]:
        shards = [partition_heads(heads, kv, r, size) for r in range(size)]
        assert sorted(q for s in shards for q in range(s.q_start, s.q_start + s.num_q)) == list(range(heads))
        assert all(s.kv_start == (s.q_start * kv) // heads for s in shards)
    with pytest.raises(ValueError, match="at most 2 ranks"):
        partition_heads(2, 1, 0, 4)


def test_a_row_parallel_shard_keeps_whole_blocks():
    """A rank's input slice of a row-parallel GGUF weight: whole blocks of 32 are cut from the rows and
    multiply as the same slice of the dequantized weight; a slice that would split a block is refused."""
    torch.manual_seed(0)
    weight = quant_bf16_dot.quantize_int8(torch.randn(8, 128))
    dequantized = (weight.rows.view(8, 4, 34)[:, :, 2:].contiguous().view(torch.int8).float()
                   * weight.rows.view(8, 4, 34)[:, :, :2].contiguous().view(torch.float16).float()).view(8, 128)
    raw = {"model.layers.0.mlp.down_proj.weight": (lambda: weight.rows, weight.qtype)}  # (read, type), as loaded
    pieces = [("model.layers.0.mlp.down_proj.weight", None)]
    shard = quantized._joined(RowParallelLinear(128, 8, input_start=32, input_size=64), raw, pieces)
    assert shard is not None and shard.shape == (8, 64)
    if quant_exact_f32.load() is not None:
        x = torch.randn(3, 64)
        packed = cpu_packing.pack_quantized(shard, torch.float32)
        torch.testing.assert_close(packed.matmul(x), x @ dequantized[:, 32:96].T, rtol=1e-5, atol=1e-5)
    assert quantized._joined(RowParallelLinear(128, 8, input_start=16, input_size=64), raw, pieces) is None


def test_a_row_parallel_k_quant_shard_keeps_whole_super_blocks():
    """A K-quant's blocks hold 256 inputs: a rank's slice is cut at super-block boundaries (the rows of the
    dequantized slice), and one that would split a super-block is refused (that layer is then dequantized)."""
    from tests.support.gguf_weights import quantized_weight

    weight, dequantized = quantized_weight("q4_k", 8, 768, seed=3)
    raw = {"model.layers.0.mlp.down_proj.weight": (lambda: weight.rows, weight.qtype)}
    pieces = [("model.layers.0.mlp.down_proj.weight", None)]
    shard = quantized._joined(RowParallelLinear(768, 8, input_start=256, input_size=512), raw, pieces)
    assert shard is not None and shard.shape == (8, 512)
    from engine_core.cpu_kernels.linear import quant_int8_rows
    if quant_int8_rows.load() is not None:
        rows = cpu_packing.pack_quantized(shard, torch.float32).rows_of(torch.arange(8), torch.float32)
        assert torch.equal(rows, dequantized[:, 256:])
    assert quantized._joined(RowParallelLinear(768, 8, input_start=128, input_size=384), raw, pieces) is None


# ---- TP=2 equals TP=1 ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory, default_model_dir):
    root = tmp_path_factory.mktemp("tp")
    out = {"default": default_model_dir}
    for arch in ("llama", "qwen3"):
        for kv in (1, 2):
            out[f"{arch}-kv{kv}"] = build_tiny_model(str(root / f"{arch}-kv{kv}"), arch, default_model_dir,
                                                     num_kv_heads=kv, num_heads=4)
    # q/k/v biases: each rank keeps its heads' rows of them
    out["qwen2-kv2"] = build_tiny_model(str(root / "qwen2-kv2"), "qwen2", default_model_dir, num_kv_heads=2,
                                        num_heads=4)
    # every layer slides (window 8 in the conftest): each rank honours the window and gives back the same blocks
    out["mistral-kv2"] = build_tiny_model(str(root / "mistral-kv2"), "mistral", default_model_dir, num_kv_heads=2)
    # Phi-4-mini's shape of rotary and embeddings: 12 of each head's 16 dims rotate, tied embeddings
    out["phi3-kv2"] = build_tiny_model(str(root / "phi3-kv2"), "phi3", default_model_dir, num_kv_heads=2,
                                       num_heads=4, partial_rotary_factor=0.75, tie_word_embeddings=True)
    # Gemma 2: scores capped at 2.0 (binding), a window of 8 on its first layer, a global second one
    out["gemma2-kv2"] = build_tiny_model(str(root / "gemma2-kv2"), "gemma2", default_model_dir, num_kv_heads=2,
                                         sliding_window=8)
    return out


_reference: dict[tuple, list] = {}


def generate(model: str, prompts=PROMPTS, **kw) -> list[tuple[list[int], str]]:
    """(token ids, text) of each prompt's greedy completion."""
    from frontend.offline.llm import LLM

    llm = LLM(model, **ENGINE, **kw)
    try:
        return [(o.outputs[0].token_ids, o.outputs[0].text) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    finally:
        llm.shutdown()


def reference(model: str, prompts=PROMPTS, **kw) -> list[tuple[list[int], str]]:
    key = (model, tuple(prompts), tuple(sorted(kw.items())))
    if key not in _reference:
        _reference[key] = generate(model, prompts, tensor_parallel_size=1, **kw)
    return _reference[key]


@pytest.mark.parametrize("name", ["default", "llama-kv1", "llama-kv2", "qwen2-kv2", "qwen3-kv1", "qwen3-kv2",
                                  "phi3-kv2", "mistral-kv2", "gemma2-kv2"])
def test_tp2_greedy_equals_tp1(models, name):
    """The default model's 9 heads / 3 KV heads split unevenly; kv1 replicates the KV head, kv2 splits."""
    prompts = PROMPTS[:2] if name == "default" else PROMPTS
    expected = reference(models[name], prompts)
    assert generate(models[name], prompts, tensor_parallel_size=2) == expected


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory, default_model_dir):
    """Qwen2-MoE (a dense layer, a shared expert and its gate) and Qwen3-MoE with experts 33 wide, so their rows
    split unevenly (17 and 16); Mixtral (top-2 of 8 experts, every layer sparse, no shared expert)."""
    root = tmp_path_factory.mktemp("tp-moe")
    sizes = {"qwen3_moe": dict(moe_intermediate_size=33)}
    return {arch: build_tiny_model(str(root / arch), arch, default_model_dir, **sizes.get(arch, {}))
            for arch in ("qwen2_moe", "qwen3_moe", "mixtral")}


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe", "mixtral"])
def test_tp2_moe_greedy_equals_tp1(moe_models, arch):
    """Each expert (and the shared one) splits its rows over the ranks, the router is replicated."""
    assert generate(moe_models[arch], tensor_parallel_size=2) == reference(moe_models[arch])


def test_tp2_chunked_prefill_mixed_batches(models):
    """Small step budgets: prefill chunks and decodes share steps on both ranks alike."""
    long_prompts = PROMPTS + [" ".join(["tensor parallel"] * 30)]
    expected = reference(models["llama-kv2"], long_prompts, max_num_batched_tokens=16)
    assert generate(models["llama-kv2"], long_prompts, tensor_parallel_size=2, max_num_batched_tokens=16) == expected


def test_tp2_with_ngram_speculation_equals_tp1(models, tmp_path):
    """Proposed tokens travel in the step broadcast like any others; rank 0 verifies. The model has tied
    embeddings and larger weights, so its greedy output loops and the lookup finds proposals."""
    from frontend.offline.llm import LLM
    model = build_tiny_model(str(tmp_path / "loopy"), "llama", models["default"], num_kv_heads=2, num_heads=4,
                             tie_word_embeddings=True, initializer_range=0.11)
    prompts = PROMPTS + [" ".join(["tensor parallel"] * 30)]
    expected = reference(model, prompts)
    llm = LLM(model, tensor_parallel_size=2, speculative_config={"method": "ngram", "num_speculative_tokens": 3},
              **ENGINE)
    try:
        got = [(o.outputs[0].token_ids, o.outputs[0].text) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
        assert llm.client.get_stats().totals.spec_num_accepted_tokens > 0
    finally:
        llm.shutdown()
    assert got == expected


@pytest.mark.skipif(quant_exact_f32.load() is None, reason="no C compiler: quant_exact_f32.c is not built")
@pytest.mark.parametrize("cpu_tier", tier_params("own", "avx2"))
def test_tp2_keeps_each_ranks_shard_quantized(models, cpu_tier):
    """The default model's GGUF blocks sharded over two ranks (9 heads split 6/3, so rank 0's o_proj slice is
    384 inputs): each rank packs its shard, rank 0 holds about half the TP=1 bytes, and the float32 answers
    equal the dequantized TP=2 engine's to the bit."""
    from engine_core.worker.model_runner import weight_bytes
    from frontend.offline.llm import LLM

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    answers, sizes = {}, {}
    with forced_tier(cpu_tier):
        for tp, mode in ((2, "auto"), (2, "none"), (1, "auto")):
            llm = LLM(models["default"], tensor_parallel_size=tp, quantization=mode, multiprocess=False, **ENGINE)
            try:
                runner = llm.client.core.executor.runner
                assert runner.quantization == ("none" if mode == "none" else "120 layers q4_1, 1 layers q8_0")
                sizes[tp, mode] = weight_bytes(runner.model)
                answers[tp, mode] = [(o.outputs[0].token_ids, o.outputs[0].logprobs)
                                     for o in llm.generate(PROMPTS, params, use_tqdm=False)]
            finally:
                llm.shutdown()
    assert answers[2, "auto"] == answers[2, "none"]
    assert [ids for ids, _ in answers[2, "auto"]] == [ids for ids, _ in answers[1, "auto"]]
    assert sizes[1, "auto"] * 0.45 < sizes[2, "auto"] < sizes[1, "auto"] * 0.7


def test_two_nodes_on_loopback(models):
    """The core with --nnodes 2 and `nvllm worker --nnodes 2 --node-rank 1` as a second "node"."""
    model = models["qwen3-kv1"]
    expected = reference(model)
    port = free_port()
    node1 = subprocess.Popen(NVLLM + ["worker", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                                      "--master-port", str(port)], cwd=ROOT, env=ENV)
    try:
        got = generate(model, tensor_parallel_size=2, nnodes=2, node_rank=0, master_addr="127.0.0.1",
                       master_port=port)
        assert got == expected
        assert node1.wait(WAIT) == 0  # the core told its ranks to quit; the node exits cleanly
    finally:
        if node1.poll() is None:
            node1.kill()
            node1.wait()


# ---- faults -------------------------------------------------------------------------------------

def test_missing_rank_is_a_timeout_error(models, monkeypatch):
    """A second node that never comes: a clear error after NVLLM_TP_INIT_TIMEOUT, no hang."""
    from engine_core.proc.core import EngineCore

    monkeypatch.setenv("NVLLM_TP_INIT_TIMEOUT", "2")
    start = time.monotonic()
    args = EngineArgs(model=models["llama-kv1"], tensor_parallel_size=2, nnodes=2, master_port=free_port(), **ENGINE)
    with pytest.raises(TimeoutError, match=r"rank\(s\) \[1\] did not check in within 2 s.*nvllm worker"):
        EngineCore(args)
    assert time.monotonic() - start < WAIT  # the 2 s and a model load: a few seconds here


def test_worker_without_core_is_a_timeout_error():
    env = dict(ENV, NVLLM_TP_INIT_TIMEOUT="1")
    r = subprocess.run(NVLLM + ["worker", "--nnodes", "2", "--node-rank", "1", "--master-port", str(free_port())],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=WAIT)
    assert r.returncode == 1 and "no engine core answered" in r.stderr


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return kids


@pytest.mark.parametrize("when", ["mid-generation", "idle"])
def test_killed_worker_stops_the_core(models, capfd, monkeypatch, when):
    """SIGKILL rank 1: in-flight requests end with an error, the frontend sees the engine dead, and
    the core process exits non-zero within seconds, its log naming the rank."""
    from frontend.core_link.core_client import EngineDeadError
    from frontend.offline.llm import LLM

    # the core must notice the exit itself, not a silence: with this, silence would take 5 minutes
    monkeypatch.setenv(rdv.HEARTBEAT_TIMEOUT_ENV, "300")
    llm = LLM(models["default"], tensor_parallel_size=2, **ENGINE)
    try:
        core = llm.client.proc
        workers = _children(core.pid)
        assert len(workers) == 1
        result: dict = {}
        generating = None
        if when == "mid-generation":
            def run():
                try:
                    result["outputs"] = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=400,
                                                                             ignore_eos=True), use_tqdm=False)
                except Exception as e:
                    result["error"] = e
            generating = threading.Thread(target=run)
            generating.start()
            observer = LLM.connect(llm.client.address)  # another frontend: is the core running them yet?
            try:
                wait_until(lambda: observer.get_stats().gauges.num_running, WAIT, 0.05, what="the requests to run")
            finally:
                observer.shutdown()
            assert generating.is_alive(), "generation ended before the worker was killed"
        killed = time.monotonic()
        os.kill(workers[0], signal.SIGKILL)
        assert core.wait(WAIT) != 0
        assert time.monotonic() - killed < 60  # a second or two here; far less than the silence above
        if generating is not None:
            generating.join(WAIT)
            assert not generating.is_alive()
            # every request ended: the engine is dead, or each request finished with the core's error
            if "error" not in result:
                assert all(o.outputs[0].finish_reason == "abort" for o in result["outputs"])
            else:
                assert isinstance(result["error"], EngineDeadError)
        with pytest.raises(EngineDeadError):
            llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
        log = capfd.readouterr().err
        assert "tensor-parallel worker rank 1" in log and "SIGKILL" in log, log[-3000:]
    finally:
        llm.shutdown()


# ---- nvllm serve -tp 2 --------------------------------------------------------------------------

def test_serve_tp2_http(models, tmp_path):
    model = models["llama-kv2"]
    expected = reference(model)
    port = free_port()
    proc = Proc(["serve", model, "-tp", "2", "--host", "127.0.0.1", "--port", str(port),
                 "--dtype", "float32", "--kv-cache-memory", "64MiB", "--max-model-len", "512",
                 "--disable-uvicorn-access-log"], str(tmp_path / "serve.log"))
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, timeout=300)
        core = proc.children()
        workers = [w for c in core for w in _children(c)]
        assert len(core) == 1 and len(workers) == 1
        for prompt, (tokens, text) in zip(PROMPTS, expected):
            r = httpx.post(f"{base}/v1/completions", timeout=120, json={
                "prompt": prompt, "max_tokens": GREEDY.max_tokens, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == len(tokens)
            assert r.json()["choices"][0]["text"] == text
    finally:
        code = proc.stop(signal.SIGTERM)
    assert code == 0, proc.log()[-3000:]
    # gone with serve: well before a worker left behind would quit by itself, after the heartbeat silence
    wait_until(lambda: not any(pid_alive(p) for p in core + workers), rdv.heartbeat_timeout() / 2,
               what="no tensor-parallel process to outlive nvllm serve")


def test_tp2_constrained_decoding_equals_tp1(models):
    """Rank 0 samples in the core process, where the grammars live: masks need no trip to the workers."""
    import re

    from common.structured_outputs import StructuredOutputsParams
    from frontend.offline.llm import LLM
    params = [SamplingParams(temperature=0, max_tokens=12, structured_outputs=StructuredOutputsParams(
                  regex="[a-f]{3}-[0-9]{2,4}")),
              SamplingParams(temperature=0, max_tokens=12),
              SamplingParams(temperature=0, max_tokens=12, structured_outputs=StructuredOutputsParams(
                  choice=["north", "south"]))]
    results = []
    for tp in (1, 2):
        llm = LLM(models["llama-kv2"], tensor_parallel_size=tp, **ENGINE)
        try:
            results.append([o.outputs[0].token_ids for o in llm.generate(PROMPTS[:3], params, use_tqdm=False)])
            texts = [llm.tokenizer.decode(ids) for ids in results[-1]]
        finally:
            llm.shutdown()
        assert re.fullmatch("[a-f]{3}-[0-9]{2,4}", texts[0]) and texts[2] in ("north", "south")
    assert results[0] == results[1]


def test_tp2_prompt_logprobs_equal_tp1(models):
    """The scored rows go through the vocabulary-parallel head on both ranks, a slice at a time, in chunks."""
    from frontend.offline.llm import LLM

    prompt = " ".join(["prompt logprobs under tensor parallelism"] * 12)
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2)
    scored = {}
    for tp in (1, 2):
        llm = LLM(models["llama-kv2"], tensor_parallel_size=tp, max_num_batched_tokens=16, **ENGINE)
        try:
            (out,) = llm.generate([prompt], params, use_tqdm=False)
        finally:
            llm.shutdown()
        scored[tp] = [e and {t: (lp.logprob,) for t, lp in e.items()} for e in out.prompt_logprobs]
    assert scored[1][0] is None and len(scored[1]) > 16
    assert len(scored[2]) == len(scored[1])
    for one, two in zip(scored[1][1:], scored[2][1:]):
        assert one.keys() == two.keys()  # the prompt token and the top 2
        for t in one:
            assert two[t][0] == pytest.approx(one[t][0], abs=1e-5)


def test_tp2_beam_search_equals_tp1(models):
    """Forked beams' copies of their parents' partial blocks run on every rank (each on its own KV heads)."""
    from common.beam_search_params import BeamSearchParams
    from frontend.offline.llm import LLM

    params = BeamSearchParams(beam_width=4, max_tokens=20, length_penalty=0.5)
    beams = {}
    for tp in (1, 2):
        llm = LLM(models["llama-kv2"], tensor_parallel_size=tp, **ENGINE)
        try:
            beams[tp] = [[(s.output_token_ids, s.score) for s in out.sequences]
                         for out in llm.beam_search(PROMPTS[:2], params)]
        finally:
            llm.shutdown()
    assert [[tokens for tokens, _ in b] for b in beams[2]] == [[tokens for tokens, _ in b] for b in beams[1]]
    for two, one in zip(beams[2], beams[1]):
        assert [score for _, score in two] == pytest.approx([score for _, score in one], abs=1e-5)


@pytest.mark.parametrize("name", ["llama-kv2", "qwen3-kv1"])
def test_tp2_lora_equals_tp1(models, name, tmp_path):
    """LoRA adapters shard with their layers (q/k/v: each rank's heads of B; o/down: its columns of A, the shrink
    all-reduced, B added once): two adapters and the base model in one batch give TP=1's tokens and logprobs."""
    import transformers

    from common.lora import LoRARequest
    from frontend.offline.llm import LLM
    from tests.support.lora_adapters import make_adapter

    base = transformers.AutoModelForCausalLM.from_pretrained(models[name], dtype=torch.float32).eval()
    every = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    loras = [LoRARequest("a", 1, make_adapter(base, str(tmp_path / "a"), seed=1, targets=every)),
             LoRARequest("b", 2, make_adapter(base, str(tmp_path / "b"), seed=2, r=4, targets=["v_proj", "o_proj"])),
             None]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    results = {}
    for tp in (1, 2):
        llm = LLM(models[name], tensor_parallel_size=tp, enable_lora=True, max_loras=2, **ENGINE)
        try:
            outs = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=loras)
        finally:
            llm.shutdown()
        results[tp] = [(o.outputs[0].token_ids, [e[t].logprob for e, t in zip(o.outputs[0].logprobs,
                                                                               o.outputs[0].token_ids)])
                       for o in outs]
    assert len({tuple(tokens) for tokens, _ in results[1]}) == 3  # each adapter (and the base) answers its own way
    for (tokens1, logprobs1), (tokens2, logprobs2) in zip(results[1], results[2]):
        assert tokens2 == tokens1
        assert logprobs2 == pytest.approx(logprobs1, abs=1e-5)
