"""`python -m engine_core --args-json ... --listen ADDR`: the core process that a frontend starts.

Arguments travel as JSON on the command line; nothing is pickled between the processes.
"""

import argparse
import logging
import sys

import msgspec

from common.config import EngineArgs
from engine_core.proc.core_proc import run_engine_core


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m engine_core")
    parser.add_argument("--args-json", required=True)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--engine-index", type=int, default=0)
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--start-failure-file", default=None,
                        help="where to write why the core could not start, for the frontend that started it")
    ns = parser.parse_args()
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = msgspec.json.decode(ns.args_json, type=EngineArgs)
    return run_engine_core(args, ns.listen, ns.engine_index, ns.parent_pid,
                           start_failure_file=ns.start_failure_file)


if __name__ == "__main__":
    sys.exit(main())
