"""Starting real `nvllm` processes for the HTTP tests (a helper module, not a test module)."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from tests.support.paths import ROOT

NVLLM = [sys.executable, "-m", "frontend.cli.main"]  # `nvllm` without needing `pip install -e .`
SMALL_ENGINE = ["--kv-cache-memory", "512MiB", "--max-model-len", "2048"]


_GIVEN_PORTS: set[int] = set()


def free_port() -> int:
    """A port nobody listens on now, never one this test process was given before: the kernel may hand
    the same free port to two bind(0) calls in a row, and two services of one test then collide."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


class Proc:
    """An `nvllm ...` process whose output goes to a log file (read it with .log())."""

    def __init__(self, args: list[str], log_path: str, env: dict | None = None):
        self.log_path = log_path
        self.log_file = open(log_path, "w")
        full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        full_env.update(env or {})
        # SIGINT as a terminal gives it: a test run started in the background of a script inherits
        # SIGINT ignored, and then `nvllm serve` would stop on SIGINT but not exit 130
        self.proc = subprocess.Popen(NVLLM + args, cwd=ROOT, stdout=self.log_file, stderr=subprocess.STDOUT,
                                     env=full_env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def children(self) -> list[int]:
        """Pids of this process's child processes (the engine core of `nvllm serve`)."""
        kids = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                            kids.append(int(pid))
                except (OSError, IndexError, ValueError):
                    pass
        return kids

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()
        return self.proc.returncode


def wait_healthy(base_url: str, proc: Proc, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"nvllm exited with {proc.proc.returncode} before it was ready:\n{proc.log()[-5000:]}")
        try:
            if httpx.get(f"{base_url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"nvllm did not become healthy in {timeout} s:\n{proc.log()[-5000:]}")


def start_serve(args: list[str], log_path: str, host: str = "127.0.0.1",
                env: dict | None = None) -> tuple[str, int, Proc]:
    """(base url, port, Proc) of `nvllm serve ARGS` on a free port, once healthy; stopped if it never is. `env`:
    variables to set for it."""
    port = free_port()
    proc = Proc(["serve", *args, "--host", host, "--port", str(port)], log_path, env)
    base = f"http://{host}:{port}"
    try:
        wait_healthy(base, proc)
    except BaseException:
        proc.stop()
        raise
    return base, port, proc


@contextlib.contextmanager
def serving(args: list[str], log_dir, env: dict | None = None):
    """(base url, Proc) of `nvllm serve ARGS` (access log off, small KV cache) for a test module; at the end it
    must stop cleanly on SIGTERM."""
    base, _, proc = start_serve(["--disable-uvicorn-access-log", *args, *SMALL_ENGINE], str(log_dir / "serve.log"),
                                env=env)
    yield base, proc
    assert proc.stop(signal.SIGTERM) == 0, proc.log()[-3000:]


def openai_client(base_url: str):
    """The official client on a test server: no retries (a failure shows at once), long timeouts (busy CPUs)."""
    import openai
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


def wait_until(condition, timeout: float = 120, interval: float = 0.1, what: str = ""):
    """`condition()`'s first truthy value, polled every `interval` s; fails after `timeout` s. Tests wait for the
    event they need with a deadline far above the expected time: a fixed sleep or a tight deadline guessed on
    an idle machine fails on a busy one."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {timeout} s for {what or condition}"
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)
