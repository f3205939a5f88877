"""The GPU fast path: CUDA graphs for decode steps, KV cache sizing by profiling, the flash-attn backend,
sync-free sampling.

The first part runs anywhere: the pure pieces (graph batch sizes, input padding, the profiling step),
the graph runner's buffers and padding driven on CPU with graphs replaced by eager calls, the
flash-attn fallback rules. The second part needs CUDA and skips without it: greedy tokens of the
triton backend with and without CUDA graphs against the torch backend on a Qwen3-0.6B-shaped random
model, graph replay against eager logits, KV cache sizing from gpu_memory_utilization, capture logs,
flash-attn against the reference, and no host syncs in the decode step and the sampler.
"""

import dataclasses
import logging
import os
import random
import re
import subprocess
import sys

import msgspec
import pytest
import torch

from common.config import EngineArgs
from common.sampling_params import SamplingParams
from engine_core.attention.backend import AttentionBackend
from engine_core.attention.torch_backend import write_kv_cache
from tests.support.attention_reference import reference_paged_attention
from tests.support.paths import ROOT
from engine_core.worker.cuda_graph import (DecodeGraphRunner, graph_batch_sizes, is_decode_only, pad_decode_inputs,
                                           pick_batch_size)
from engine_core.worker.model_runner import ModelRunner, dummy_step, profile_lengths
from engine_core.sched.request import Request
from engine_core.sample.sampler import Sampler
from engine_core.worker.step_input import StepInput

pytestmark = pytest.mark.integration

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


# ---- steps built by hand --------------------------------------------------------------------------

class Seq:
    def __init__(self, tokens: list[int], blocks: list[int]):
        self.tokens = tokens
        self.blocks = blocks


