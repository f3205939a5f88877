"""The one table of nvllm's CPU kernels: which C source serves which operation on which tier.

KERNELS lists each source with the lowest tier it runs on; OPERATIONS lists, per operation, the kernels
that can serve it, best first. On a machine (or under NVLLM_CPU_ISA) the first one whose tier is
active, that is not turned off and that builds, serves. The torch layers ask `load(name)` for a kernel
and never test CPU flags themselves; adding a tier or an operation is a line here and a source file.
"""

import ctypes
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from common.cache_dir import cache_dir
from engine_core.cpu_kernels import tiers
from engine_core.cpu_kernels.build import build_for, load_library, source_text

HERE = os.path.dirname(os.path.abspath(__file__))
# -ffp-contract=off where a kernel must round like torch, or like every other inlined copy of itself
NO_CONTRACT = ("-ffp-contract=off",)


@dataclass(frozen=True)
class Kernel:
    source: str  # relative to this package
    lowest_tier: str
    what: str  # for log lines
    flags: tuple[str, ...] = ()
    off_switches: tuple[tuple[str, str], ...] = ()  # (variable, value) pairs, each of which turns it off
    on_switch: tuple[str, str] | None = None  # (variable, value) without which it stays off (an opt-in kernel)

    @property
    def path(self) -> str:
        return os.path.join(HERE, self.source)

    def switched_off(self) -> bool:
        if self.on_switch is not None and os.environ.get(self.on_switch[0], "") != self.on_switch[1]:
            return True
        return any(os.environ.get(variable, "") == value for variable, value in self.off_switches)


KERNELS = {  # each named as its source (a source built with other defines: a suffix for what they make)
    "amx_gemm": Kernel("linear/amx_gemm.c", "amx", "the bf16 linear kernel on AMX tiles (TDPBF16PS)",
                       off_switches=(("NVLLM_CPU_AMX", "0"),)),
    "dense_bf16_dot": Kernel("linear/dense_bf16_dot.c", "avx512_bf16", "the bf16 linear kernel (vdpbf16ps panels)",
                             off_switches=(("NVLLM_CPU_GEMM", "onednn"),)),
    "dense_fixed_order": Kernel("linear/dense_fixed_order.c", "portable", "the fixed-order linear kernel (fp32 FMA)",
                                NO_CONTRACT),
    # VNNI only, but measured on the amx tier alone; opt-in (NVLLM_CPU_QUANT_VNNI=1): its 8-bit input rows part
    # the default model's greedy answers from the dequantized model's more often than quant_bf16_dot.c's exact
    # products do (3 of 12 chat prompts identical; "What is the capital of France?" answered "L'Étoile, ...")
    "quant_vnni": Kernel("linear/quant_vnni.c", "amx", "the quantized linear kernel (8-bit activations, exact "
                         "block sums)", NO_CONTRACT, on_switch=("NVLLM_CPU_QUANT_VNNI", "1")),
    "amx_quant": Kernel("linear/amx_quant.c", "amx", "the quantized linear kernel of exact integer block sums (inputs "
                        "as 16-bit integers; VNNI, AMX tiles)", NO_CONTRACT,
                        off_switches=(("NVLLM_CPU_AMX", "0"), ("NVLLM_CPU_AMX_QUANT", "0"))),
    "quant_bf16_dot": Kernel("linear/quant_bf16_dot.c", "avx512_bf16",
                             "the quantized linear kernel (bf16 dot products)"),
    "quant_exact_f32": Kernel("linear/quant_exact_f32.c", "portable",
                              "the float32 quantized linear kernel (weights unpacked to their exact values)",
                              NO_CONTRACT),
    "quant_int8_rows": Kernel("linear/quant_int8_rows.c", "portable",
                              "the quantized linear kernel (8-bit activations, integer dot products)", NO_CONTRACT),
    "fused_torch_rounding": Kernel("ops/fused_torch_rounding.c", "portable",
                                   "the fused bf16 norm / SiLU-and-mul / rotary kernels", NO_CONTRACT,
                                   off_switches=(("NVLLM_CPU_FUSED_OPS", "0"),)),
    "rms_fixed_order": Kernel("ops/rms_fixed_order.c", "portable", "the fixed-order RMS statistic", NO_CONTRACT),
    "fused_fixed_order": Kernel("ops/fused_fixed_order.c", "portable",
                                "the fused float32 norm / SiLU-and-mul / rotary kernels", NO_CONTRACT,
                                off_switches=(("NVLLM_CPU_FUSED_OPS", "0"),)),
    "amx_attention": Kernel("attention/amx_attention.c", "amx", "the bf16 paged attention kernels on AMX tiles",
                            NO_CONTRACT, off_switches=(("NVLLM_CPU_AMX", "0"),)),
    "paged_avx512_bf16": Kernel("attention/paged_avx512_bf16.c", "avx512_bf16", "the bf16 paged attention kernels",
                                NO_CONTRACT, off_switches=(("NVLLM_CPU_DECODE_KERNEL", "0"),)),
    "paged_fixed_order": Kernel("attention/paged_fixed_order.c", "portable",
                                "the fixed-order paged attention kernel", NO_CONTRACT,
                                off_switches=(("NVLLM_CPU_GENERIC_ATTENTION", "0"),)),
    "loop_avx512_bf16": Kernel("decoder/loop_avx512_bf16.c", "avx512_bf16", "the one-call decoder loop",
                               off_switches=(("NVLLM_CPU_DECODER", "0"),)),
    "loop_portable": Kernel("decoder/loop_portable.c", "portable", "the one-call float32 decoder loop",
                            off_switches=(("NVLLM_CPU_DECODER", "0"),)),
    "loop_portable_bf16": Kernel("decoder/loop_portable.c", "portable",
                                 "the one-call bf16 decoder loop below avx512_bf16", ("-DDECODER_BF16",),
                                 off_switches=(("NVLLM_CPU_DECODER", "0"),)),
}

