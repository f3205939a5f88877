"""The CPU paged attention kernels (paged_avx512_bf16.c): built once, loaded through ctypes.

paged_decode_attention serves one query token per sequence; paged_attention any number per sequence
(prefill chunks, chunks after cached blocks, decodes), reading keys and values in place. Both take
bfloat16 on CPUs with AVX512-BF16 (head_dim a multiple of 32 up to 256, up to 8 query heads per KV head). It is compiled
at first use for the avx512_bf16 / amx tier (engine_core/cpu_kernels: the table, the build). The attention
backend over these kernels is cpu_kernel_backend.py; where they cannot be had (another CPU, no
compiler, a failed build: logged once) the selector takes the torch backend, which gathers and calls
SDPA instead. NVLLM_CPU_DECODE_KERNEL=0 turns them off.
"""

import ctypes

import torch

from engine_core.cpu_kernels import table
from engine_core.cpu_kernels.amx_grant import amx_granted


def load():
    """The kernel library, or None where it cannot be had (logged once): amx_attention.c on the amx tier
    (paged_avx512_bf16.c's functions, the chunk kernel's products on AMX tiles), else paged_avx512_bf16.c.
    NVLLM_CPU_DECODE_KERNEL=0 turns both off."""
    if not table.runs_here("paged_avx512_bf16"):
        return None
    return _amx_library() or _library()


@table.loader("amx_attention")
def _amx_library(library):
    """amx_attention.c, or None where the OS refuses the tiles (logged)."""
    granted = amx_granted(library, "attention runs paged_avx512_bf16.c's AVX512-BF16 kernels")
    return _declare(library) if granted else None


def _declare(library):
    """The ctypes signatures of paged_avx512_bf16.c's functions (amx_attention.c has the same)."""
    fn = library.paged_decode_attention
    fn.restype = ctypes.c_int
    fn.argtypes = ([ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long,
                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
                   + [ctypes.c_int] * 5 + [ctypes.c_float] + [ctypes.c_int] * 2)
    fn = library.paged_attention
    fn.restype = ctypes.c_int
    fn.argtypes = ([ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long,
                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
                   + [ctypes.c_int] * 5 + [ctypes.c_float] + [ctypes.c_int] * 2)
    return library


_library = table.loader("paged_avx512_bf16")(_declare)


def _takes(q, k_cache, v_cache, out, *int32_vectors) -> bool:
    return (q.device.type == "cpu" and q.dtype == torch.bfloat16 and k_cache.dtype == q.dtype
            and v_cache.dtype == q.dtype and out.dtype == q.dtype and out.shape == q.shape
            and k_cache.is_contiguous() and v_cache.is_contiguous()
            and q.stride()[1:] == (q.shape[2], 1) and out.stride()[1:] == (out.shape[2], 1)
            and all(t.dtype == torch.int32 and t.device.type == "cpu" and t.stride(-1) == 1 for t in int32_vectors))


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           out: torch.Tensor, window: int | None = None) -> bool:
    """Attention of q [S, H, D] (one token per sequence: the last of its seq_lens[i] cached tokens)
    into out [S, H, D], over its last `window` keys only with a sliding window. False, with out untouched,
    where the kernel does not apply."""
    if not _takes(q, k_cache, v_cache, out, block_tables, seq_lens):
        return False
    library = load()
    if library is None:
        return False
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    status = library.paged_decode_attention(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
        block_tables.stride(0), seq_lens.data_ptr(), out.data_ptr(), out.stride(0), num_seqs, num_heads,
        num_kv_heads, head_dim, block_size, scale, window or 0, torch.get_num_threads())
    return status == 0


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, out: torch.Tensor,
                    window: int | None = None) -> bool:
    """Causal attention of q [T, H, D] into out [T, H, D]: sequence i owns rows query_start_loc[i] ..
    query_start_loc[i + 1] - 1 (absolute rows of q), the last of its seq_lens[i] tokens in the cache
    (the new ones already written); a row at position p sees keys 0..p, or p - window + 1 .. p with a
    sliding window (the keys before it never read). One call for all sequences.
    False, with out untouched, where the kernel does not apply."""
    if not _takes(q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc) or not q.shape[0]:
        return False
    library = load()
    if library is None:
        return False
    num_heads, head_dim = q.shape[1:]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    status = library.paged_attention(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
        block_tables.stride(0), seq_lens.data_ptr(), query_start_loc.data_ptr(), out.data_ptr(), out.stride(0),
        len(seq_lens), num_heads, num_kv_heads, head_dim, block_size, scale, window or 0, torch.get_num_threads())
    return status == 0
