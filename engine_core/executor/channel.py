"""The core's channel to its tensor-parallel workers: ZeroMQ frames of msgspec messages only.

- step channel, core -> every worker (PUB/SUB): [STEP, StepInput], [HEARTBEAT, b""], [QUIT, b""].
  Each worker runs the same forward pass as rank 0 on the same StepInput; the collectives inside
  the model keep the ranks in lock step, and only rank 0 samples.
- status channel, workers -> core (PUSH/PULL): WorkerStatus (hello, ready, heartbeat, error, bye).

On one host the channels are ipc:// sockets; across hosts tcp:// on node 0's --master-addr.
"""

import socket

import msgspec
import zmq

from common.transport import limit_socket, private_ipc_address

STEP = b"S"
HEARTBEAT = b"H"
QUIT = b"Q"


class WorkerStatus(msgspec.Struct, array_like=True, omit_defaults=True):
    rank: int
    kind: str  # hello | ready | heartbeat | error | bye
    message: str = ""  # with error: what went wrong


status_encoder = msgspec.msgpack.Encoder()
status_decoder = msgspec.msgpack.Decoder(WorkerStatus)


def _unlimited(sock: zmq.Socket) -> None:
    # a worker busy loading weights reads nothing for a while: never drop a frame for it
    limit_socket(sock)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)


def bind_address(ctx_socket: zmq.Socket, host: str | None) -> str:
    """Bind to a private ipc:// address (host None) or a free tcp port on host; the address to dial."""
    if host is None:
        address = private_ipc_address()
        ctx_socket.bind(address)
        return address
    ip = socket.gethostbyname(host)
    try:
        port = ctx_socket.bind_to_random_port(f"tcp://{ip}")
    except zmq.ZMQError:  # host names a NAT or load balancer address rather than an interface
        port = ctx_socket.bind_to_random_port("tcp://*")
    return f"tcp://{host}:{port}"


def step_publisher(ctx: zmq.Context) -> zmq.Socket:
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # one subscription message per worker, to count them
    _unlimited(sock)
    return sock


def step_subscriber(ctx: zmq.Context, address: str) -> zmq.Socket:
    sock = ctx.socket(zmq.SUB)
    _unlimited(sock)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(address)
    return sock


def status_receiver(ctx: zmq.Context) -> zmq.Socket:
    sock = ctx.socket(zmq.PULL)
    _unlimited(sock)
    return sock


def status_sender(ctx: zmq.Context, address: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PUSH)
    _unlimited(sock)
    sock.setsockopt(zmq.LINGER, 2000)  # an error report must get out before the process exits
    sock.connect(address)
    return sock
