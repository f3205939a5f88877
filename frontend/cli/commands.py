"""Subcommands. Each register function adds one to the parser; heavy imports wait for its run."""

import argparse

from frontend.core_link import engine_seam
from frontend.cli import bench_door
from frontend.cli.keys_cmd import register_keys
from frontend.cli.serve_cmd import register_frontend, register_serve

FORMATTER = argparse.ArgumentDefaultsHelpFormatter


def register_bench(sub) -> None:
    bench_door.register_bench_commands(sub, FORMATTER)


def register_core_commands(sub) -> None:
    engine_seam.register_core_commands(sub, FORMATTER)


REGISTRY = [register_serve, register_core_commands, register_frontend, register_bench, register_keys]
