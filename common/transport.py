"""ZeroMQ plumbing both services share: addresses, socket limits, CURVE keys."""

import os
import tempfile
import uuid

import zmq

MAX_FRAME_BYTES = 256 * 1024 * 1024  # tokenizer files at handshake are the largest frames
HEARTBEAT_SECONDS = 0.5  # the core says something at least this often
DEAD_AFTER_SECONDS = 3.0  # silence after which a frontend declares the core dead


def private_ipc_address() -> str:
    """An ipc:// address in a fresh folder only this user can enter."""
    folder = tempfile.mkdtemp(prefix="nvllm-")
    os.chmod(folder, 0o700)
    return f"ipc://{os.path.join(folder, 'engine.sock')}"


def new_identity() -> bytes:
    return uuid.uuid4().bytes


def is_loopback(address: str) -> bool:
    if address.startswith(("ipc://", "inproc://")):
        return True
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def limit_socket(sock: zmq.Socket) -> None:
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.LINGER, 0)