# operation -> the kernels that can serve it, best first; a name not in KERNELS is the torch code's
OPERATIONS = {
    "linear bfloat16": ("amx_gemm", "dense_bf16_dot", "dense_fixed_order"),
    "linear float32": ("dense_fixed_order",),
    "kept-quantized linear bfloat16": ("quant_vnni", "amx_quant", "quant_bf16_dot", "quant_int8_rows", "dequantized"),
    "kept-quantized linear float32": ("quant_exact_f32", "quant_int8_rows", "dequantized"),
    "attention bfloat16": ("amx_attention", "paged_avx512_bf16", "paged_fixed_order"),
    "attention float32": ("paged_fixed_order",),
    "norm, rotary, SiLU bfloat16": ("fused_torch_rounding", "torch"),
    "norm, rotary, SiLU float32": ("fused_fixed_order", "torch"),
    "decoder loop bfloat16": ("loop_avx512_bf16", "loop_portable_bf16", "python"),
    "decoder loop float32": ("loop_portable", "python"),
}

_loaders: dict[str, Callable[[], ctypes.CDLL | None]] = {}
_prebuilt: set[tuple] = set()  # (cache folder, kernel, tier) that prebuild has seen to, in this process


def runs_here(name: str) -> bool:
    """Whether kernel `name` may serve on the active tier (not whether it builds)."""
    kernel = KERNELS[name]
    return tiers.at_least(kernel.lowest_tier) and not kernel.switched_off()


def loader(name: str):
    """Decorates a wrapper's `declare(library) -> library | None` (ctypes signatures, checks) into its
    cached `load()`: kernel `name` built for the active tier and declared, or None where its tier is not
    active, it is turned off, it cannot be built (logged once by build.load_library) or declare refuses."""

    def wrap(declare: Callable[[ctypes.CDLL], ctypes.CDLL | None]) -> Callable[[], ctypes.CDLL | None]:
        @functools.cache
        def load() -> ctypes.CDLL | None:
            library = _build(name)
            return None if library is None else declare(library)

        _loaders[name] = load
        return load

    return wrap


def _build(name: str) -> ctypes.CDLL | None:
    if not runs_here(name):
        return None
    kernel = KERNELS[name]
    return load_library(kernel.path, kernel.flags, f"{kernel.what} ({kernel.source})")


def load(name: str) -> ctypes.CDLL | None:
    """Kernel `name` as its wrapper module declared it (built only, where that module is not imported), or None."""
    return _loaders[name]() if name in _loaders else _build(name)


def prebuild(tier_names: tuple[str, ...] | None = None, workers: int | None = None) -> None:
    """Compiles every kernel that runs on `tier_names` (default: the active tier) and is not turned off, `workers`
    compilers at a time (default: one per CPU this process may use), where the cache does not hold it yet: on a
    fresh machine the first start builds them side by side instead of one after another at first use. A build
    that fails is left for load() to log; nothing is loaded here."""
    tier_names = tier_names or (tiers.active_tier(),)
    jobs = [(kernel, tier) for tier in tier_names for kernel in KERNELS.values()
            if tiers.rank(tier) >= tiers.rank(kernel.lowest_tier) and not kernel.switched_off()
            and (cache_dir(), kernel, tier) not in _prebuilt]
    if not jobs:
        return
    jobs.sort(key=lambda job: -len(source_text(job[0].path)))  # the longest compiles first, by source size

    def build(job) -> None:
        kernel, tier = job
        try:
            build_for(kernel.path, kernel.flags, tier, f"{kernel.what} ({kernel.source})")
        except (OSError, RuntimeError):
            pass  # load() logs why, once, where the kernel is asked for

    with ThreadPoolExecutor(workers or len(os.sched_getaffinity(0))) as pool:
        list(pool.map(build, jobs))
    _prebuilt.update((cache_dir(), kernel, tier) for kernel, tier in jobs)


def forget() -> None:
    """Drops every choice made so far, for a changed NVLLM_CPU_ISA or off switch (tests)."""
    tiers.active_tier.cache_clear()
    for load_kernel in _loaders.values():
        load_kernel.cache_clear()


def serving(operation: str) -> str:
    """The kernel that serves `operation` here: the first of its list that runs on this tier and builds
    (the torch code's name where none does)."""
    for name in OPERATIONS[operation]:
        if name not in KERNELS or load(name) is not None:
            return name if name not in KERNELS else _shown(KERNELS[name])
    return "torch"


def _shown(kernel: Kernel) -> str:
    """A kernel's source, with the defines it is built with where one source makes several kernels."""
    defines = [flag for flag in kernel.flags if flag.startswith("-D")]
    return kernel.source + (f" ({' '.join(defines)})" if defines else "")


def describe(dtype: str) -> str:
    """One line for the load log: the tier and the kernel picked for each operation of a `dtype` engine."""
    picked = [f"{op.removesuffix(' ' + dtype)}: {serving(op)}" for op in OPERATIONS if op.endswith(dtype)]
    return f"CPU kernels for tier {tiers.describe()}: " + ", ".join(picked)
