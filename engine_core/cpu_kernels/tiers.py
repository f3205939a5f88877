"""The CPU tier the kernels are built for: what this CPU can run, or a lower tier NVLLM_CPU_ISA asks for.

Tiers, lowest first; each runs everything the ones below it run:
  portable     plain C, no intrinsics: any CPU with a C compiler (ARM, old x86)
  avx2         AVX2 + FMA + F16C (Haswell and later, every AMD Zen)
  avx512       AVX512 F/BW/VL/DQ (Skylake-SP, Cascade Lake, Ice Lake), VNNI where the CPU has it
  avx512_bf16  the above with VNNI and BF16 (Cooper Lake, Zen4, Zen5)
  amx          the above with AMX tiles (Sapphire Rapids and later)

A kernel is compiled with its tier's flags, never -march=native: what a tier's build runs on one CPU it
runs on every CPU of that tier, and a tier below the machine's own runs for real when forced (a test of
the AVX2 kernels on an AVX512 machine exercises the AVX2 code).
"""

import functools
import os
import platform

from common.cpu_info import cpu_flags

TIERS = ("portable", "avx2", "avx512", "avx512_bf16", "amx")
ENV = "NVLLM_CPU_ISA"

# /proc/cpuinfo flags each tier needs, beyond the tier below it
_NEEDS = {
    "portable": frozenset(),
    "avx2": frozenset({"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"}),  # x86-64-v3, which the builds target
    "avx512": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}),  # x86-64-v4
    "avx512_bf16": frozenset({"avx512_vnni", "avx512_bf16"}),
    "amx": frozenset({"amx_tile", "amx_bf16", "amx_int8"}),
}

# gcc/clang flags per tier (x86-64-v3 is AVX2/FMA/F16C/BMI2, x86-64-v4 adds AVX512 F/BW/CD/DQ/VL)
_COMPILE = {
    "avx2": ("-march=x86-64-v3",),
    "avx512": ("-march=x86-64-v4",),
    "avx512_bf16": ("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16"),
    "amx": ("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16", "-mamx-tile", "-mamx-bf16", "-mamx-int8"),
}


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def cpu_tier(flags: frozenset[str] | None = None) -> str:
    """The highest tier a CPU with these flags (default: this one's) runs."""
    flags = cpu_flags() if flags is None else flags
    have, needs = "portable", frozenset()
    if flags and _x86():
        for tier in TIERS[1:]:
            needs = needs | _NEEDS[tier]
            if not needs <= flags:
                break
            have = tier
    return have


def rank(tier: str) -> int:
    return TIERS.index(tier)


@functools.cache
def active_tier() -> str:
    """The tier the kernels serve: this CPU's, or the lower one NVLLM_CPU_ISA names."""
    own = cpu_tier()
    asked = os.environ.get(ENV, "").strip().lower()
    if not asked:
        return own
    if asked not in TIERS:
        raise ValueError(f"{ENV}={asked!r} is not a CPU tier (one of: {', '.join(TIERS)})")
    if rank(asked) > rank(own):
        missing = sorted(set().union(*(_NEEDS[t] for t in TIERS[: rank(asked) + 1])) - cpu_flags())
        raise ValueError(f"{ENV}={asked} needs CPU flags this CPU lacks ({', '.join(missing) or 'x86-64'}); "
                         f"this CPU's tier is {own}: ask for it or one below ({', '.join(TIERS[: rank(own) + 1])})")
    return asked


def at_least(tier: str) -> bool:
    """Whether the active tier runs `tier`'s kernels."""
    return rank(active_tier()) >= rank(tier)


def compile_flags(tier: str) -> tuple[str, ...]:
    """The compiler flags of a tier's builds. portable on x86 pins the x86-64 baseline (SSE2: what every
    64-bit x86 CPU has), so no intrinsics path of a source is taken; elsewhere the compiler's default."""
    if tier == "portable":
        return ("-march=x86-64", "-mtune=generic") if _x86() else ()
    flags = list(_COMPILE[tier])
    if tier == "avx512" and "avx512_vnni" in cpu_flags():
        flags.append("-mavx512vnni")
    return tuple(flags)


def describe() -> str:
    """'avx2' or 'avx2 (forced by NVLLM_CPU_ISA; this CPU runs amx)', for logs and benchmark reports."""
    own, tier = cpu_tier(), active_tier()
    return tier if tier == own else f"{tier} (forced by {ENV}; this CPU runs {own})"
