"""The attention selector: which backend serves which device, dtype, block size and head shape, by the
backends' declared capabilities; the warnings of auto and the errors of a backend asked for by name.
No GPU needed: selection reads declarations only (flash-attn's presence is switched by monkeypatch)."""

import logging

import pytest
import torch

from engine_core.cpu_kernels.attention import paged_avx512_bf16
from engine_core.attention.capabilities import AttentionSetup
from engine_core.attention.cpu_generic_backend import CpuGenericAttentionBackend
from engine_core.attention.cpu_kernel_backend import CpuKernelAttentionBackend
from engine_core.attention.flash_attn_backend import FlashAttnBackend
from engine_core.attention.selector import auto_backend, named_backend, select_attention_backend
from engine_core.attention.torch_backend import TorchAttentionBackend
from engine_core.attention.triton_backend import TritonAttentionBackend
from engine_core.platform.batch_invariance import set_batch_invariant

pytestmark = pytest.mark.unit

SMOLLM2 = dict(num_heads=9, num_kv_heads=3, head_dim=64)


def setup(device="cpu", dtype=torch.bfloat16, block_size=16, **shape) -> AttentionSetup:
    return AttentionSetup(device, dtype, block_size, **{**SMOLLM2, **shape})


@pytest.fixture
def kernels_built(monkeypatch):
    """As on a CPU where paged_avx512_bf16.c builds, whatever this machine is."""
    monkeypatch.setattr(CpuKernelAttentionBackend, "missing", classmethod(lambda cls: None))


@pytest.fixture
def generic_built(monkeypatch):
    """As on a CPU where paged_fixed_order.c builds, whatever this machine is."""
    monkeypatch.setattr(CpuGenericAttentionBackend, "missing", classmethod(lambda cls: None))


@pytest.fixture
def flash_installed(monkeypatch):
    monkeypatch.setattr(FlashAttnBackend, "missing", classmethod(lambda cls: None))


@pytest.fixture
def flash_absent(monkeypatch):
    monkeypatch.setattr(FlashAttnBackend, "missing", classmethod(
        lambda cls: "attention_backend flash_attn needs the flash-attn package: pip install 'nvllm[cuda]'"))


@pytest.mark.parametrize("option", ["auto", "torch"])
def test_bf16_cpu_takes_the_c_kernels(kernels_built, option):
    backend = select_attention_backend(option, setup())
    assert isinstance(backend, CpuKernelAttentionBackend) and backend.name == "cpu_kernel"
    assert backend.capabilities.fused_cpu_decoder and not backend.capabilities.cuda_graphs


@pytest.mark.parametrize("changed", [dict(dtype=torch.float32), dict(dtype=torch.float16), dict(head_dim=48),
                                     dict(head_dim=288), dict(num_heads=16, num_kv_heads=1)])
@pytest.mark.parametrize("option", ["auto", "torch"])
def test_cpu_setups_the_kernels_do_not_take_use_torch(not_invariant, kernels_built, option, changed, caplog):
    caplog.set_level(logging.WARNING, logger="nvllm")
    backend = select_attention_backend(option, setup(**changed))
    assert type(backend) is TorchAttentionBackend and backend.name == "torch"
    assert not backend.capabilities.fused_cpu_decoder
    assert not caplog.records  # a faster variant of the same option passed over: nothing to say


@pytest.mark.parametrize("changed", [dict(dtype=torch.float32), dict(head_dim=16), dict(head_dim=48),
                                     dict(head_dim=288), dict(num_heads=16, num_kv_heads=1)])
@pytest.mark.parametrize("option", ["auto", "torch"])
def test_batch_invariant_cpu_setups_the_kernels_do_not_take_use_the_generic_kernel(kernels_built, generic_built,
                                                                                   option, changed, caplog):
    caplog.set_level(logging.WARNING, logger="nvllm")
    backend = select_attention_backend(option, setup(**changed))
    assert type(backend) is CpuGenericAttentionBackend and backend.name == "cpu_generic"
    # the float32 C loop (loop_portable.c) calls this kernel; the bf16 loop declines the shapes it does not take
    assert backend.capabilities.fused_cpu_decoder and not backend.capabilities.cuda_graphs
    assert not caplog.records


def test_the_generic_kernel_serves_float32_and_bf16_only(kernels_built, generic_built):
    assert type(select_attention_backend("auto", setup(dtype=torch.float16))) is TorchAttentionBackend


def test_cpu_without_the_kernels_uses_torch(not_invariant, monkeypatch):
    monkeypatch.setattr(CpuKernelAttentionBackend, "missing", classmethod(lambda cls: "not built"))
    assert type(select_attention_backend("torch", setup())) is TorchAttentionBackend
    assert type(select_attention_backend("auto", setup())) is TorchAttentionBackend


def test_batch_invariant_cpu_without_the_bf16_kernels_uses_the_generic_kernel(generic_built, monkeypatch):
    monkeypatch.setattr(CpuKernelAttentionBackend, "missing", classmethod(lambda cls: "not built"))
    assert type(select_attention_backend("torch", setup())) is CpuGenericAttentionBackend
    assert type(select_attention_backend("auto", setup())) is CpuGenericAttentionBackend
    monkeypatch.setattr(CpuGenericAttentionBackend, "missing", classmethod(lambda cls: "not built"))
    assert type(select_attention_backend("auto", setup())) is TorchAttentionBackend


