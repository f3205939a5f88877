"""The allowed-token masks of a step's constrained rows: filled in parallel, applied in one update.

A mask is llguidance's bitmask: 32 tokens per int32 word, bit t % 32 of word t // 32 set when token t
is allowed. llguidance's executor fills the rows of all constrained requests at once on its own
threads (without the GIL). A request verifying k proposed tokens gets k + 1 rows: the mask before each
proposal and after the last; rows after a proposal the grammar refuses are left all-allowed, since
verification never reaches them (that proposal's own row gives it probability 0).

Each masked row depends on its own request's grammar state alone, so masks keep batch invariance.
"""

import numpy as np
import torch

_executor = None


def _llguidance_executor():
    global _executor
    if _executor is None:
        import llguidance
        _executor = llguidance.LLExecutor()
    return _executor


def fill_masks(entries: list[tuple[object, int, list[int]]], num_rows: int, vocab_size: int) -> np.ndarray:
    """entries: (matcher, first row, proposed tokens) per constrained request. Returns the [num_rows,
    words] int32 bitmask, all-allowed where no entry writes."""
    import llguidance.numpy as llg_numpy
    masks = np.full((num_rows, (vocab_size + 31) // 32), -1, dtype=np.int32)
    plain = [(m, row) for m, row, drafts in entries if not drafts]
    proposing = [entry for entry in entries if entry[2]]  # llguidance takes no empty proposal list there
    if plain:
        llg_numpy.fill_next_token_bitmask_par(_llguidance_executor(), plain, masks)
    if proposing:
        llg_numpy.fill_next_token_bitmask_par_with_draft_tokens(_llguidance_executor(), proposing, masks)
    return masks


_BIT = torch.tensor([1 << b for b in range(31)] + [-(1 << 31)], dtype=torch.int32)


def apply_masks(logits: torch.Tensor, rows: list[int], masks: np.ndarray) -> None:
    """logits[rows[i], t] = -inf wherever bit t of masks[i] is clear (in place)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous():
        # numpy in place: a fifth of the time of the tensor ops below on this CPU (0.5 vs 3.5 ms for 16 rows)
        vocab = logits.shape[-1]
        blocked = np.unpackbits(~masks.view(np.uint8), axis=1, bitorder="little").view(np.bool_)
        table = logits.numpy()
        for i, row in enumerate(rows):
            np.putmask(table[row], blocked[i, :vocab], -np.inf)
        return
    words = torch.from_numpy(masks).to(logits.device, non_blocking=True)
    allowed = (words[:, :, None] & _BIT.to(logits.device)) != 0  # [rows, words, 32]
    allowed = allowed.reshape(len(rows), -1)[:, : logits.shape[-1]]
    index = torch.tensor(rows, dtype=torch.int64).to(logits.device, non_blocking=True)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
