"""`nvllm engine-core --check`: a health check that says HELLO to the core and waits for READY; it
loads no model, so a container's health check can run it beside the core."""

import argparse
import sys
import time

import zmq

from common import curve
from common import wire_messages as P
from common.cli.curve_args import core_keys
from common.handshake import CoreRejected, hello_frames, read_answer
from common.transport import limit_socket

CHECK_TIMEOUT_SECONDS = 5.0


def check_address(listen: str) -> str:
    """Where a check on the core's own host connects for a core bound to `listen`."""
    scheme, _, rest = listen.partition("://")
    if scheme != "tcp":
        return listen
    host, _, port = rest.rpartition(":")
    host = {"0.0.0.0": "127.0.0.1", "*": "127.0.0.1", "[::]": "[::1]", "::": "[::1]"}.get(host, host)
    return f"tcp://{host}:{port}"


def check_core(address: str, server_keys=None, timeout: float = CHECK_TIMEOUT_SECONDS) -> tuple[bool, str]:
    """HELLO to the core at `address`; (True, its model) on READY. With the core's keys, the check
    connects as the core itself (the core always accepts its own public key)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        limit_socket(sock)
        if server_keys is not None:
            curve.apply_client(sock, curve.ClientKeys(server_keys.keypair, server_keys.keypair.public))
        sock.connect(address)
        sock.send_multipart(hello_frames("healthcheck"))
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(int(left * 1000) + 1):
                break
            frames = sock.recv_multipart()
            try:
                info = read_answer(frames[0], frames[1] if len(frames) > 1 else b"")
            except CoreRejected as e:
                return False, str(e)
            if info is not None:
                sock.send_multipart([P.GOODBYE, b""])
                return True, info.model_name
        return False, f"no READY within {timeout:.0f} s"
    finally:
        sock.close(linger=200)
        ctx.term()


def run_check(ns: argparse.Namespace) -> int:
    address = check_address(ns.listen)
    ok, detail = check_core(address, core_keys(ns, need_authorized=False))
    if ok:
        print(f"engine core at {address} is ready, serving {detail}")
        return 0
    print(f"engine core at {address} is not ready: {detail}", file=sys.stderr)
    return 1
