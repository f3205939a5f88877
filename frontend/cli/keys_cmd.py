"""CURVE keys on the command line: `nvllm keys generate DIR`, the key flags of `nvllm engine-core`
and `nvllm frontend`, and `nvllm engine-core --check` (a health check that says HELLO to the core).

`nvllm keys generate DIR` writes (see common/curve.py):
  DIR/server.key_secret, DIR/authorized/   -> the engine core's host (--curve-keys-dir DIR)
  DIR/server.key, DIR/frontend.key_secret   -> every frontend host   (--curve-keys-dir DIR)
"""

import argparse
import logging
import sys

FORMATTER = argparse.ArgumentDefaultsHelpFormatter
CHECK_TIMEOUT_SECONDS = 5.0

logger = logging.getLogger("nvllm")


def add_core_curve_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("CURVE (authentication and encryption of the link to the frontends)")
    g.add_argument("--curve-keys-dir", default=None, metavar="DIR",
                   help="folder from `nvllm keys generate`: the core uses its server.key_secret and authorized/")
    g.add_argument("--curve-secret-key", default=None, metavar="FILE",
                   help="the core's secret key file (else from --curve-keys-dir, else $NVLLM_CURVE_SERVER_SECRET_KEY)")
    g.add_argument("--curve-authorized-keys", default=None, metavar="PATH",
                   help="public key file, or folder of *.key files, of the frontends the core accepts (else "
                        "--curve-keys-dir's authorized/, else $NVLLM_CURVE_AUTHORIZED_KEYS)")
    g.add_argument("--allow-insecure", action="store_true",
                   help="start without CURVE on an address other hosts can reach (loopback and ipc:// need no keys)")
    g.add_argument("--check", action="store_true",
                   help="health check: say HELLO to the core at --listen (0.0.0.0 as 127.0.0.1) with the core's own "
                        "keys, exit 0 when it answers READY within 5 s, else 1; loads no model")


def add_frontend_curve_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("CURVE (authentication and encryption of the link to the engine core)")
    g.add_argument("--curve-keys-dir", default=None, metavar="DIR",
                   help="folder from `nvllm keys generate`: the frontend uses its server.key and frontend.key_secret")
    g.add_argument("--curve-secret-key", default=None, metavar="FILE",
                   help="this frontend's secret key file (else from --curve-keys-dir, else "
                        "$NVLLM_CURVE_CLIENT_SECRET_KEY)")
    g.add_argument("--curve-server-key", default=None, metavar="FILE",
                   help="the engine core's public key file (else from --curve-keys-dir, else "
                        "$NVLLM_CURVE_SERVER_PUBLIC_KEY)")


def core_keys(ns: argparse.Namespace, need_authorized: bool = True):
    from common import curve
    return curve.server_keys(ns.curve_keys_dir, ns.curve_secret_key, ns.curve_authorized_keys,
                             need_authorized=need_authorized)


def frontend_socket_setup(ns: argparse.Namespace, addresses: list[str]):
    """The frontend's socket hook for its CURVE keys (None: plain), with a warning for a plain
    link to another host."""
    from common import curve
    from common.transport import is_loopback

    keys = curve.client_keys(ns.curve_keys_dir, ns.curve_secret_key, ns.curve_server_key)
    if keys is None:
        remote = [a for a in addresses if not is_loopback(a)]
        if remote:
            logger.warning("connecting to %s WITHOUT CURVE: the link is neither authenticated nor encrypted",
                           ", ".join(remote))
    return curve.client_socket_setup(keys)


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
    import time

    import msgspec
    import zmq

    from common import curve
    from common import protocol as P
    from common.transport import limit_socket

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        limit_socket(sock)
        if server_keys is not None:
            curve.apply_client(sock, curve.ClientKeys(server_keys.keypair, server_keys.keypair.public))
        sock.connect(address)
        sock.send_multipart([P.HELLO, msgspec.msgpack.encode(P.Hello(P.PROTOCOL_VERSION, "healthcheck"))])
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not sock.poll(int(left * 1000) + 1):
                break
            frames = sock.recv_multipart()
            if frames[0] == P.READY:
                info = msgspec.msgpack.decode(frames[1], type=P.Ready)
                sock.send_multipart([P.GOODBYE, b""])
                return True, info.model_name
            if frames[0] == P.REJECTED:
                return False, msgspec.msgpack.decode(frames[1], type=str)
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


def run_keys_generate(ns: argparse.Namespace) -> int:
    from common import curve

    names = getattr(ns, "frontend", None) or [curve.CLIENT_NAME]
    written = curve.generate(ns.dir, names, force=ns.force)
    for path in written:
        print(path)
    d = ns.dir
    print(f"\nengine core host: {d}/server.key_secret and {d}/{curve.AUTHORIZED_DIR}/ (--curve-keys-dir {d})\n"
          f"frontend hosts:   {d}/server.key and {d}/{names[0]}.key_secret (--curve-keys-dir {d}"
          + ("" if names[0] == curve.CLIENT_NAME else f" --curve-secret-key {d}/{names[0]}.key_secret") + ")\n"
          "Keep the .key_secret files private; .key files are public.")
    return 0


def register_keys(sub) -> None:
    p = sub.add_parser("keys", help="CURVE keys for the link between frontends and the engine core",
                       formatter_class=FORMATTER)
    kinds = p.add_subparsers(dest="keys_command", required=True)
    g = kinds.add_parser("generate", help="write a key pair for the engine core and for each frontend",
                         description="Writes DIR/server.key[_secret] (the engine core), DIR/NAME.key[_secret] per "
                                     "frontend name, and DIR/authorized/NAME.key (the frontend public keys the "
                                     "core accepts).", formatter_class=FORMATTER)
    g.add_argument("dir", help="folder to write the keys into (created if missing)")
    g.add_argument("--frontend", action="append", default=argparse.SUPPRESS, metavar="NAME",
                   help="a frontend key pair of this name; repeat for several (default: one named frontend)")
    g.add_argument("--force", action="store_true", help="overwrite existing keys")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="logging level")
    g.set_defaults(func=run_keys_generate)
