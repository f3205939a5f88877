"""Split deployment: `nvllm engine-core` and `nvllm frontend` on separate hosts (network namespaces
joined by a veth pair), CURVE keys, a frontend that outlives a core restart, one frontend on
several cores."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
import yaml

from common.transport import DEAD_AFTER_SECONDS
from tests.support.doc_pages import code_blocks, page
from tests.support.http_helpers import NVLLM, ROOT, Proc, free_port, metric, wait_healthy, wait_until

pytestmark = pytest.mark.integration

WAIT = 120  # the deadline of every wait for something expected within seconds
# how soon a frontend must notice a dead core: within seconds, not at some long timeout (it notices a
# closed connection at once, and silence after DEAD_AFTER_SECONDS); generous for a busy machine
NOTICED = 10 * DEAD_AFTER_SECONDS

TINY_ENGINE = ["--dtype", "float32", "--kv-cache-memory", "32MiB", "--max-model-len", "256"]
FRONTEND_FLAGS = ["--disable-uvicorn-access-log"]


def nvllm_main(argv: list[str]) -> int:
    from frontend.cli.main import main
    return main(argv)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """`nvllm keys generate` twice: the deployment's keys, and an intruder's (never authorized)."""
    root = tmp_path_factory.mktemp("keys")
    assert nvllm_main(["keys", "generate", str(root / "keys")]) == 0
    assert nvllm_main(["keys", "generate", str(root / "intruder")]) == 0
    return SimpleNamespace(dir=str(root / "keys"), intruder=str(root / "intruder"))


# ---- keys ---------------------------------------------------------------------------------------

def test_keys_generate_layout_and_loading(keys, tmp_path, capsys, monkeypatch):
    from common import curve

    d = keys.dir
    names = sorted(os.path.relpath(os.path.join(dp, f), d) for dp, _, fs in os.walk(d) for f in fs)
    assert names == ["authorized/frontend.key", "frontend.key", "frontend.key_secret", "server.key", "server.key_secret"]
    for secret in ("server.key_secret", "frontend.key_secret"):
        assert os.stat(os.path.join(d, secret)).st_mode & 0o077 == 0, f"{secret} is readable by others"

    server = curve.server_keys(keys_dir=d, env={})
    client = curve.client_keys(keys_dir=d, env={})
    assert client.server_public == server.keypair.public
    assert server.authorized == {client.keypair.public}
    # the same keys from explicit files, and from the environment (what compose secrets and env files give)
    assert curve.server_keys(secret_key_file=f"{d}/server.key_secret", authorized=f"{d}/frontend.key", env={}) == server
    env = {curve.ENV_SERVER_SECRET: server.keypair.secret.decode(),
           curve.ENV_AUTHORIZED: f" {client.keypair.public.decode()}, {server.keypair.public.decode()}",
           curve.ENV_CLIENT_SECRET: client.keypair.secret.decode(),
           curve.ENV_CLIENT_PUBLIC: client.keypair.public.decode(),
           curve.ENV_SERVER_PUBLIC: server.keypair.public.decode()}
    from_env = curve.server_keys(env=env)
    assert from_env.keypair == server.keypair and client.keypair.public in from_env.authorized
    assert curve.client_keys(env=env) == client
    # a bare Z85 key in a file works as well as a certificate
    (tmp_path / "bare").write_text(server.keypair.public.decode() + "\n")
    assert curve.read_key_file(str(tmp_path / "bare"), secret=False) == server.keypair.public
    # no keys at all: no CURVE
    assert curve.server_keys(env={}) is None and curve.client_keys(env={}) is None

    with pytest.raises(ValueError, match=curve.ENV_SERVER_SECRET):
        curve.server_keys(env={curve.ENV_SERVER_SECRET: "not a key"})
    with pytest.raises(ValueError, match="does not belong"):
        curve.client_keys(env={**env, curve.ENV_CLIENT_PUBLIC: server.keypair.public.decode()})
    with pytest.raises(ValueError, match="authorized"):
        curve.server_keys(secret_key_file=f"{d}/server.key_secret", env={})
    with pytest.raises(ValueError, match="core's public key"):
        curve.client_keys(secret_key_file=f"{d}/frontend.key_secret", env={})
    with pytest.raises(ValueError, match="only a public key"):
        curve.server_keys(secret_key_file=f"{d}/server.key", authorized=f"{d}/authorized", env={})
    with pytest.raises(FileNotFoundError):
        curve.client_keys(keys_dir=str(tmp_path / "missing"), env={})

    capsys.readouterr()
    assert nvllm_main(["keys", "generate", d]) == 2  # never overwrites keys without --force
    assert "--force" in capsys.readouterr().err
    assert curve.server_keys(keys_dir=d, env={}) == server


def test_insecure_listen_refused_before_any_model_loads(capsys, caplog):
    """A core on a non-loopback address without CURVE: exit 2 at once, naming --allow-insecure."""
    from common.curve import check_listen_security

    started = time.monotonic()
    assert nvllm_main(["engine-core", "/no/such/model", "--listen", "tcp://0.0.0.0:5555"]) == 2
    assert time.monotonic() - started < 30  # well under a second here
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--allow-insecure" in err and "CURVE" in err
    check_listen_security("tcp://127.0.0.1:5555", None, False)  # loopback and ipc need no keys
    check_listen_security("ipc:///tmp/x.sock", None, False)
    with caplog.at_level("WARNING", logger="nvllm"):
        check_listen_security("tcp://0.0.0.0:5555", None, True)
    assert "INSECURE" in caplog.text


# ---- two hosts: network namespaces ---------------------------------------------------------------

def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair, 169.254.N.1 (core) and .2 (frontend), on the
    test's own link; the frontend's /etc/hosts names the core `engine-core`, like compose's network."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2 (`ip`)")
    tag = f"{os.getpid() % 100000}"
    core_ns, front_ns = f"nvllm-core-{tag}", f"nvllm-front-{tag}"
    subnet = 1 + os.getpid() % 250
    core_ip, front_ip = f"169.254.{subnet}.1", f"169.254.{subnet}.2"
    hosts_dir = f"/etc/netns/{front_ns}"
    netns_etc_existed = os.path.isdir("/etc/netns")
    made = []
    try:
        for ns in (core_ns, front_ns):
            try:
                _ip("netns", "add", ns)
            except subprocess.CalledProcessError as e:
                pytest.skip(f"cannot create network namespaces here: {e.stderr.strip()}")
            made.append(ns)
        _ip("link", "add", f"nvc{tag}", "type", "veth", "peer", "name", f"nvf{tag}")
        _ip("link", "set", f"nvc{tag}", "netns", core_ns)
        _ip("link", "set", f"nvf{tag}", "netns", front_ns)
        for ns, dev, addr in ((core_ns, f"nvc{tag}", core_ip), (front_ns, f"nvf{tag}", front_ip)):
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        os.makedirs(hosts_dir, exist_ok=True)  # `ip netns exec` mounts this over /etc/hosts
        with open(f"{hosts_dir}/hosts", "w") as f:
            f.write(f"127.0.0.1 localhost\n{core_ip} engine-core\n")
        yield SimpleNamespace(core_ns=core_ns, front_ns=front_ns, core_ip=core_ip, front_ip=front_ip)
    finally:
        shutil.rmtree(hosts_dir, ignore_errors=True)
        if not netns_etc_existed:
            try:
                os.rmdir("/etc/netns")
            except OSError:
                pass
        for ns in made:  # the veth pair goes with its namespaces
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


class NsProc(Proc):
    """An `nvllm ...` process inside a network namespace."""

    def __init__(self, ns: str, args: list[str], log_path: str, env: dict | None = None, cwd: str = ROOT):
        self.log_path = log_path
        self.log_file = open(log_path, "w")
        full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        full_env.update(env or {})
        self.proc = subprocess.Popen(["ip", "netns", "exec", ns, *NVLLM, *args], cwd=cwd, stdout=self.log_file,
                                     stderr=subprocess.STDOUT, env=full_env)


def ns_python(ns: str, code: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)


def ns_json(ns: str, code: str, timeout: float = 120) -> dict:
    out = ns_python(ns, code, timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# polls /health until it says `want` (or the timeout); prints the last answer
WAIT_HEALTH = """
import httpx, json, time
deadline, last = time.monotonic() + {timeout}, None
while time.monotonic() < deadline:
    try:
        last = httpx.get("{base}/health", timeout=5)
        if last.status_code == {want}:
            break
    except httpx.HTTPError as e:
        last = e
    time.sleep(0.5)
