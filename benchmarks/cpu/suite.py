"""`nvllm bench cpu`: the CPU workloads (W32, prefill-only, decode-only) through nvllm and, given a vLLM CPU
venv (../shared/tools/vllm-cpu-setup.sh), through vLLM back to back, with the ratios; `--busy` runs every
engine a second time beside a busy process and prints what it lost.

Every run is a fresh child process (benchmarks/cpu/workloads.py) so no engine inherits another's
state, started once the host is quiet again (the last engine's children may outlive it); runs alternate nvllm, vLLM, nvllm, ... so drifts of this shared machine hit both alike. The
figure of an engine is the median of its runs. Before the runs it names the CPU tier the kernels run
(NVLLM_CPU_ISA forces a lower one) and measures that tier's GEMM peak on the model's own layer shapes, in
the dtype the tier runs (benchmarks/torch_side/gemm_peak.py, in a child: this process stays torch-free), and
prints the prefill rate as a fraction of it; and it measures the tier's kept-quantized kernel against torch's
weight-only quantized matmuls on the same shapes (benchmarks/torch_side/quantized_kernels.py). vLLM gets the
model as an HF folder it can read: a folder nvllm imported from a GGUF file (the default model's) becomes the
file's weights dequantized by transformers, in bf16 (benchmarks/torch_side/dense_folder.py).
"""

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

from common.child_process import ROOT, checkout_env
from common.cli.arg_types import positive_int
from common.cpu_load import all_cpus, busy_ticks
from benchmarks.cpu.serving import run_serving
from benchmarks.cpu.workloads import WORKLOADS, workload
from benchmarks.result_file import write_result

ALL_WORKLOADS = WORKLOADS + ("serve",)

HERE = os.path.dirname(os.path.abspath(__file__))


def _run_child(cmd: list[str], env: dict, timeout: float = 1800) -> dict:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    raise RuntimeError(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}): {proc.stderr.strip()[-1500:]}")


def _vllm_env(venv: str) -> dict:
    """vLLM's CPU setup as its docs ask: tcmalloc and Intel OpenMP preloaded, every core for the model."""
    env = dict(os.environ)
    preload = [p for p in ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", os.path.join(venv, "lib", "libiomp5.so"))
               if os.path.exists(p)]
    env["LD_PRELOAD"] = ":".join(preload)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{os.cpu_count() - 1}")
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    # its server otherwise asks for 92% of the host's memory up front, and refuses to start on a shared host
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    return env


def _busy_cpus() -> float:
    """CPUs' worth of work this host ran over the last half second (0.0 where /proc/stat is unreadable)."""
    cpus = all_cpus()
    before, start = busy_ticks(cpus), time.monotonic()
    time.sleep(0.5)
    after = busy_ticks(cpus)
    if before is None or after is None:
        return 0.0
    return (after - before) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - start)


def _wait_quiet(timeout: float = 60.0) -> None:
    """Until the previous run's processes are gone (an engine's children may outlive it by seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _busy_cpus() > 0.2:
        pass


class Busy:
    """A process that keeps one CPU busy (a neighbour on a shared host) while in the `with` block."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def prefill_flops_per_token(folder: str) -> float:
    """Model FLOPs per prompt token of the prefill workload: every linear layer (2 per weight), causal
    attention over the token's position (QK and PV), and the LM head once per prompt."""
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    hidden, layers, heads = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    kv = c.get("num_key_value_heads", heads) * head_dim
    q = heads * head_dim
    linear = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * c["intermediate_size"]
    prompts, _ = workload("prefill")
    total = 0
    for p in prompts:
        n = len(p)
        attention = 4 * q * n * (n + 1) // 2  # position i attends to i + 1 keys
        total += layers * (2 * linear * n + attention) + 2 * hidden * c["vocab_size"]
    return total / sum(map(len, prompts))


def run_suite(args) -> int:
    unknown = [w for w in args.workloads if w not in ALL_WORKLOADS]
    if unknown:
        raise ValueError(f"--workloads: {', '.join(unknown)} not among {', '.join(ALL_WORKLOADS)}")
    env = checkout_env()
    peak = _run_child([sys.executable, "-m", "benchmarks.torch_side.gemm_peak"] + ([args.model] if args.model else []), env)
    folder = peak["model_dir"]
    print(f"CPU tier {peak['tier']}: {peak['dtype']} GEMM peak on {os.path.basename(folder)}'s layer shapes: "
          f"{peak['peak_gflops']:.0f} GFLOP/s ({peak['threads']} threads; by kernel and tokens per matmul: "
          f"{peak['gflops_by_kernel']})", flush=True)
    quantized = _run_child([sys.executable, "-m", "benchmarks.torch_side.quantized_kernels", folder], env)
    print(f"kept-quantized Q4_1 linears, {quantized['dtype']}, GFLOP/s by kernel and tokens per matmul (nvllm's "
          f"against torch's weight-only int4 / int8 matmuls): {quantized['gflops_by_kernel']}", flush=True)
    engines = ["nvllm"] + (["vllm"] if args.vllm_venv else [])
    # vLLM reads HF folders: a folder nvllm imported from a GGUF file becomes the file's weights dequantized
    folders = {"nvllm": folder}
    if args.vllm_venv:
        folders["vllm"] = _run_child([sys.executable, "-m", "benchmarks.torch_side.dense_folder", folder], env)["folder"]
        print(f"vLLM runs the HF folder {folders['vllm']}", flush=True)
    commands = {"nvllm": ([sys.executable, "-m", "benchmarks.cpu.workloads", "nvllm"], env)}
    if args.vllm_venv:
        commands["vllm"] = ([os.path.join(args.vllm_venv, "bin", "python"), os.path.join(HERE, "workloads.py"),
                             "vllm"], _vllm_env(args.vllm_venv))
    conditions = ["alone", "busy"] if args.busy else ["alone"]
    runs: dict[tuple, list[float]] = {}
    requests: dict[str, int] = {}  # per workload, as the runs report it
    for name in args.workloads:
        for condition in conditions:
            for i in range(args.repeat):
                for engine in engines:
                    _wait_quiet(args.settle_timeout)
                    with Busy() if condition == "busy" else contextlib.nullcontext():
                        result = _one_run(args, engine, name, commands[engine], folders[engine])
                    runs.setdefault((name, condition, engine), []).append(result["tok_s"])
                    if "requests" in result:
                        requests[name] = result["requests"]
                    latency = (f" (mean TTFT {result['mean_ttft_ms']:.0f} ms, TPOT {result['mean_tpot_ms']:.1f} ms)"
                               if name == "serve" else "")
                    print(f"  {name:8} {condition:5} {engine:6} run {i + 1}: {result['tok_s']:8.1f} {result['unit']}"
                          + latency, flush=True)
                    if name == "serve":
                        runs.setdefault((name + "-ttft", condition, engine), []).append(result["mean_ttft_ms"])
    summary = _summarize(args.workloads, conditions, engines, runs, peak, prefill_flops_per_token(folder))
    if args.output_json:
        write_result(args, {"gemm_peak": peak, "quantized_kernels": quantized,
                            "runs": {"/".join(k): v for k, v in runs.items()}, "requests": requests, "summary": summary})
    return 0


