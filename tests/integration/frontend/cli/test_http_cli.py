"""The `nvllm` command line: help, bad flags, `serve` on an HF folder and a GGUF file with an API key,
the split `engine-core` + `frontend` pair (503 before the core is up and after it dies), shutdown."""

import argparse
import os
import signal
import time

import httpx
import openai
import pytest

from common.cache_dir import cache_dir
from tests.support.http_helpers import Proc, free_port, pid_alive, wait_healthy

pytestmark = pytest.mark.integration

TINY_ENGINE = ["--dtype", "float32", "--kv-cache-memory", "32MiB", "--max-model-len", "256",
               "--disable-uvicorn-access-log"]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    from frontend.cli.reference import subcommands

    return {name: sub for name, sub, _ in subcommands(parser)}


def test_help_lists_every_flag_with_its_default(capsys):
    from frontend.cli.main import build_parser, main

    commands = subparsers(build_parser())
    assert {"serve", "engine-core", "frontend", "bench", "bench serve", "bench throughput"} <= set(commands)
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    top = capsys.readouterr().out
    for name in ("serve", "engine-core", "frontend", "bench"):
        assert name in top
    for name in ("serve", "engine-core", "frontend", "bench serve", "bench throughput"):
        parser = commands[name]
        with pytest.raises(SystemExit):
            main(name.split() + ["--help"])
        text = " ".join(capsys.readouterr().out.split())
        for action in parser._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.option_strings[-1] in text, (name, action.option_strings)
            assert action.help, (name, action.option_strings)
            if action.default is argparse.SUPPRESS:
                assert "default:" in action.help, (name, action.option_strings)
            else:
                assert f"(default: {action.default})" in text, (name, action.option_strings)
    serve_flags = {s for a in commands["serve"]._actions for s in a.option_strings}
    assert {"--host", "--port", "--api-key", "--served-model-name", "--dtype", "--max-model-len", "--max-num-seqs",
            "--max-num-batched-tokens", "--block-size", "--kv-cache-memory", "--gpu-memory-utilization",
            "--enable-prefix-caching", "--no-enable-prefix-caching", "--tensor-parallel-size", "-tp", "--seed",
            "--log-level"} <= serve_flags


@pytest.mark.parametrize("argv", [
    ["serve", "--port", "abc"], ["serve", "--port", "70000"], ["serve", "--max-num-seqs", "0"],
    ["serve", "--dtype", "int3"], ["serve", "--gpu-memory-utilization", "1.5"], ["serve", "--bogus"],
    ["serve", "--block-size", "3"], ["frontend", "--engine", "localhost"], ["engine-core", "--listen", "nowhere"],
    ["bench", "serve", "--request-rate", "0"], ["bench", "serve", "--num-prompts", "x"],
])
def test_bad_flag_is_one_line_and_exit_2(argv, capsys):
    from frontend.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error:" in err, err


