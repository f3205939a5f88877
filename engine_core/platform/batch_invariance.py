"""Whether this process computes batch-invariantly: one switch the kernels read when they pick a path.

Batch-invariant (the default, `--no-batch-invariant` turns it off): every row of a step is computed
with the same arithmetic in the same order whatever else the step holds: how many rows, which rows
beside it, how a prompt was chunked, whether its prefix came from the cache or was recomputed after
preemption. A request's tokens and logprobs then depend on that request alone. The kernels that keep
this pick their path by the row alone, never by the step's shape: linear layers (dense_bf16_dot.c,
quant_bf16_dot.c; dense_fixed_order.c for float32 and for bf16 where dense_bf16_dot.c cannot run), attention (one
kernel for prefill chunks, cached prefixes and decodes: paged_avx512_bf16.c, else paged_fixed_order.c),
norms (fused_torch_rounding.c, else torch with rms_fixed_order.c's fixed-order row statistic), rotary and the
sampler work row by row (torch's elementwise ops, log_softmax, argmax and topk over [rows, vocab] were measured
row-invariant).

Off, kernels may choose by shape (a faster attention kernel for one-token rows, the quantized matmul's
dequantize-and-GEMM path for many rows, oneDNN where the CPU has AMX), and a row's last bits may
depend on its batch.

The switch is process-wide: the model runner sets it from its EngineConfig before it loads the model
(packing decisions read it), and a process runs one engine.
"""

_invariant = True


def set_batch_invariant(on: bool) -> None:
    global _invariant
    _invariant = bool(on)


def batch_invariant() -> bool:
    return _invariant
