"""Fused layers whose pieces a GGUF file stores in different types: llama.cpp's Q4_K_M, for one, writes v_proj
in Q6_K beside q_proj and k_proj in Q4_K. Each piece stays quantized in its own type and runs through its own
kernel; the fused output is the pieces' outputs side by side, in the layer's output order."""

import torch

from engine_core.cpu_kernels.linear.quant_bf16_dot import QuantizedTensor


class QuantizedPieces:
    """A fused weight [N, K] as its pieces (QuantizedTensors stacked by output rows, in order)."""

    def __init__(self, pieces: list[QuantizedTensor]):
        if not pieces or len({piece.in_features for piece in pieces}) != 1:
            raise ValueError("the pieces of a fused weight take the same inputs")
        self.pieces = pieces
        self.in_features = pieces[0].in_features
        self.shape = (sum(piece.shape[0] for piece in pieces), self.in_features)
        self.qtype = "+".join(dict.fromkeys(piece.qtype for piece in pieces))  # "q4_k+q6_k", for the load log


class PiecewiseQuantWeight:
    """The packed pieces of a QuantizedPieces; `matmul` as the packed weights'."""

    def __init__(self, packs: list):
        self.packs = packs
        self.out_features = sum(pack.out_features for pack in packs)
        self.in_features = packs[0].in_features
        self.kernel = " + ".join(dict.fromkeys(pack.kernel for pack in packs))
        self.qtype = "+".join(dict.fromkeys(pack.qtype for pack in packs))

    @property
    def nbytes(self) -> int:
        return sum(pack.nbytes for pack in self.packs)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        outs, start = [], 0
        for pack in self.packs:
            end = start + pack.out_features
            outs.append(pack.matmul(x, None if bias is None else bias[start:end]))
            start = end
        return torch.cat(outs, dim=-1)
