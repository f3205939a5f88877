"""The CURVE key flags of `nvllm engine-core` (the server's keys) and `nvllm frontend` (a client's keys)."""

import argparse

from common import curve


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
    return curve.server_keys(ns.curve_keys_dir, ns.curve_secret_key, ns.curve_authorized_keys,
                             need_authorized=need_authorized)
