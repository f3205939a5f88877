"""CURVE keys on the command line: `nvllm keys generate DIR` and the frontend's side of the keys (the
flags themselves are in common/cli/curve_args.py; `engine-core --check` in engine_core/cli/core_check.py).

`nvllm keys generate DIR` writes (see common/curve.py):
  DIR/server.key_secret, DIR/authorized/   -> the engine core's host (--curve-keys-dir DIR)
  DIR/server.key, DIR/frontend.key_secret   -> every frontend host   (--curve-keys-dir DIR)
"""

import argparse
import logging

from common.cli.arg_types import add_log_level

FORMATTER = argparse.ArgumentDefaultsHelpFormatter

logger = logging.getLogger("nvllm")


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
    add_log_level(g)
    g.set_defaults(func=run_keys_generate)