print(json.dumps({{"status": getattr(last, "status_code", None), "body": getattr(last, "text", str(last))}}))
"""

OPENAI_CLIENT = """
import json, openai
client = openai.OpenAI(base_url="{base}/v1", api_key="unused", max_retries=0, timeout=120)
model = client.models.list().data[0].id
out = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0,
                                extra_body={{"ignore_eos": True}})
chat = client.chat.completions.create(model=model, messages=[{{"role": "user", "content": "Hi!"}}], max_tokens=6,
                                      stream=True)
pieces = [c.choices[0].delta.content or "" for c in chat if c.choices]
print(json.dumps({{"model": model, "text": out.choices[0].text, "tokens": out.usage.completion_tokens,
                  "chat_chunks": len(pieces)}}))
"""

HOSTILE_PEERS = """
import json, msgspec, zmq
from common import curve, wire_messages as P
keys = curve.client_keys(keys_dir={keys!r}, env={{}})
intruder = curve.client_keys(keys_dir={intruder!r}, env={{}})
peers = {{
    "plain": None,  # no CURVE at all
    "unauthorized_client_key": curve.ClientKeys(intruder.keypair, keys.server_public),
    "wrong_server_key": curve.ClientKeys(keys.keypair, intruder.server_public),  # someone posing as the core
}}
ctx = zmq.Context()
socks = {{}}
for name, peer_keys in peers.items():
    sock = socks[name] = ctx.socket(zmq.DEALER)
    sock.linger = 0
    if peer_keys is not None:
        curve.apply_client(sock, peer_keys)
    sock.connect("tcp://engine-core:5555")
    sock.send_multipart([P.HELLO, msgspec.msgpack.encode(P.Hello(P.PROTOCOL_VERSION, name))])
    sock.send_multipart([P.ADD, msgspec.msgpack.encode([1, 2, 3])])
