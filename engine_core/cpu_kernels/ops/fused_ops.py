"""Fused kernels: residual add + RMSNorm, SiLU-and-mul, rotary. bfloat16 on every tier (fused_torch_rounding.c: 16 lanes
at a time on avx512 and up, one value at a time below, the same bits), float32 on every tier (fused_fixed_order.c,
the arithmetic of the torch code below in a fixed order).

In a bf16 prefill on CPU the small torch ops these replace (dtype conversions, mul, add, pow, silu,
sum, cat, neg and their temporaries) cost about a quarter of the step; each kernel does the same
work in one pass over memory, bit-identical to the torch code (see fused_torch_rounding.c for how): the
RMSNorm's statistic is rms_fixed_order.c's fixed-order sum when batch-invariant, as norm.py's, and torch's sum
order otherwise. Each wrapper returns None (or False) where it does not apply (another dtype or device, an
unsupported layout, no kernel on this machine); the caller then runs its torch code. NVLLM_CPU_FUSED_OPS=0 turns them off.
"""

import ctypes
import logging

import torch

from engine_core.platform.batch_invariance import batch_invariant
from engine_core.cpu_kernels import table


logger = logging.getLogger("nvllm")

_norm_ok = False  # the norm kernel matched torch's sum order at load
_silu_table = None  # kept alive: the C side reads it


@table.loader("fused_torch_rounding")  # built without fused multiply-adds: torch rounds every product before adding
def load(library):
    """The kernel library, or None where it cannot be had (disabled, no compiler)."""
    global _norm_ok, _silu_table
    long, ptr = ctypes.c_long, ctypes.c_void_p
    for fn in (library.rms_norm_bf16, library.rms_norm_fixed_bf16):
        fn.argtypes = [ptr, long, long, ptr, long, long, ptr, long, long, ptr, long, long, long, ctypes.c_float,
                       ctypes.c_int]
        fn.restype = ctypes.c_int
    library.silu_and_mul_bf16.argtypes = [ptr, long, ptr, long, long, long, ctypes.c_int]
    library.rotary_bf16.argtypes = [ptr, long, long, long, long, long, ptr, ptr, ptr, long, ctypes.c_int]
    library.set_silu_table.argtypes = [ptr]
    library.set_sum_lanes.argtypes = [ctypes.c_int]
    for fn in (library.rms_norm_bf16, library.silu_and_mul_bf16, library.rotary_bf16):
        fn.restype = ctypes.c_int
    # silu of a bf16 has 65536 possible inputs: tabulate torch's own results (+1 entry: the kernel's
    # 4-byte gathers read 2 bytes past the last one)
    inputs = torch.arange(65536, dtype=torch.int32, device="cpu").to(torch.int16).view(torch.bfloat16)
    _silu_table = torch.cat([torch.nn.functional.silu(inputs), torch.zeros(1, dtype=torch.bfloat16, device="cpu")])
    library.set_silu_table(_silu_table.data_ptr())
    _norm_ok = _pick_sum_lanes(library)
    return library


@table.loader("fused_fixed_order")
def load_f32(library):
    """The float32 kernels (every tier), or None where they cannot be had (disabled, no compiler)."""
    long, ptr = ctypes.c_long, ctypes.c_void_p
    library.rms_norm_f32.argtypes = [ptr, long, long, ptr, long, long, ptr, long, long, ptr, long, long, long,
                                     ctypes.c_float, ctypes.c_int]
    for fn in (library.silu_and_mul_f32, library.gelu_tanh_and_mul_f32):
        fn.argtypes = [ptr, long, ptr, long, long, long, ctypes.c_int]
    library.rotary_f32.argtypes = [ptr, long, long, long, long, long, ptr, ptr, ptr, long, ctypes.c_int]
    for fn in (library.rms_norm_f32, library.silu_and_mul_f32, library.gelu_tanh_and_mul_f32, library.rotary_f32):
        fn.restype = ctypes.c_int
    return library


def _kernel(dtype: torch.dtype, name: str):
    """The kernel `name` (rms_norm, silu_and_mul, rotary; gelu_tanh_and_mul: float32 only) for `dtype` tensors, or
    None."""
    if dtype is torch.bfloat16:
        library = load()
        if name == "gelu_tanh_and_mul":
            return None
        if library is None or (name == "rms_norm" and not norm_kernel_ok()):
            return None
        return getattr(library, bf16_norm_name() if name == "rms_norm" else name + "_bf16")
    if dtype is torch.float32:
        library = load_f32()
        # the float32 norm is the batch-invariant path's (rms_fixed_order.c's statistic); --no-batch-invariant keeps
        # torch's
        if library is None or (name == "rms_norm" and not batch_invariant()):
            return None
        return getattr(library, name + "_f32")
    return None


def bf16_norm_name() -> str:
    """The bf16 RMSNorm kernel whose statistic is norm.py's: batch-invariant, rms_fixed_order.c's fixed-order sum;
    otherwise torch's own sum order."""
    return "rms_norm_fixed_bf16" if batch_invariant() else "rms_norm_bf16"


def norm_kernel_ok() -> bool:
    """Whether the bf16 RMSNorm kernel runs: batch-invariant always (rms_fixed_order.c's order is its own), otherwise
    where it reproduces this torch's sum order."""
    return load() is not None and (batch_invariant() or _norm_ok)


def silu_table() -> torch.Tensor | None:
    """torch's silu of every bf16, indexed by its bits (+1 padding entry), for kernels that apply silu
    themselves (dense_linear.GatedPanelWeight); None where the fused kernels are off."""
    return _silu_table if load() is not None else None