def test_auto_on_cuda(flash_installed, kernels_built, caplog):
    caplog.set_level(logging.WARNING, logger="nvllm")
    assert auto_backend(setup("cuda", block_size=256), warn=True) is FlashAttnBackend
    assert auto_backend(setup("cuda", torch.float16, block_size=512), warn=True) is FlashAttnBackend
    assert not caplog.records
    assert auto_backend(setup("cuda", block_size=16), warn=True) is TritonAttentionBackend
    assert caplog.messages == ["attention: flash-attn 2 reads a paged KV cache only in blocks of a multiple of 256 "
                               "tokens, and --block-size is 16; using the triton backend"]
    caplog.clear()
    assert auto_backend(setup("cuda", torch.float32, block_size=256), warn=True) is TritonAttentionBackend
    assert caplog.messages == ["attention: flash-attn runs in float16 or bfloat16 only, and --dtype is float32; "
                               "using the triton backend"]
    caplog.clear()
    assert auto_backend(setup("cuda", block_size=16), warn=False) is TritonAttentionBackend  # other TP ranks
    assert not caplog.records


def test_auto_on_cuda_without_flash_attn_takes_triton_silently(flash_absent, caplog):
    caplog.set_level(logging.WARNING, logger="nvllm")
    assert auto_backend(setup("cuda", block_size=256), warn=True) is TritonAttentionBackend
    assert auto_backend(setup("cuda", torch.float32), warn=True) is TritonAttentionBackend
    assert not caplog.records


def test_auto_never_takes_gpu_backends_on_cpu(flash_installed, kernels_built, generic_built):
    assert auto_backend(setup("cpu", block_size=256)) is CpuKernelAttentionBackend
    assert auto_backend(setup("cpu", torch.float32, block_size=256)) is CpuGenericAttentionBackend
    set_batch_invariant(False)
    try:
        assert auto_backend(setup("cpu", torch.float32, block_size=256)) is TorchAttentionBackend
    finally:
        set_batch_invariant(True)


def test_named_backends(flash_installed, kernels_built):
    assert named_backend("flash_attn", setup("cuda", block_size=256)) is FlashAttnBackend
    assert named_backend("triton", setup("cuda")) is TritonAttentionBackend
    assert named_backend("triton", setup("cpu")) is TritonAttentionBackend  # the interpreter, for tests
    assert named_backend("torch", setup("cuda")) is TorchAttentionBackend
    assert named_backend("torch", setup("mps", torch.float32)) is TorchAttentionBackend


def test_flash_attn_by_name_says_why_it_cannot_run(flash_installed):
    with pytest.raises(ValueError) as error:
        named_backend("flash_attn", setup("cuda", block_size=16))
    assert str(error.value) == ("attention_backend flash_attn cannot run here: flash-attn 2 reads a paged KV cache "
                                "only in blocks of a multiple of 256 tokens, and --block-size is 16. "
                                "Use --attention-backend triton (or auto)")
    with pytest.raises(ValueError, match="head dim that is a multiple of 8 up to 256, and the model's is 100"):
        named_backend("flash_attn", setup("cuda", block_size=256, head_dim=100))
    with pytest.raises(ValueError, match="runs on cuda only, and the device is cpu"):
        named_backend("flash_attn", setup("cpu", block_size=256))


def test_flash_attn_by_name_needs_the_package(flash_absent):
    with pytest.raises(ValueError) as error:
        select_attention_backend("flash_attn", setup("cuda", block_size=256))
    assert str(error.value) == "attention_backend flash_attn needs the flash-attn package: pip install 'nvllm[cuda]'"


def test_triton_by_name_on_another_device_says_why():
    with pytest.raises(ValueError, match="the triton attention backend runs on cuda only, and the device is mps"):
        named_backend("triton", setup("mps"))


def test_unknown_option():
    with pytest.raises(ValueError, match="'cudnn' is not one of auto, torch, triton, flash_attn"):
        select_attention_backend("cudnn", setup())


def test_declared_capabilities():
    assert TritonAttentionBackend.capabilities.cuda_graphs and FlashAttnBackend.capabilities.cuda_graphs
    assert not TorchAttentionBackend.capabilities.cuda_graphs
    assert [b.capabilities.fused_cpu_decoder for b in (TorchAttentionBackend, CpuKernelAttentionBackend,
                                                       CpuGenericAttentionBackend, TritonAttentionBackend,
                                                       FlashAttnBackend)] == [False, True, True, False, False]


@pytest.mark.skipif(paged_avx512_bf16.load() is None, reason="needs a CPU with AVX512-BF16 and a C compiler")
@pytest.mark.parametrize("num_heads,num_kv_heads", [(9, 3), (8, 8), (8, 1), (9, 1), (16, 2), (16, 1), (12, 2)])
@pytest.mark.parametrize("head_dim", [32, 48, 64, 96, 128, 160, 256, 288])
def test_kernel_capabilities_are_what_the_kernel_takes(num_heads, num_kv_heads, head_dim):
    """The declared shapes are exactly those paged_avx512_bf16.c serves: the C decoder gating and the choice between
    the kernels and torch then give the same attention as letting the kernel decline at each call."""
    q = torch.zeros(1, num_heads, head_dim, dtype=torch.bfloat16)
    cache = torch.zeros(2, 16, num_kv_heads, head_dim, dtype=torch.bfloat16)
    tables, lens = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    takes = paged_avx512_bf16.paged_decode_attention(q, cache, cache, tables, lens, 0.125, torch.empty_like(q))
    declared = CpuKernelAttentionBackend.unsupported_reason(
        setup(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim)) is None
    assert takes == declared