def test_busy_port_is_one_line_and_exit_2(capsys):
    import socket

    from frontend.cli.main import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert main(["serve", "--host", "127.0.0.1", "--port", str(s.getsockname()[1])]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "cannot listen" in err


def _complete(base: str, key: str | None, model: str) -> str:
    client = openai.OpenAI(base_url=base + "/v1", api_key=key or "unused", max_retries=0, timeout=120)
    out = client.completions.create(model=model, prompt="hello", max_tokens=4, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 4
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                          stream=True)
    assert sum(1 for c in chat if c.choices) >= 2
    return out.choices[0].text


def _check_api_key(base: str, key: str, model: str) -> None:
    body = {"model": model, "prompt": "hello", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": key}):
        r = httpx.post(base + "/v1/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(base + "/health").status_code == 200  # health, metrics and version need no key
    assert httpx.get(base + "/metrics").status_code == 200
    _complete(base, key, model)


def test_serve_hf_folder_with_env_api_key_then_sigint(tiny_models, tmp_path):
    """docs/serving: `nvllm serve ./FOLDER --port 8001`; the key from NVLLM_API_KEY; SIGINT stops both processes."""
    port = free_port()
    proc = Proc(["serve", tiny_models["llama"], "--host", "127.0.0.1", "--port", str(port), *TINY_ENGINE],
                str(tmp_path / "serve.log"), env={"NVLLM_API_KEY": "s3cret"})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        children = proc.children()
        models = httpx.get(base + "/v1/models", headers={"Authorization": "Bearer s3cret"}).json()
        assert [m["id"] for m in models["data"]] == [tiny_models["llama"]]
        _check_api_key(base, "s3cret", tiny_models["llama"])
    finally:
        code = proc.stop(signal.SIGINT)
    assert code == 130, proc.log()[-3000:]
    time.sleep(0.5)
    assert children and not any(pid_alive(pid) for pid in children)


def test_serve_gguf_file_with_api_key_flag(tmp_path):
    """docs/serving: `nvllm serve ./model.Q4_1.gguf --api-key secret`, on a tiny synthetic GGUF; SIGTERM exits 0."""
    from tests.support.gguf_writing import write_gguf

    gguf_path = str(tmp_path / "tiny.gguf")
    write_gguf(gguf_path, "llama")
    # a cache of its own for the import; the kernels built so far are shared (a build of them all took a minute)
    kernels = os.path.join(cache_dir(), "kernels")
    os.makedirs(kernels, exist_ok=True)
    os.makedirs(tmp_path / "cache")
    os.symlink(kernels, tmp_path / "cache" / "kernels")
    port = free_port()
    proc = Proc(["serve", gguf_path, "--api-key", "secret", "--served-model-name", "tiny", "--host", "127.0.0.1",
                 "--port", str(port), *TINY_ENGINE], str(tmp_path / "serve.log"),
                env={"NVLLM_CACHE": str(tmp_path / "cache")})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        _check_api_key(base, "secret", "tiny")
        r = httpx.post(base + "/v1/completions", json={"model": "other", "prompt": "x"},
                       headers={"Authorization": "Bearer secret"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    finally:
        code = proc.stop(signal.SIGTERM)
    assert code == 0, proc.log()[-3000:]


def gpt2_folder(path) -> str:
    """A model folder of an architecture nvllm does not run."""
    import transformers
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128,
                            architectures=["GPT2LMHeadModel"]).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("model, reason", [
    (lambda tmp: str(tmp / "missing.gguf"), "not found"),
    (lambda tmp: gpt2_folder(tmp / "gpt2"), "architecture GPT2LMHeadModel is not supported; nvllm runs"),
])
def test_serve_exits_when_the_engine_cannot_start(tmp_path, model, reason):
    """Exit code 1, and the server's own log line gives the core's reason."""
    port = free_port()
    proc = Proc(["serve", model(tmp_path), "--host", "127.0.0.1", "--port", str(port)], str(tmp_path / "serve.log"))
    try:
        proc.proc.wait(timeout=120)
    finally:
        code = proc.stop()
    assert code == 1
    failed = [line for line in proc.log().splitlines() if "the engine core failed to start: " in line]
    assert failed and reason in failed[0]


def test_split_frontend_then_engine_core_then_core_death(tiny_models, tmp_path):
    """`nvllm frontend --engine ADDR` answers 503 until `nvllm engine-core --listen ADDR` is up,
    serves while it is, and 503 again once it is gone."""
    core_addr = f"tcp://127.0.0.1:{free_port()}"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    front = Proc(["frontend", "--engine", core_addr, "--host", "127.0.0.1", "--port", str(port),
                  "--disable-uvicorn-access-log"], str(tmp_path / "frontend.log"))
    core = None
    try:
        deadline = time.monotonic() + 60
        while True:  # the frontend listens at once and says 503 while it waits for the core
            try:
                r = httpx.get(base + "/health")
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and front.proc.poll() is None, front.log()
                time.sleep(0.2)
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
        r = httpx.post(base + "/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503 and "starting" in r.json()["error"]["message"]
        assert httpx.get(base + "/metrics").status_code == 200

        core = Proc(["engine-core", tiny_models["qwen3"], "--listen", core_addr, "--dtype", "float32",
                     "--kv-cache-memory", "32MiB", "--max-model-len", "256"], str(tmp_path / "core.log"))
        wait_healthy(base, front, timeout=300)
        _complete(base, None, tiny_models["qwen3"])
        with open(f"/proc/{front.proc.pid}/maps") as f:
            assert "libtorch" not in f.read(), "the frontend process loaded torch"
        with open(f"/proc/{core.proc.pid}/environ", "rb") as f:  # it restarted itself with huge-page malloc
            assert b"GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in f.read().split(b"\0")

        core.proc.kill()  # the core dies: 503 within a few heartbeats, with an error body
        deadline = time.monotonic() + 30
        while httpx.get(base + "/health", timeout=30).status_code != 503:
            assert time.monotonic() < deadline
            time.sleep(0.3)
        r = httpx.post(base + "/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
        assert "nvllm:engine_up 0.0" in httpx.get(base + "/metrics").text
    finally:
        if core is not None:
            core.stop()
        code = front.stop(signal.SIGTERM)
    assert code == 0, front.log()[-3000:]