def make_seqs(lens: list[int], block_size: int, room: int, seed: int = 0) -> tuple[list[Seq], int]:
    """Sequences of random tokens with blocks for len + room tokens, drawn from a shuffled pool (so tables
    are not contiguous); and the number of blocks in the pool."""
    rng = random.Random(seed)
    need = [-(-(n + room) // block_size) for n in lens]
    num_blocks = sum(need) + 2
    pool = list(range(num_blocks))
    rng.shuffle(pool)
    seqs = [Seq([rng.randrange(3, 20000) for _ in range(n)], [pool.pop() for _ in range(k)]) for n, k in zip(lens, need)]
    return seqs, num_blocks


def step_for(seqs: list[Seq], new: list[int], block_size: int) -> StepInput:
    """The step that computes the last new[i] tokens of each sequence (decodes must come first)."""
    ids, pos, slots, starts, lens, tables, rows = [], [], [], [0], [], [], []
    for s, k in zip(seqs, new):
        n = len(s.tokens)
        ids += s.tokens[n - k:]
        pos += range(n - k, n)
        slots += [s.blocks[p // block_size] * block_size + p % block_size for p in range(n - k, n)]
        starts.append(starts[-1] + k)
        lens.append(n)
        tables.append(list(s.blocks))
        rows.append(starts[-1] - 1)
    num_decodes = next((i for i, k in enumerate(new) if k != 1), len(new))
    return StepInput(ids, pos, slots, starts, lens, tables, num_decodes, rows)


def grow(seqs: list[Seq], logits: torch.Tensor) -> None:
    for s, t in zip(seqs, logits.argmax(-1).tolist()):
        s.tokens.append(t)


# ---- pure pieces ----------------------------------------------------------------------------------

def test_graph_batch_sizes():
    assert graph_batch_sizes(256) == [1, 2, 4, 8] + list(range(16, 257, 8))
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(5) == [1, 2, 4, 5]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes(2000)[-1] == 512  # larger decode batches stay eager
    sizes = graph_batch_sizes(100)
    assert [pick_batch_size(sizes, n) for n in (1, 3, 8, 9, 17, 96, 97, 100)] == [1, 4, 8, 16, 24, 96, 100, 100]
    assert pick_batch_size(sizes, 101) is None


def test_pad_decode_inputs_and_decode_only():
    seqs, _ = make_seqs([5, 17, 33], 16, 1)
    step = step_for(seqs, [1, 1, 1], 16)
    assert is_decode_only(step)
    rows, tables = pad_decode_inputs(step, 8)
    assert rows.shape == (4, 8) and rows.dtype == torch.int64
    assert rows[0].tolist() == step.input_ids + [0] * 5
    assert rows[1].tolist() == step.positions + [0] * 5
    assert rows[2].tolist() == step.slot_mapping + [-1] * 5  # padding rows store nothing
    assert rows[3].tolist() == step.seq_lens + [1] * 5  # and attend over one key
    assert tables.dtype == torch.int32 and tables.shape == (3, 3)
    assert tables[0].tolist() == seqs[0].blocks + [0, 0]
    assert not is_decode_only(step_for(seqs, [1, 4, 1], 16))  # a prefill chunk
    with pytest.raises(AssertionError):
        pad_decode_inputs(step, 2)


def test_profile_step_shape():
    lens = profile_lengths(2048, 256, 40960)
    assert sum(lens) == 2048 and len(lens) == 256 and lens[:-1] == [1] * 255 and lens[-1] == 2048 - 255
    lens = profile_lengths(2048, 4, 500)  # chunks no longer than max_model_len
    assert sum(lens) == 2048 and max(lens) <= 500 and lens[:3] == [1, 1, 1]
    assert profile_lengths(8, 256, 100) == [1] * 8
    step, num_blocks = dummy_step([1, 1, 40], 16)
    assert num_blocks == 1 + 1 + 3 and step.num_decodes == 2
    assert step.slot_mapping == [0, 16] + list(range(32, 72))
    assert step.sample_rows == [0, 1, 41] and step.seq_lens == [1, 1, 40]


# ---- the runner on CPU ----------------------------------------------------------------------------

class DeviceOnlyReference(AttentionBackend):
    """Reads nothing but the metadata's device tensors, as a graph-capturable backend must; skips
    slots < 0 as the triton store kernel does. Records each call's metadata."""
    name = "device_only_reference"

    def __init__(self):
        self.seen = []

    def forward(self, q, k, v, k_cache, v_cache, meta, scale, window=None, softcap=None):
        assert softcap is None, "the runner tests' tiny models do not cap scores"
        self.seen.append(meta)
        keep = meta.slot_mapping >= 0
        write_kv_cache(k[keep], v[keep], k_cache, v_cache, meta.slot_mapping[keep])
        return reference_paged_attention(q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens,
                                         meta.block_tables, scale, window)


class EagerReplay:
    """Stands in for a captured graph on CPU: runs the same forward on the same static buffers."""

    def __init__(self, runner: DecodeGraphRunner, batch: int):
        self.runner, self.batch = runner, batch

    def replay(self):
        self.runner._forward(self.batch)


def cpu_runner(model_dir, **kw):
    from engine_core.engine_config import resolve_engine_config
    args = EngineArgs(model=model_dir, dtype="float32", device="cpu", block_size=8, max_num_seqs=20,
                      max_model_len=128, max_num_batched_tokens=256, **kw)
    return ModelRunner(resolve_engine_config(args))


def test_graph_runner_padding_matches_eager_on_cpu(tiny_models):
    runner = cpu_runner(tiny_models["qwen3"])
    block_size = 8
    seqs, num_blocks = make_seqs([9, 30, 3, 16, 25, 7, 12, 40, 1, 19, 5], block_size, room=6, seed=1)
    runner.allocate_kv_cache(num_blocks)
    assert runner.graph_runner is None  # never on CPU
    grow(seqs, runner.forward(step_for(seqs, [len(s.tokens) for s in seqs], block_size)))

    backend = runner.backend = DeviceOnlyReference()  # the eager steps use it too: same attention both ways
    runner.model.cpu_decoder = None  # the C loop would call its own attention kernel, not this backend
    graphs = DecodeGraphRunner(runner.model, backend, runner.hidden_size, torch.float32, runner.device,
                               max_num_seqs=20, max_blocks_per_seq=-(-128 // block_size), block_size=block_size)
    graphs.graphs = {b: EagerReplay(graphs, b) for b in graphs.sizes}
    caches = [a.k_cache for a in runner.attn_layers] + [a.v_cache for a in runner.attn_layers]
    # 11 decodes (batch 16), then 3 (batch 4, stale rows behind them), then 11 again, then 2 from the middle
    for batch in (seqs, seqs[:3], seqs, seqs[4:6]):
        step = step_for(batch, [1] * len(batch), block_size)
        runner.graph_runner = None
        eager = runner.forward(step)  # writes this step's k/v
        before = [c.clone() for c in caches]
        runner.graph_runner = graphs
        assert graphs.can_run(step)
        backend.seen.clear()
        replayed = runner.forward(step)  # writes the same k/v again; padding rows write nothing
        torch.testing.assert_close(replayed, eager, atol=1e-4, rtol=1e-4)
        written = torch.zeros(caches[0].shape[0] * block_size, dtype=torch.bool)
        written[step.slot_mapping] = True
        for b, c in zip(before, caches):
            flat_b, flat_c = b.view(-1, *b.shape[2:]), c.view(-1, *c.shape[2:])
            assert torch.equal(flat_b[~written], flat_c[~written])
            torch.testing.assert_close(flat_b[written], flat_c[written], atol=1e-4, rtol=1e-4)
        meta = backend.seen[0]
        n, b = len(batch), pick_batch_size(graphs.sizes, len(batch))
        assert meta.num_decodes == b and meta.slot_mapping[n:].eq(-1).all() and meta.seq_lens[n:].eq(1).all()
        grow(batch, eager)
    # steps the graphs do not take: a prefill chunk, more decodes than the largest batch
    assert not graphs.can_run(step_for(seqs[:2], [1, 2], block_size))
    many, _ = make_seqs([3] * 21, block_size, room=1)
    assert not graphs.can_run(step_for(many, [1] * 21, block_size))


def _triton_runs_here() -> bool:
    """On CPU the Triton kernels run only in the interpreter, and only in a process that set
    TRITON_INTERPRET=1 before triton was first imported (see test_triton_kernels.py)."""
    if CUDA:
        return True
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    if "triton" not in sys.modules:
        return True
    from engine_core.attention import triton_kernels
    return triton_kernels._INTERPRETED


def test_triton_backend_through_graph_buffers(tiny_models):
    """The triton backend fed from the graph runner's padded static buffers (graphs replaced by eager
    calls, so it runs on CPU in the interpreter): logits equal the torch backend's eager ones, for
    batches that are padded, shrink behind stale rows, and grow again."""
    pytest.importorskip("triton")
    if not _triton_runs_here():
        proc = subprocess.run([sys.executable, "-m", "pytest", f"{os.path.abspath(__file__)}::{sys._getframe().f_code.co_name}",
                               "-q", "-x", "-p", "no:cacheprovider"], cwd=ROOT,
                              env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=600)
        output = proc.stdout[-6000:] + proc.stderr[-3000:]
        assert proc.returncode == 0, output
        # exit code 0 also means "skipped": the one test must have run and passed there
        assert re.search(r"\b1 passed\b", proc.stdout) and "skipped" not in proc.stdout, output
        return
    from engine_core.attention.triton_backend import TritonAttentionBackend

    runner = cpu_runner(tiny_models["qwen3"])
    block_size = 8
    seqs, num_blocks = make_seqs([9, 30, 3, 16, 25, 7, 12, 40, 1, 19, 5], block_size, room=6, seed=2)
    runner.allocate_kv_cache(num_blocks)
    grow(seqs, runner.forward(step_for(seqs, [len(s.tokens) for s in seqs], block_size)))
    graphs = DecodeGraphRunner(runner.model, TritonAttentionBackend(), runner.hidden_size, torch.float32,
                               runner.device, max_num_seqs=20, max_blocks_per_seq=16, block_size=block_size)
    graphs.graphs = {b: EagerReplay(graphs, b) for b in graphs.sizes}
    for batch in (seqs, seqs[:3], seqs, seqs[4:6]):
        step = step_for(batch, [1] * len(batch), block_size)
        runner.graph_runner = None
        eager = runner.forward(step)  # torch backend
        runner.graph_runner = graphs
        torch.testing.assert_close(runner.forward(step), eager, atol=1e-4, rtol=1e-4)
        grow(batch, eager)


def test_profile_run_on_cpu_restores_the_cache(tiny_models):
    runner = cpu_runner(tiny_models["qwen3"])
    runner.allocate_kv_cache(10)
    k_before = runner.attn_layers[0].k_cache
    state = runner.sampler.generator.get_state()
    assert runner.profile_run() == 0  # no device memory to measure on CPU; the step ran
    assert runner.attn_layers[0].k_cache is k_before
    assert torch.equal(runner.sampler.generator.get_state(), state)


def test_flash_attn_rules_and_fallback(tiny_models, monkeypatch, caplog):
    from engine_core.attention.flash_attn_backend import FlashAttnBackend, unsupported_reason
    from engine_core.attention.triton_backend import TritonAttentionBackend

    assert unsupported_reason(256, torch.bfloat16, 128) is None
    assert unsupported_reason(512, torch.float16, 64) is None
    assert "--block-size is 16" in unsupported_reason(16, torch.bfloat16, 128)
    assert "--dtype is float32" in unsupported_reason(256, torch.float32, 128)
    assert "head dim" in unsupported_reason(256, torch.bfloat16, 100)

    # as if flash_attn were installed and this CPU were a GPU (triton itself is not loaded here): auto falls back
    # to triton with a warning; asking for it fails
    monkeypatch.setattr(FlashAttnBackend, "missing", classmethod(lambda cls: None))
    for backend in (FlashAttnBackend, TritonAttentionBackend):
        monkeypatch.setattr(backend, "capabilities", dataclasses.replace(
            backend.capabilities, devices=backend.capabilities.devices | {"cpu"}))
    monkeypatch.setattr(TritonAttentionBackend, "__init__", lambda self: None)
    caplog.set_level(logging.WARNING, logger="nvllm")
    assert cpu_runner(tiny_models["qwen3"], attention_backend="auto").backend.name == "triton"
    assert "--block-size is 8" in caplog.text and "using the triton backend" in caplog.text
    with pytest.raises(ValueError, match="--block-size is 8"):
        cpu_runner(tiny_models["qwen3"], attention_backend="flash_attn")


def test_sampler_batch_invariant_with_every_option():
    """A seeded or greedy row samples the same token whatever shares its batch (CPU here; the same code
    runs on the GPU, where the parameters go up in one asynchronous copy)."""
    rng = random.Random(3)
    vocab = 500

    def req(i, **kw):
        r = Request(f"r{i}", [rng.randrange(vocab) for _ in range(6)], SamplingParams(**kw), eos_token_ids=[2])
        for _ in range(3):
            r.append_output_token(rng.randrange(vocab))
        return r

    target = req(0, temperature=0.9, top_k=40, top_p=0.8, min_p=0.02, seed=11, repetition_penalty=1.3,
                 frequency_penalty=0.5, presence_penalty=0.2, min_tokens=10, logprobs=3)
    others = [req(i, temperature=rng.choice([0, 0.7, 1.2]), top_p=rng.choice([1.0, 0.5]), logprobs=rng.choice([None, 2]))
              for i in range(1, 9)]
    logits = torch.randn(9, vocab, generator=torch.Generator().manual_seed(0)) * 4
    alone = Sampler(torch.device("cpu"), 0)(logits[4:5], [target])
    batch = Sampler(torch.device("cpu"), 5)(logits, others[:4] + [target] + others[4:])
    assert batch[0][4] == alone[0][0] and batch[1][4] == alone[1][0]
    assert alone[1][0].rank >= 1 and len(alone[1][0].top_token_ids) == 3


# ---- on a GPU -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen3_shaped(tmp_path_factory):
    """Qwen3-0.6B's shape (vocab 151936, hidden 1024, 16 heads / 8 KV heads of 128, intermediate 3072),
    4 layers instead of 28; weights drawn wider than transformers' default (std 0.1) so that greedy
    choices are not near-ties that rounding could flip."""
    if not CUDA:
        pytest.skip("needs a CUDA GPU")
    from benchmarks.torch_side.random_model import random_model_folder
    return random_model_folder("qwen3-0.6b", root=str(tmp_path_factory.mktemp("qwen3")), num_hidden_layers=4,
                               initializer_range=0.1)


def _prompts(n, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, 10000) for _ in range(rng.randint(3, 300))] for _ in range(n)]


def _generate(model, prompts, **engine):
    from frontend.offline.llm import LLM
    llm = LLM(model, dtype=engine.pop("dtype", "float32"), max_model_len=1024, max_num_seqs=32,
              gpu_memory_utilization=0.5, **engine)
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs]
    finally:
        llm.shutdown()


@needs_cuda
def test_triton_with_and_without_graphs_matches_torch_greedy(qwen3_shaped):
    pytest.importorskip("triton")
    prompts = _prompts(40)  # 40 > max_num_seqs: decode batches of many sizes, padded and not
    reference = _generate(qwen3_shaped, prompts, attention_backend="torch", enforce_eager=True)
    assert _generate(qwen3_shaped, prompts, attention_backend="triton", enforce_eager=True) == reference
    assert _generate(qwen3_shaped, prompts, attention_backend="triton", enforce_eager=False) == reference


def _cuda_runner(model_dir, dtype, backend="triton", enforce_eager=False, **kw):
    from engine_core.engine_config import resolve_engine_config
    args = EngineArgs(model=model_dir, dtype=str(dtype).removeprefix("torch."), device="cuda", max_num_seqs=32,
                      max_model_len=1024, attention_backend=backend, enforce_eager=enforce_eager, **kw)
    return ModelRunner(resolve_engine_config(args))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_graph_replay_matches_eager_logits(qwen3_shaped, dtype, caplog):
    pytest.importorskip("triton")
    caplog.set_level(logging.INFO, logger="nvllm")
    runner = _cuda_runner(qwen3_shaped, dtype)
    seqs, num_blocks = make_seqs([random.Random(i).randint(1, 200) for i in range(19)], 16, room=8, seed=5)
    runner.allocate_kv_cache(num_blocks)
    assert runner.graph_runner is not None and "CUDA graphs: captured 7 decode batch sizes" in caplog.text
    grow(seqs, runner.forward(step_for(seqs, [len(s.tokens) for s in seqs], 16)))
    tol = dict(atol=1e-3, rtol=1e-3) if dtype == torch.float32 else dict(atol=6e-2, rtol=6e-2)
    for batch in (seqs, seqs[:1], seqs[2:7], seqs):
        step = step_for(batch, [1] * len(batch), 16)
        assert runner.graph_runner.can_run(step)
        replayed = runner.forward(step).clone()
        graphs, runner.graph_runner = runner.graph_runner, None
        eager = runner.forward(step)
        runner.graph_runner = graphs
        torch.testing.assert_close(replayed.float(), eager.float(), **tol)
        grow(batch, eager)


@needs_cuda
def test_no_host_sync_in_graph_decode_and_sampler(qwen3_shaped):
    pytest.importorskip("triton")
    runner = _cuda_runner(qwen3_shaped, torch.bfloat16)
    seqs, num_blocks = make_seqs([50, 70, 90], 16, room=4)
    runner.allocate_kv_cache(num_blocks)
    grow(seqs, runner.forward(step_for(seqs, [len(s.tokens) for s in seqs], 16)))
    step = step_for(seqs, [1, 1, 1], 16)
    reqs = [Request(f"r{i}", s.tokens[:-1], SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.01,
                                                          seed=i if i else None, repetition_penalty=1.2,
                                                          frequency_penalty=0.3, presence_penalty=0.1, min_tokens=5),
                    eos_token_ids=[2]) for i, s in enumerate(seqs)]
    for r in reqs:
        r.append_output_token(7)
    runner.forward(step)  # warm up the pinned-memory pool and the kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        logits = runner.forward(step)
        tokens = runner.sampler._draw(runner.sampler.apply_penalties(logits.float(), reqs), reqs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(tokens.tolist()) == 3  # the one sync


@needs_cuda
def test_sampler_on_gpu_matches_cpu_for_greedy_with_penalties():
    rng = random.Random(1)
    vocab = 1000
    reqs = []
    for i in range(6):
        r = Request(f"r{i}", [rng.randrange(vocab) for _ in range(20)],
                    SamplingParams(temperature=0, repetition_penalty=1.5, frequency_penalty=0.7, presence_penalty=0.4,
                                   min_tokens=3, stop_token_ids=[5, 6], logprobs=4), eos_token_ids=[2])
        r.append_output_token(rng.randrange(vocab))
        reqs.append(r)
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(2)) * 3
    cpu = Sampler(torch.device("cpu"), 0)(logits, reqs)
    gpu = Sampler(torch.device("cuda"), 0)(logits.cuda(), reqs)
    assert gpu[0] == cpu[0]
    for a, b in zip(gpu[1], cpu[1]):
        assert a.token_id == b.token_id and a.rank == b.rank and a.top_token_ids == b.top_token_ids
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)


@needs_cuda
def test_kv_cache_sized_from_gpu_memory_utilization(qwen3_shaped):
    pytest.importorskip("triton")
    runner = _cuda_runner(qwen3_shaped, torch.bfloat16, gpu_memory_utilization=0.3, max_num_batched_tokens=4096)
    total = torch.cuda.mem_get_info()[1]
    low = runner.kv_cache_budget()
    assert runner.activation_peak > 0  # the profiling step ran and measured something
    # the runner reads the fraction from its EngineConfig (frozen): give it one with another fraction
    runner.config = msgspec.structs.replace(runner.config, gpu_memory_utilization=0.5)
    high = runner.kv_cache_budget()  # the profile is kept: only the fraction differs
    assert abs((high - low) - 0.2 * total) < 0.01 * total
    assert 0 < low < 0.3 * total
    # the engine then stays within its share while it runs its largest steps (graphs take from the headroom)
    runner.config = msgspec.structs.replace(runner.config, gpu_memory_utilization=0.3)
    num_blocks = low // runner.kv_bytes_per_block()
    runner.allocate_kv_cache(num_blocks)
    seqs, _ = make_seqs([1000, 1000, 1000, 1000], 16, room=1)
    pool = list(range(num_blocks))
    for s in seqs:
        s.blocks = [pool.pop() for _ in s.blocks]
    runner.forward(step_for(seqs, [1000] * 4, 16))
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    assert total - free < 0.3 * total + 1.5 * 2**30


@needs_cuda
def test_engine_logs_capture_and_enforce_eager_skips_it(qwen3_shaped, caplog):
    pytest.importorskip("triton")
    from frontend.offline.llm import LLM
    caplog.set_level(logging.INFO, logger="nvllm")
    for eager in (False, True):
        caplog.clear()
        llm = LLM(qwen3_shaped, multiprocess=False, attention_backend="triton", enforce_eager=eager,
                  max_model_len=512, max_num_seqs=16, gpu_memory_utilization=0.4)
        try:
            assert (llm.client.core.executor.runner.graph_runner is None) == eager
            assert ("CUDA graphs: captured" in caplog.text) != eager
            assert "GPU memory:" in caplog.text and "profiled a step of 2048 tokens" in caplog.text
            out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                               use_tqdm=False)
            assert len(out[0].outputs[0].token_ids) == 8
        finally:
            llm.shutdown()
            del llm
            torch.cuda.empty_cache()


