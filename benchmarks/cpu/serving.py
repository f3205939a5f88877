"""The serving workload of `nvllm bench cpu`: start a server (nvllm, or vLLM from its venv), wait until it is
healthy, drive it with `nvllm bench serve`'s client (64 prompts of 128 random token ids, 64 output tokens,
EOS ignored, 16 in flight), stop it. The figures are request throughput and mean TTFT / TPOT."""

import argparse
import asyncio
import os
import socket
import subprocess
import time

import httpx

from benchmarks.serving import serve as bench_serve

SERVED_NAME = "SmolLM2-135M-Instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was healthy")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"the server was not healthy within {timeout:.0f} s")


def server_command(engine: str, python: str, model_dir: str, port: int, nvllm_args: list[str]) -> list[str]:
    """vLLM serves model_dir; nvllm what nvllm_args name (a model first, positional), else its default model, as
    its offline runs do."""
    if engine == "nvllm":
        return [python, "-m", "frontend.cli.main", "serve", "--served-model-name", SERVED_NAME,
                "--dtype", "bfloat16", "--max-model-len", "2048", "--port", str(port), "--log-level", "warning",
                *nvllm_args]
    return [os.path.join(os.path.dirname(python), "vllm"), "serve", model_dir, "--served-model-name", SERVED_NAME,
            "--dtype", "bfloat16", "--max-model-len", "2048", "--port", str(port)]


def run_serving(engine: str, python: str, env: dict, model_dir: str, nvllm_args: list[str], cwd: str,
                log_path: str) -> dict:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(server_command(engine, python, model_dir, port, nvllm_args), env=env, cwd=cwd,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(base, proc)
        args = argparse.Namespace(
            base_url=base, endpoint="/v1/completions", model=SERVED_NAME, api_key=None, num_prompts=64,
            max_concurrency=16, request_rate=float("inf"), random_input_len=128, random_output_len=64,
            random_range_ratio=0.0, ignore_eos=True, seed=0, timeout=600.0)
        figures = asyncio.run(bench_serve.run(args))
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if figures["completed"] != args.num_prompts:
        raise RuntimeError(f"{engine}: only {figures['completed']} of {args.num_prompts} requests completed")
    return {"workload": "serve", "tok_s": round(figures["request_throughput"], 3), "unit": "req/s",
            "mean_ttft_ms": figures["mean_ttft_ms"], "mean_tpot_ms": figures["mean_tpot_ms"]}
