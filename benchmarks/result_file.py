"""What every `nvllm bench ... --output-json FILE` writes: the figures with where they came from.

A figure is only worth what is known about how it was made, so the file carries the command line, the
commit it ran from, the date, and the CPU (model name, the instruction sets the kernels choose by, the
CPUs this process may run on) beside the bench's own figures under "results". The docs' performance pages are
rendered from such files committed under benchmarks/results/ (`nvllm bench report`).
"""

import datetime
import json
import os
import shlex
import subprocess
import sys

from common.child_process import ROOT
from common.cpu_info import read_cpuinfo

# the flags nvllm's CPU kernels are chosen by (engine_core/platform/device.py, the cpu_*.c kernels)
KERNEL_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def cpu_info(cpuinfo_path: str = "/proc/cpuinfo") -> dict:
    """Model name and the kernel-relevant flags of this CPU, the CPUs this process may run on, and the lower
    kernel tier NVLLM_CPU_ISA forces (None: the CPU's own)."""
    model, flags = read_cpuinfo(cpuinfo_path)
    return {"model": model, "flags": sorted(flags & set(KERNEL_FLAGS)), "cpus": len(os.sched_getaffinity(0)),
            "forced_tier": os.environ.get("NVLLM_CPU_ISA") or None}


def machine_label(model: str, flags: list[str], forced_tier: str | None = None) -> str:
    """The short name the performance pages put beside a figure: vendor line and the best instruction set tier, e.g.
    'Intel Xeon with AMX', 'AMD EPYC with AVX512-BF16', 'AMD EPYC with AVX2 only'; with a forced kernel
    tier, 'Intel Xeon with AMX, kernels forced to avx2'."""
    if forced_tier:
        return f"{machine_label(model, flags)}, kernels forced to {forced_tier}"
    vendor = "Intel Xeon" if "Xeon" in model else "AMD EPYC" if "EPYC" in model else model
    if "amx_bf16" in flags:
        tier = "with AMX"
    elif "avx512_bf16" in flags:
        tier = "with AVX512-BF16"
    elif "avx512f" in flags:
        tier = "with AVX512 (no BF16)"
    elif "avx2" in flags:
        tier = "with AVX2 only"
    else:
        tier = "without AVX2"
    return f"{vendor} {tier}"


def _commit() -> str:
    """HEAD's hash, '+dirty' when tracked files differ from it ('unknown' outside a git checkout)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "."], cwd=ROOT, capture_output=True,
                               timeout=10).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def provenance(argv: list[str] | None) -> dict:
    cpu = cpu_info()
    return {"command": shlex.join(["nvllm", *(sys.argv[1:] if argv is None else argv)]),
            "commit": _commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": machine_label(cpu["model"], cpu["flags"], cpu["forced_tier"]), "cpu": cpu}


def write_result(args, results) -> None:
    """Writes args.output_json (a bench's parsed arguments; args.argv is its command line, set by main)."""
    # where it came from first: opening the file empties it, and a committed result file being rewritten would
    # make the tree look modified
    payload = provenance(getattr(args, "argv", None)) | {"results": results}
    with open(args.output_json, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