flash_attn_present = pytest.mark.skipif(
    not CUDA or __import__("importlib").util.find_spec("flash_attn") is None, reason="needs CUDA and flash-attn")


@flash_attn_present
@pytest.mark.parametrize("window, softcap", [(None, None), (100, None), (100, 2.0)])  # 100: flash-attn's (99, 0)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_attn_backend_matches_reference(dtype, window, softcap):
    """softcap 2.0: Gemma 2's score cap, binding on these scores (flash-attn's softcap argument)."""
    from engine_core.attention.flash_attn_backend import FlashAttnBackend
    from engine_core.attention.metadata import AttentionMetadata

    block_size, num_kv_heads, group, head_dim = 256, 8, 2, 128
    # decodes first, then a fresh prefill and a chunk after a cached prefix
    seqs = [(300, 1), (1, 1), (700, 1), (200, 200), (900, 150)]
    gen = torch.Generator().manual_seed(0)
    need = [-(-s // block_size) for s, _ in seqs]
    num_blocks = sum(need) + 2
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(seqs), max(need), dtype=torch.int32)
    slots, starts = [], [0]
    for i, (s, q) in enumerate(seqs):
        tables[i, : need[i]] = torch.tensor([pool.pop() for _ in range(need[i])], dtype=torch.int32)
        slots += [int(tables[i, p // block_size]) * block_size + p % block_size for p in range(s - q, s)]
        starts.append(starts[-1] + q)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    full_k = torch.randn(shape, generator=gen).to(dtype).cuda()
    full_v = torch.randn(shape, generator=gen).to(dtype).cuda()
    slots_t = torch.tensor(slots, device="cuda")
    new_k = full_k.view(-1, num_kv_heads, head_dim)[slots_t].clone()
    new_v = full_v.view(-1, num_kv_heads, head_dim)[slots_t].clone()
    kc, vc = full_k.clone(), full_v.clone()
    kc.view(-1, num_kv_heads, head_dim)[slots_t] = 0
    vc.view(-1, num_kv_heads, head_dim)[slots_t] = 0
    q = torch.randn(starts[-1], num_kv_heads * group, head_dim, generator=gen).to(dtype).cuda()
    lens = [s for s, _ in seqs]
    meta = AttentionMetadata(
        slot_mapping=slots_t, query_start_loc=torch.tensor(starts, dtype=torch.int32, device="cuda"),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device="cuda"), block_tables=tables.cuda(),
        max_query_len=200, max_seq_len=900, num_decodes=3, query_start_loc_cpu=starts, seq_lens_cpu=lens)
    out = FlashAttnBackend().forward(q, new_k, new_v, kc, vc, meta, head_dim ** -0.5, window, softcap)
    assert torch.equal(kc, full_k) and torch.equal(vc, full_v)
    ref = reference_paged_attention(q.float(), full_k.float(), full_v.float(), starts, lens, tables, head_dim ** -0.5,
                                    window, softcap)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@flash_attn_present
def test_flash_attn_needs_blocks_of_256(qwen3_shaped, caplog):
    """EngineArgs allows blocks up to 128, so flash-attn's paged kernels cannot be used through the
    engine yet: asking for it says why; auto takes triton."""
    with pytest.raises(ValueError, match="--block-size is 16"):
        _cuda_runner(qwen3_shaped, torch.bfloat16, backend="flash_attn", enforce_eager=True)
    caplog.set_level(logging.WARNING, logger="nvllm")
    assert _cuda_runner(qwen3_shaped, torch.bfloat16, backend="auto", enforce_eager=True).backend.name == "triton"
    assert "using the triton backend" in caplog.text
