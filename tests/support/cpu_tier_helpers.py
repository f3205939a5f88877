"""Running code on a CPU tier below this machine's own (NVLLM_CPU_ISA), in this process and in the engine
processes it starts, for the tests that run per tier."""

import contextlib
import os

import pytest

from engine_core.cpu_kernels import table, tiers


def tiers_here() -> list[str]:
    """The tiers this machine runs, its own last (a newer CPU runs every older tier's kernels)."""
    return list(tiers.TIERS[: tiers.rank(tiers.cpu_tier()) + 1])


def tier_params(*wanted: str) -> list:
    """pytest params for `wanted` tiers ("own": this machine's), skipped where the machine cannot run one."""
    params = []
    for tier in wanted:
        runs = tier == "own" or tier in tiers_here()
        params.append(pytest.param(tier, id=tier, marks=pytest.mark.skipif(not runs, reason=f"this CPU runs "
                                                                           f"{tiers.cpu_tier()}, not {tier}")))
    return params


@contextlib.contextmanager
def forced_tier(tier: str):
    """NVLLM_CPU_ISA=tier inside (nothing forced for "own"), every kernel choice made again on the way in
    and out."""
    before = os.environ.get(tiers.ENV)
    if tier == "own":
        os.environ.pop(tiers.ENV, None)
    else:
        os.environ[tiers.ENV] = tier
    table.forget()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(tiers.ENV, None)
        else:
            os.environ[tiers.ENV] = before
        table.forget()
