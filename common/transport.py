"""ZeroMQ plumbing both services share: addresses, socket limits, CURVE keys."""

import os
import tempfile
import uuid

import zmq

MAX_FRAME_BYTES = 256 * 1024 * 1024  # tokenizer files at handshake are the largest frames
# what the core accepts from a frontend: a request of a million-token prompt with every list at its limit is
# under 10 MB; a bigger frame closes that connection before it is decoded into memory
MAX_REQUEST_FRAME_BYTES = 64 * 1024 * 1024
HEARTBEAT_SECONDS = 0.5  # the core says something to each frontend, and each waiting frontend to the core, this often
DEAD_AFTER_SECONDS = 3.0  # silence after which a frontend declares the core dead
FRONTEND_SILENT_SECONDS = 10.0  # silence after which the core ends a frontend's session (aborts its requests)
ENV_FRONTEND_SILENT = "NVLLM_FRONTEND_SILENT_SECONDS"  # overrides FRONTEND_SILENT_SECONDS in the core (tests)
# Per connection the core queues at most CORE_SNDHWM frames for a frontend that does not read (then it ends the
# session): one full READY (the tokenizer files, ~3.5 MB for SmolLM2; sent once per connection) plus frames of at
# most one step's outputs each (usually a few KB; ~100 KB with top-20 logprobs for 256 sequences), so ~10-100 MB.
CORE_SNDHWM = 1000
# frames ZeroMQ holds per frontend while the core's IO thread is not reading (it is behind): the sender waits
CORE_RCVHWM = 64


def frontend_silent_seconds(env=None) -> float:
    """The core's limit on frontend silence: FRONTEND_SILENT_SECONDS, or $NVLLM_FRONTEND_SILENT_SECONDS."""
    text = (os.environ if env is None else env).get(ENV_FRONTEND_SILENT, "").strip()
    try:
        value = float(text) if text else FRONTEND_SILENT_SECONDS
    except ValueError:
        raise ValueError(f"${ENV_FRONTEND_SILENT} must be a number of seconds, got {text!r}") from None
    if not value > 2 * HEARTBEAT_SECONDS:
        raise ValueError(f"${ENV_FRONTEND_SILENT} must be more than {2 * HEARTBEAT_SECONDS} s, got {value}")
    return value


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
