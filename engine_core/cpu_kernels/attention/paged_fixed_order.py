"""The batch-invariant paged attention kernel for any x86-64 CPU (paged_fixed_order.c), via ctypes.

float32 or bfloat16, any head dim and group size: what paged_avx512_bf16.c does not take. Every query row
(decodes, prefill chunks, chunks after cached blocks alike) walks its keys 0..p in tiles aligned to
absolute key positions with an online softmax in fp32, so a row's result depends on that row alone.
Built at first use for the active tier like the other kernels (engine_core/cpu_kernels); -ffp-contract=off, see the C
file. NVLLM_CPU_GENERIC_ATTENTION=0 turns it off.
"""

import ctypes

import torch

from engine_core.cpu_kernels import table

DTYPES = (torch.float32, torch.bfloat16)


@table.loader("paged_fixed_order")
def load(library):
    """The kernel library, or None where it cannot be had (turned off, no compiler: logged once)."""
    ptr, long, int_ = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    fn = library.generic_paged_attention
    fn.restype = int_
    float_ = ctypes.c_float
    fn.argtypes = ([ptr, long, ptr, ptr, ptr, long, ptr, ptr, ptr, long] + [int_] * 5
                   + [float_, int_, int_, float_, int_])  # scale, is_bf16, window, softcap, threads
    return library


def _takes(q, k_cache, v_cache, out, *int32_vectors) -> bool:
    return (q.device.type == "cpu" and q.dtype in DTYPES and k_cache.dtype == q.dtype and v_cache.dtype == q.dtype
            and out.dtype == q.dtype and out.shape == q.shape and q.dim() == 3
            and k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape == v_cache.shape
            and q.stride()[1:] == (q.shape[2], 1) and out.stride()[1:] == (out.shape[2], 1)
            and all(t.dtype == torch.int32 and t.device.type == "cpu" and t.stride(-1) == 1 for t in int32_vectors))


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, out: torch.Tensor,
                    window: int | None = None, softcap: float | None = None) -> bool:
    """Causal attention of q [T, H, D] into out [T, H, D]: sequence i owns rows query_start_loc[i] ..
    query_start_loc[i + 1] - 1, the last of its seq_lens[i] tokens in the cache (the new ones already
    written); a row at position p sees keys 0..p, or p - window + 1 .. p with a sliding window (the keys
    before it are never read); softcap: each scaled score s becomes softcap * tanh(s / softcap) first. False
    where the kernel does not apply (out then holds nothing to use)."""
    if not _takes(q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc) or not q.shape[0]:
        return False
    library = load()
    if library is None:
        return False
    num_heads, head_dim = q.shape[1:]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    status = library.generic_paged_attention(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
        block_tables.stride(0), seq_lens.data_ptr(), query_start_loc.data_ptr(), out.data_ptr(), out.stride(0),
        len(seq_lens), num_heads, num_kv_heads, head_dim, block_size, scale, int(q.dtype == torch.bfloat16),
        window or 0, softcap or 0.0, torch.get_num_threads())
    return status == 0
