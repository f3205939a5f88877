"""Which rows of the running step are prompt rows, for the quantized kernels that give prompt rows their own
arithmetic (amx_quant.c), and the split of a matmul's rows by that role.

The step's forward context (layers/forward_context.py) holds the rows. The kernels sit below the layers (the
import-linter layers contract), so the context hands its reader down here when it is imported instead of the
kernels importing it; until then (no model step can run) no row is a prompt row.
"""

from collections.abc import Callable

import torch

_reader: Callable[[], list[int]] = list


def read_prompt_runs_with(reader: Callable[[], list[int]]) -> None:
    """Sets where prompt_runs() reads the step's prompt rows (layers/forward_context.py's prompt_runs)."""
    global _reader
    _reader = reader


def prompt_runs() -> list[int]:
    """The step's prompt rows as flat [first row, end row) pairs; [] outside a step or where the model does not
    give them their own arithmetic."""
    return _reader()


def by_role(x, run, prompt_run):
    """run(rows) of x's output-token rows and prompt_run(rows) of the step's prompt rows (prompt_runs()), joined in
    row order: run(x) alone where the step has no prompt runs or prompt_run is None. Each row's result is its own,
    so splitting the rows changes nothing but which arithmetic a row takes."""
    runs = prompt_runs() if prompt_run is not None else []
    if not runs:
        return run(x)
    pieces, row = [], 0
    for first, end in zip(runs[::2], runs[1::2]):
        if first > row:
            pieces.append(run(x[row:first]))
        pieces.append(prompt_run(x[first:end]))
        row = end
    if row < x.shape[0]:
        pieces.append(run(x[row:]))
    return torch.cat(pieces)