poller = zmq.Poller()
for sock in socks.values():
    poller.register(sock, zmq.POLLIN)
heard = {{s for s, _ in poller.poll(3000)}}
for sock in socks.values():
    sock.close()
print(json.dumps({{name: sock in heard for name, sock in socks.items()}}))
"""


def deploy_page_command(prefix: str) -> list[str]:
    """The command of the deployment page (docs/deployment/index.md) that starts with `prefix` (comments cut)."""
    for block in code_blocks(page("deployment/index.md"), "bash"):
        for line in block.splitlines():
            if line.startswith(prefix):
                return line.split(" #", 1)[0].split()
    raise AssertionError(f"docs/deployment/index.md has no command starting with {prefix!r}")


def _compose():
    with open(os.path.join(ROOT, "compose.yaml")) as f:
        return yaml.safe_load(f)


def compose_argv(service: str, secrets_dir: str, key: str = "command") -> list[str]:
    """A compose service's command (or healthcheck) with its /run/secrets/NAME paths pointing at the
    files the compose file maps them from (./keys/... -> secrets_dir/...)."""
    compose = _compose()
    svc = compose["services"][service]
    argv = list(svc["healthcheck"]["test"][1:] if key == "healthcheck" else svc["command"])
    files = {name: spec["file"] for name, spec in compose["secrets"].items()}
    out = []
    for arg in argv:
        if arg.startswith("/run/secrets/"):
            arg = os.path.join(secrets_dir, os.path.relpath(files[arg.rsplit("/", 1)[1]], "./keys"))
        out.append(arg)
    return out


def test_two_hosts_with_curve(two_hosts, keys, tmp_path):
    """Each side in its own network namespace, CURVE on: the core as the deployment page starts it by hand, with
    only the core host's key files; the frontend as compose.yaml starts it, with only its two key
    files, reaching the core as tcp://engine-core:5555 over the veth pair. The openai client gets
    completions; a frontend with an unauthorized key, a plain ZeroMQ peer and a peer with the wrong
    core key get nothing, and the core keeps serving the good frontend. Both compose healthchecks pass."""
    hosts = two_hosts
    core_cmd = deploy_page_command("nvllm engine-core --listen tcp://0.0.0.0")
    front_cmd = compose_argv("frontend", keys.dir)
    assert core_cmd[:2] == ["nvllm", "engine-core"] and front_cmd[:2] == ["nvllm", "frontend"]
    core_host = tmp_path / "gpu-host"  # what the deployment page says to copy to the core's host, and nothing else
    os.makedirs(core_host / "keys" / "authorized")
    for name in ("server.key_secret", "authorized/frontend.key"):
        shutil.copy(os.path.join(keys.dir, name), core_host / "keys" / name)
    # without keys, a core refuses this address (before loading anything)
    refused = NsProc(hosts.core_ns, ["engine-core", "--listen", f"tcp://{hosts.core_ip}:5556"],
                     str(tmp_path / "refused.log"))
    assert refused.proc.wait(WAIT) == 2 and "--allow-insecure" in refused.log()
    refused.stop()

    core = NsProc(hosts.core_ns, core_cmd[1:] + ["--kv-cache-memory", "256MiB", "--max-model-len", "2048"],
                  str(tmp_path / "core.log"), cwd=str(core_host))
    front = NsProc(hosts.front_ns, front_cmd[1:] + FRONTEND_FLAGS, str(tmp_path / "frontend.log"))
    # the intruder knows the core's public key but its own key is not authorized
    intruder = NsProc(hosts.front_ns, ["frontend", "--engine", "tcp://engine-core:5555", "--port", "8001",
                                       "--curve-secret-key", f"{keys.intruder}/frontend.key_secret",
                                       "--curve-server-key", f"{keys.dir}/server.key"] + FRONTEND_FLAGS,
                      str(tmp_path / "intruder.log"))
    base = "http://127.0.0.1:8000"
    try:
        health = ns_json(hosts.front_ns, WAIT_HEALTH.format(base=base, want=200, timeout=300), timeout=320)
        assert health["status"] == 200, (health, core.log()[-3000:], front.log()[-3000:])
        first = ns_json(hosts.front_ns, OPENAI_CLIENT.format(base=base))
        assert first["model"] == "SmolLM2-135M-Instruct" and first["tokens"] == 8 and first["chat_chunks"] >= 2
        with open(f"/proc/{front.proc.pid}/maps") as f:
            assert "libtorch" not in f.read(), "the frontend loaded torch"

        # the compose healthchecks, as docker would run them inside each container
        check = ns_python(hosts.core_ns, "import sys; from frontend.cli.main import main; sys.exit(main(%r))"
                          % compose_argv("engine-core", keys.dir, "healthcheck")[1:])
        assert check.returncode == 0 and "ready" in check.stdout, check.stdout + check.stderr
        front_check = compose_argv("frontend", keys.dir, "healthcheck")
        assert front_check[0] == "python"
        probe = ns_python(hosts.front_ns, front_check[2])
        assert probe.returncode == 0, probe.stderr

        hostile = ns_json(hosts.front_ns, HOSTILE_PEERS.format(keys=keys.dir, intruder=keys.intruder))
        assert hostile == {"plain": False, "unauthorized_client_key": False, "wrong_server_key": False}
        # as soon as the intruder answers HTTP at all (a busy machine may take a while to start it)
        answer = ns_json(hosts.front_ns, WAIT_HEALTH.format(base="http://127.0.0.1:8001", want=503, timeout=WAIT),
                         timeout=WAIT + 20)
        assert answer["status"] == 503 and "starting" in answer["body"], answer  # it never got READY
        wait_until(lambda: "refused this frontend's CURVE key" in intruder.log(), WAIT, what="the intruder's log")
        # and its /health says why, not only that it is starting
        refusal = ns_json(hosts.front_ns, WAIT_HEALTH.format(base="http://127.0.0.1:8001", want=503, timeout=WAIT),
                          timeout=WAIT + 20)
        assert refusal["status"] == 503 and "refused this frontend's CURVE key" in refusal["body"], refusal
        wait_until(lambda: "refused a frontend whose CURVE public key" in core.log(), WAIT, what="the core's log")

        again = ns_json(hosts.front_ns, OPENAI_CLIENT.format(base=base))
        assert again["text"] == first["text"]  # greedy: the same answer, from the same core
        assert core.proc.poll() is None and front.proc.poll() is None
    finally:
        intruder.stop()
        front.stop()
        core.stop()


# ---- a core restart under a running frontend -----------------------------------------------------

def _status(base: str, path: str = "/health") -> tuple[int, str]:
    try:
        r = httpx.get(base + path, timeout=WAIT)
        return r.status_code, r.text
    except httpx.HTTPError as e:
        return 0, str(e)


def _complete(base: str, model: str | None = None, max_tokens: int = 4) -> httpx.Response:
    body = {"prompt": "hello there", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if model:
        body["model"] = model
    return httpx.post(base + "/v1/completions", json=body, timeout=120)


def _wait_running(base: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while metric(httpx.get(base + "/metrics", timeout=WAIT).text, "nvllm:num_requests_running") < 1:
        assert time.monotonic() < deadline, "the request never started running"
        time.sleep(0.01)


def _wait_status(base: str, want: int, timeout: float) -> float:
    started = time.monotonic()
    while _status(base)[0] != want:
        assert time.monotonic() - started < timeout, f"/health did not turn {want} within {timeout} s"
        time.sleep(0.2)
    return time.monotonic() - started


def test_frontend_survives_core_restarts(tiny_models, tmp_path):
    """Kill the core: the frontend answers 503 (saying it reconnects) within seconds; start a core
    with another model at the same address: the same frontend serves it, /v1/models shows it; a
    core stopped with SIGTERM is noticed at once."""
    address = f"tcp://127.0.0.1:{free_port()}"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    front = Proc(["frontend", "--engine", address, "--host", "127.0.0.1", "--port", str(port)] + FRONTEND_FLAGS,
                 str(tmp_path / "frontend.log"))
    cores = []

    def start_core(model: str, *flags: str) -> Proc:
        cores.append(Proc(["engine-core", model, "--listen", address, *TINY_ENGINE, *flags],
                          str(tmp_path / f"core{len(cores)}.log")))
        wait_healthy(base, front, timeout=300)
        return cores[-1]

    try:
        core = start_core(tiny_models["llama"], "--max-num-seqs", "1")  # long requests run one at a time
        assert [m["id"] for m in httpx.get(base + "/v1/models", timeout=WAIT).json()["data"]] == [tiny_models["llama"]]
        assert _complete(base).status_code == 200

        # long requests are running or waiting when the core dies: they end with an error, not a hang
        # (the tiny model makes 250 tokens in about 0.4 s: four of them, one at a time, outlast the kill)
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(_complete(base, max_tokens=250))) for _ in range(4)]
        for thread in threads:
            thread.start()
        _wait_running(base)
        core.proc.kill()
        took = _wait_status(base, 503, timeout=WAIT)
        assert took < NOTICED, f"the frontend noticed the dead core only after {took:.1f} s"
        for thread in threads:
            thread.join(WAIT)
        codes = sorted(r.status_code for r in answers)
        assert len(codes) == 4 and set(codes) <= {200, 503} and codes[-1] == 503, [r.text for r in answers]
        r = _complete(base)
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
        assert "reconnecting" in r.json()["error"]["message"], r.text
        assert "nvllm:engine_up 0.0" in httpx.get(base + "/metrics", timeout=WAIT).text

        start_core(tiny_models["qwen3"])  # another model at the same address
        assert [m["id"] for m in httpx.get(base + "/v1/models", timeout=WAIT).json()["data"]] == [tiny_models["qwen3"]]
        assert _complete(base, tiny_models["qwen3"]).status_code == 200
        assert _complete(base, tiny_models["llama"]).status_code == 404
        assert "nvllm:engine_up 1.0" in httpx.get(base + "/metrics", timeout=WAIT).text

        cores[-1].stop(signal.SIGTERM)  # a clean stop says SHUTDOWN: noticed at once
        assert _wait_status(base, 503, timeout=WAIT) < NOTICED
        start_core(tiny_models["qwen3"])
        assert _complete(base).status_code == 200
        assert front.proc.poll() is None, "the frontend restarted"
        assert front.log().count("lost the engine core") == 2
    finally:
        for core in cores:
            core.stop()
        code = front.stop(signal.SIGTERM)
    assert code == 0, front.log()[-3000:]


# ---- one frontend, two cores ----------------------------------------------------------------------

def test_router_picks_least_loaded_core():
    from common.wire_messages import SchedulerGauges, SchedulerStats
    from frontend.async_engine.engine_router import EngineRouter, sum_stats

    clients = [SimpleNamespace(dead_reason=None, address=f"tcp://h{i}:5555") for i in range(3)]
    router = EngineRouter(clients, None)
    for link in router.links:
        link.up, link.fingerprint = True, "m"
    router.links[0].note_stats(SchedulerStats(gauges=SchedulerGauges(num_running=4, num_waiting=2)))
    router.links[1].note_stats(SchedulerStats(gauges=SchedulerGauges(num_running=3)))
    router.links[2].note_stats(SchedulerStats(gauges=SchedulerGauges(num_running=1, num_waiting=1)))
    assert router.pick("m").index == 2
    router.links[2].sent_since_stats = 2  # sent there since its last stats: now 4 > 3
    assert router.pick("m").index == 1
    assert router.pick("m", exclude=[router.links[1]]).index == 2
    clients[1].dead_reason = "gone"
    assert router.pick("m").index == 2
    assert router.pick("other") is None
    for link in router.links:  # equal loads take turns
        link.note_stats(SchedulerStats())
    clients[1].dead_reason = None
    assert [router.pick("m").index for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    total = sum_stats([SchedulerStats(gauges=SchedulerGauges(num_running=1, num_free_blocks=10, num_total_blocks=20,
                                                             kv_cache_usage=0.5)),
                       SchedulerStats(gauges=SchedulerGauges(num_running=2, num_free_blocks=30, num_total_blocks=60,
                                                             kv_cache_usage=0.5))])
    assert (total.gauges.num_running, total.gauges.num_free_blocks, total.gauges.num_total_blocks) == (3, 40, 80)
    assert total.gauges.kv_cache_usage == pytest.approx(0.5)


def test_one_frontend_two_cores(tiny_models, tmp_path):
    """`--engine A --engine B`: requests spread over both cores; kill one and every request after
    that still succeeds."""
    from frontend.offline.llm import LLM

    addresses = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cores = [Proc(["engine-core", tiny_models["llama"], "--listen", a, *TINY_ENGINE], str(tmp_path / f"core{i}.log"))
             for i, a in enumerate(addresses)]
    front = Proc(["frontend", "--engine", addresses[0], "--engine", addresses[1], "--host", "127.0.0.1",
                  "--port", str(port)] + FRONTEND_FLAGS, str(tmp_path / "frontend.log"))
    try:
        wait_healthy(base, front, timeout=300)
        deadline = time.monotonic() + WAIT  # the second core may answer a moment after the first
        while not all(f"engine core at {a} is up" in front.log() for a in addresses):
            assert time.monotonic() < deadline, front.log()[-3000:]
            time.sleep(0.2)
        served = []
        for a in addresses:
            llm = LLM.connect(a)
            served.append(llm.get_stats().totals.prefix_cache_queries)
            llm.shutdown()
        results = []

        def send(n):
            results.extend(_complete(base, max_tokens=8).status_code for _ in range(n))

        threads = [threading.Thread(target=send, args=(2,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results == [200] * 8
        for _ in range(4):  # one at a time: the idle cores take turns
            assert _complete(base).status_code == 200
        for a, before in zip(addresses, served):
            llm = LLM.connect(a)
            assert llm.get_stats().totals.prefix_cache_queries > before, f"no request reached the core at {a}"
            llm.shutdown()

        cores[0].proc.kill()  # requests right away: any sent to the dead core move to the live one
        results.clear()
        threads = [threading.Thread(target=send, args=(3,)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results == [200] * 9, front.log()[-3000:]
        assert _status(base)[0] == 200
        assert "lost the engine core at " + addresses[0] in front.log()
    finally:
        front.stop()
        for core in cores:
            core.stop()