def _one_run(args, engine: str, name: str, command: tuple[list[str], dict], folder: str) -> dict:
    cmd, env = command
    if name == "serve":
        # nvllm serves what its offline runs load: the model its arguments name (positional), else its default
        pairs = [a.split("=", 1) for a in args.nvllm_arg]
        model = [value for key, value in pairs if key == "model"]
        nvllm_flags = model[-1:] + [f"--{key.replace('_', '-')}={value}" for key, value in pairs if key != "model"]
        return run_serving(engine, cmd[0], env, folder, nvllm_flags, ROOT, args.server_log)
    extra = [folder, f"--vllm-dtype={args.vllm_dtype}"] if engine == "vllm" else list(args.nvllm_arg)
    count = [f"--num-prompts={args.num_prompts}"] if args.num_prompts else []
    return _run_child(cmd + [name] + extra + count, env)


def _summarize(workloads, conditions, engines, runs, peak, flops_per_token) -> list[dict]:
    rows = []
    print(f"\n{'workload':9} {'condition':9} " + " ".join(f"{e:>10}" for e in engines)
          + ("   nvllm/vLLM" if "vllm" in engines else ""))
    for name in workloads:
        for condition in conditions:
            medians = {e: statistics.median(runs[(name, condition, e)]) for e in engines}
            row = {"workload": name, "condition": condition} | medians
            line = f"{name:9} {condition:9} " + " ".join(f"{medians[e]:10.1f}" for e in engines)
            if "vllm" in engines:
                row["ratio"] = round(medians["nvllm"] / medians["vllm"], 3)
                line += f"   {row['ratio']:.2f}x"
            if condition == "busy":
                for e in engines:
                    row[f"{e}_loss"] = round(1 - medians[e] / statistics.median(runs[(name, 'alone', e)]), 3)
                line += "   lost beside a busy process: " + ", ".join(f"{e} {row[e + '_loss']:.0%}" for e in engines)
            if name == "prefill":
                row["nvllm_fraction_of_peak"] = round(medians["nvllm"] * flops_per_token / 1e9 / peak["peak_gflops"], 3)
                line += f"   nvllm at {row['nvllm_fraction_of_peak']:.0%} of the GEMM peak"
            if name == "serve":
                ttft = {e: statistics.median(runs[("serve-ttft", condition, e)]) for e in engines}
                row["mean_ttft_ms"] = ttft
                line += "   mean TTFT ms: " + ", ".join(f"{e} {ttft[e]:.0f}" for e in engines)
            print(line)
            rows.append(row)
    return rows


def register(kinds, formatter) -> None:
    p = kinds.add_parser("cpu", help="W32, prefill-only and decode-only workloads; against vLLM CPU with --vllm-venv",
                         formatter_class=formatter)
    p.add_argument("model", nargs="?", default=None, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--vllm-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="vLLM's dtype (float32 is its faster choice on a CPU without AVX512-BF16)")
    p.add_argument("--vllm-venv", default=None,
                   help="a vLLM CPU venv (../shared/tools/vllm-cpu-setup.sh) to run the same workloads through")
    p.add_argument("--workloads", type=lambda s: s.split(","), default=list(ALL_WORKLOADS),
                   help=f"comma-separated, of {', '.join(ALL_WORKLOADS)} (serve: each engine's HTTP server driven "
                        "by `nvllm bench serve`'s client, 64 prompts of 128 tokens, 64 out, 16 in flight)")
    p.add_argument("--repeat", type=int, default=3, help="runs per engine and workload (the median is reported)")
    p.add_argument("--num-prompts", type=positive_int, default=None, metavar="N",
                   help="run only the first N requests of w32, prefill and decode (a quicker, noisier run; "
                        "default: all 32)")
    p.add_argument("--busy", action="store_true",
                   help="also run every workload beside a process that keeps one CPU busy, and print the loss")
    p.add_argument("--nvllm-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="an engine argument for nvllm's runs (LLM(KEY=VALUE)), e.g. cpu_threads=2")
    p.add_argument("--settle-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="before each run, wait up to this long for the host's CPUs to go quiet")
    p.add_argument("--output-json", default=None, help="write every run and the summary here")
    p.add_argument("--server-log", default="bench-cpu-servers.log", help="the servers' output goes here")
    p.set_defaults(func=run_suite)
