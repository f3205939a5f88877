"""`nvllm engine-core [MODEL] --listen ADDR`: only the engine core, for frontends that connect to ADDR
(`nvllm frontend --engine ADDR`); `--check` asks a running core whether it is ready."""

import argparse

from common.cli.arg_types import DEFAULT_CORE_ADDRESS, add_log_level, zmq_address
from common.cli.curve_args import add_core_curve_args, core_keys
from common.cli.engine_args import add_engine_args, engine_args_from
from common.curve import check_listen_security


def run_engine_core_cmd(ns: argparse.Namespace) -> int:
    if ns.check:
        from engine_core.cli.core_check import run_check
        return run_check(ns)
    curve = core_keys(ns)  # bad keys or an insecure address fail here, before any model loads
    check_listen_security(ns.listen, curve, ns.allow_insecure)
    args = engine_args_from(ns)
    args.validate()
    from engine_core.proc.core_proc import run_engine_core  # torch enters here, after the flags are checked
    return run_engine_core(args, ns.listen, curve=curve)


def register_engine_core(sub, formatter) -> None:
    p = sub.add_parser("engine-core", help="run only the engine core, for `nvllm frontend` to connect to",
                       formatter_class=formatter)
    add_engine_args(p)
    p.add_argument("--listen", type=zmq_address, default=DEFAULT_CORE_ADDRESS,
                   help="ZeroMQ address to bind (tcp://HOST:PORT or ipc://PATH)")
    add_core_curve_args(p)
    add_log_level(p)
    p.set_defaults(func=run_engine_core_cmd)