def _torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """norm.py's torch code (float32 statistics, bf16 rounding), the reference the kernel matches."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _pick_sum_lanes(library) -> bool:
    """Sets the kernel's sum order to the vector width of torch's sum kernel (which width torch runs
    depends on its build and dispatch, not only on the CPU): the one whose results equal torch's
    on random rows. False (norm kernel unused, logged) where neither does."""
    g = torch.Generator().manual_seed(0)
    rows = [(torch.randn(32, n, generator=g, device="cpu") * torch.rand(32, 1, generator=g, device="cpu") * 8)
            .to(torch.bfloat16) for n in (16, 43, 576, 1040, 4100)]
    weights = [torch.randn(x.shape[1], generator=g, device="cpu").to(torch.bfloat16) for x in rows]
    expected = [_torch_rms_norm(x, w, 1e-5) for x, w in zip(rows, weights)]
    for lanes in (8, 16):
        library.set_sum_lanes(lanes)
        if all(torch.equal(_call_rms_norm(library.rms_norm_bf16, x, None, w, 1e-5), e)
                for x, w, e in zip(rows, weights, expected)):
            return True
    logger.warning("the fused CPU RMSNorm kernel does not reproduce this torch's sum order; RMSNorm runs in torch")
    return False


def rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """RMSNorm(x) * weight as a new tensor; with a residual, x + residual -> new residual, then its
    norm, both IN PLACE: the normed rows overwrite x and the new residual overwrites residual;
    returns (x, residual). x: [T, n] or [T, H, n], rows contiguous, 16 <= n <= 16384. None (inputs
    untouched) where the kernel does not apply."""
    if not x.is_cpu or weight.dtype is not x.dtype or not weight.is_cpu:
        return None
    kernel = _kernel(x.dtype, "rms_norm")
    if kernel is None:
        return None
    if residual is not None and (residual.dtype is not x.dtype or not residual.is_cpu or residual.shape != x.shape):
        return None
    return _call_rms_norm(kernel, x, residual, weight, eps)


def _call_rms_norm(kernel, x, residual, weight, eps):
    n = x.shape[-1]
    if x.stride(-1) != 1 or not weight.is_contiguous() or weight.shape != (n,) or not 16 <= n <= 16384:
        return None
    if x.dim() == 2:
        (n0, _), (s0, _), n1, s1 = x.shape, x.stride(), 1, 0
    elif x.dim() == 3:
        (n0, n1, _), (s0, s1, _) = x.shape, x.stride()
    else:
        return None
    if residual is None:
        out = torch.empty(x.shape, dtype=x.dtype, device="cpu")
        o0, o1 = (n1 * n, n) if x.dim() == 3 else (n, 0)
        kernel(x.data_ptr(), s0, s1, None, 0, 0, out.data_ptr(), o0, o1, weight.data_ptr(), n0, n1, n, eps,
               torch.get_num_threads())
        return out
    if residual.stride(-1) != 1:
        return None
    r0, r1 = residual.stride()[:2] if x.dim() == 3 else (residual.stride(0), 0)
    kernel(x.data_ptr(), s0, s1, residual.data_ptr(), r0, r1, x.data_ptr(), s0, s1, weight.data_ptr(), n0, n1, n,
           eps, torch.get_num_threads())
    return x, residual


def silu_and_mul(x: torch.Tensor) -> torch.Tensor | None:
    """silu(x[:, :n]) * x[:, n:] for x [T, 2n] (rows contiguous) as a new [T, n] tensor; None where
    the kernel does not apply."""
    return _act_and_mul(x, "silu_and_mul")


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor | None:
    """gelu(x[:, :n], approximate="tanh") * x[:, n:] for float32 x [T, 2n] (rows contiguous) as a new [T, n]
    tensor (fused_fixed_order.c: its own tanh, the same bits in every lane, within 1e-6 of torch's); None where the
    kernel does not apply."""
    return _act_and_mul(x, "gelu_tanh_and_mul")


def _act_and_mul(x: torch.Tensor, name: str) -> torch.Tensor | None:
    if not x.is_cpu or x.dim() != 2 or x.stride(1) != 1 or x.shape[1] % 2:
        return None
    kernel = _kernel(x.dtype, name)
    if kernel is None:
        return None
    rows, n = x.shape[0], x.shape[1] // 2
    out = torch.empty((rows, n), dtype=x.dtype, device="cpu")
    if kernel(x.data_ptr(), x.stride(0), out.data_ptr(), n, rows, n, torch.get_num_threads()):
        return None
    return out


def rotary(positions: torch.Tensor, heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Rotates heads [T, H, D] (heads rows contiguous) IN PLACE by positions [T] (int64) with the
    float32 tables cos/sin [max_position, R]: each head's first R <= D dims (R < D: Phi-3's partial rotary; the
    rest pass unchanged). False, heads untouched, where the kernel does not apply."""
    if not heads.is_cpu or heads.dim() != 3 or positions.dtype is not torch.int64:
        return False
    kernel = _kernel(heads.dtype, "rotary")
    tokens, num_heads, d = heads.shape
    if (kernel is None or heads.stride(2) != 1 or heads.stride(1) != d or d % 2 or not positions.is_contiguous()
            or positions.shape != (tokens,) or not positions.is_cpu or cos.dtype is not torch.float32
            or cos.shape[1] > d or cos.shape[1] % 2 or not cos.is_cpu or not cos.is_contiguous()
            or not sin.is_contiguous() or sin.shape != cos.shape or sin.dtype is not torch.float32 or not sin.is_cpu):
        return False
    return kernel(heads.data_ptr(), heads.stride(0), d, tokens, num_heads, cos.shape[1], positions.data_ptr(),
                  cos.data_ptr(), sin.data_ptr(), cos.shape[0], torch.get_num_threads()) == 0
