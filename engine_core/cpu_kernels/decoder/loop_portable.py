"""A Llama-family model's decoder layers in one C call per step, float32 engines on every CPU tier
(loop_portable.c): loop_avx512_bf16.py's loop for the kernels float32 runs with (dense_fixed_order.c's panels or
quant_exact_f32.c's GGUF blocks, fused_fixed_order.c's norm / rotary / SiLU-and-mul, the generic attention kernel),
bit-identical to the module path. Batch-invariant engines only (the kernels it calls are that path's);
elsewhere `why_not` says why and the modules run. NVLLM_CPU_DECODER=0 turns it off.

CpuDecoderBF16Generic is the same C loop built for bf16 elements, for bf16 engines where loop_avx512_bf16.c's
kernels do not run (below avx512_bf16): dense_fixed_order.c's bf16 panels or quant_int8_rows.c's GGUF blocks,
fused_torch_rounding.c's bf16 norm / rotary / SiLU-and-mul, the generic attention on bf16 caches.
"""

import ctypes

import torch

from engine_core.cpu_kernels.attention import paged_fixed_order
from engine_core.platform.batch_invariance import batch_invariant
from engine_core.cpu_kernels import table
from engine_core.distributed.parallel_state import tp_size
from engine_core.cpu_kernels.linear import dense_linear, quant_exact_f32, quant_int8_rows
from engine_core.cpu_kernels.ops import fused_ops
from engine_core.cpu_kernels.decoder.loop_avx512_bf16 import (IMPLEMENTED, IMPLEMENTED_F32, KIND_DOT, CpuDecoder,
                                                      _Layer, _Step, address, layers_issue, linear_struct, pieces_of)

_ptr, _long, _float = ctypes.c_void_p, ctypes.c_long, ctypes.c_float


class _Model(ctypes.Structure):
    _fields_ = ([(name, _ptr) for name in ("dense", "dense_bf16w", "quant", "dot", "norm", "rotary", "act_and_mul",
                                           "attention", "cos", "sin")]
                + [(name, _long) for name in ("max_position", "num_layers", "hidden", "num_heads", "num_kv_heads",
                                              "head_dim", "intermediate", "block_size", "rotary_dim")]
                + [(name, _float) for name in ("eps", "qk_eps", "scale")]
                + [("layers", ctypes.POINTER(_Layer))])


@table.loader("loop_portable")
def load(library):
    library.decoder_layers_f32.argtypes = [ctypes.POINTER(_Model), ctypes.POINTER(_Step)]
    library.decoder_layers_f32.restype = ctypes.c_int
    return library


@table.loader("loop_portable_bf16")
def load_bf16(library):
    library.decoder_layers_bf16_generic.argtypes = [ctypes.POINTER(_Model), ctypes.POINTER(_Step)]
    library.decoder_layers_bf16_generic.restype = ctypes.c_int
    return library


_PACKED = (dense_linear.GenericPanelWeight, quant_exact_f32.QuantF32Weight, quant_int8_rows.QuantDotWeight)


def _why_not(model, dtype: torch.dtype, libraries: tuple, packed_types: tuple) -> str | None:
    """Why a build of the C loop cannot run this `dtype` model's layers exactly as its modules would (its kernel
    `libraries` loaded, every linear packed as one of `packed_types` for `dtype`); None if it can."""
    if tp_size() != 1:
        return "tensor parallel"
    if not batch_invariant():
        return "batch invariance off"
    if None in libraries:
        return "a kernel library is missing"
    return layers_issue(model, dtype, lambda attn, mlp: all(
        isinstance(pack, packed_types) and getattr(pack, "dtype", dtype) is dtype
        for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj) for pack in pieces_of(m.packed_weight)),
        IMPLEMENTED_F32 if dtype is torch.float32 else IMPLEMENTED)


def why_not(model) -> str | None:
    """Why the C loop cannot run this float32 model's layers exactly as its modules would; None if it can."""
    return _why_not(model, torch.float32, (load(), dense_linear.load_fixed_order(), quant_exact_f32.load(),
                                           quant_int8_rows.load(), fused_ops.load_f32(), paged_fixed_order.load()),
                    _PACKED)


def _kind(packed) -> int:
    """-1 for dense_fixed_order.c's panels in the engine's dtype, -2 for bf16-stored ones in a float32 engine, the GGUF
    type quant_exact_f32.c reads, or KIND_DOT + the one quant_int8_rows.c reads."""
    if isinstance(packed, quant_int8_rows.QuantDotWeight):
        return KIND_DOT + packed.type_id
    if isinstance(packed, quant_exact_f32.QuantF32Weight):
        return packed.type_id
    return -2 if packed.storage is not packed.dtype else -1


class CpuDecoderF32(CpuDecoder):
    """Runs `model.layers` for one float32 step from C; `run` returns None where the modules must run instead."""

    dtype = torch.float32
    act_widths = 2  # gate | up, then silu(gate) * up in place over the gate half
    takes_prompt_kernels = False  # one arithmetic for every row

    @staticmethod
    def why_not(model) -> str | None:
        return why_not(model)

    def _entry(self):
        return load().decoder_layers_f32

    def _num_decodes(self, meta) -> int:
        return 0  # one attention kernel for every row

    def _kernels(self) -> dict[str, int]:
        """The addresses of the kernels the loop calls (the _Model fields of that name)."""
        gemm, ops = dense_linear.load_fixed_order(), fused_ops.load_f32()
        return dict(dense=address(gemm, "linear_f32"), dense_bf16w=address(gemm, "linear_f32_bf16w"),
                    quant=address(quant_exact_f32.load(), "quant_f32_linear"),
                    dot=address(quant_int8_rows.load(), "quant_dot_linear_f32"), norm=address(ops, "rms_norm_f32"),
                    rotary=address(ops, "rotary_f32"), act_and_mul=address(ops, self._act_and_mul()),
                    attention=address(paged_fixed_order.load(), "generic_paged_attention"))

    def _act_and_mul(self) -> str:
        return "gelu_tanh_and_mul_f32" if self.model.spec.activation == "gelu_tanh" else "silu_and_mul_f32"

    def _build(self) -> _Model:
        layers, self._biases = [], []
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            packed = {"qkv": attn.qkv_proj.packed_weight, "o": attn.o_proj.packed_weight,
                      "gate_up": mlp.gate_up_proj.packed_weight, "down": mlp.down_proj.packed_weight}
            layers.append(_Layer(
                **{name: linear_struct(weight, _kind) for name, weight in packed.items()},
                qkv_bias=self._bias(attn.qkv_proj), gate_up_bias=self._bias(mlp.gate_up_proj),
                input_norm=layer.input_layernorm.weight.data_ptr(),
                post_norm=layer.post_attention_layernorm.weight.data_ptr(),
                q_norm=attn.q_norm.weight.data_ptr() if self.qk_norm else None,
                k_norm=attn.k_norm.weight.data_ptr() if self.qk_norm else None,
                k_cache=attn.attn.k_cache.data_ptr(), v_cache=attn.attn.v_cache.data_ptr(),
                window=attn.attn.sliding_window or 0, softcap=attn.attn.softcap or 0.0,
                cos=attn.rotary.cos.data_ptr(), sin=attn.rotary.sin.data_ptr(),
                **self._sandwich(layer)))
        self._layers = (_Layer * len(layers))(*layers)  # kept alive: the struct points into it
        first = self.model.layers[0]
        rotary = first.self_attn.rotary
        return _Model(
            **self._kernels(), cos=rotary.cos.data_ptr(), sin=rotary.sin.data_ptr(), max_position=rotary.cos.shape[0],
            rotary_dim=rotary.cos.shape[1], num_layers=len(self.model.layers),
            hidden=first.input_layernorm.weight.shape[0], num_heads=self.heads,
            num_kv_heads=self.kv_heads, head_dim=self.head_dim, intermediate=self.intermediate,
            block_size=first.self_attn.attn.k_cache.shape[1], eps=first.input_layernorm.eps,
            qk_eps=first.self_attn.q_norm.eps if self.qk_norm else 0.0, scale=first.self_attn.attn.scale,
            layers=self._layers)

    @staticmethod
    def _sandwich(layer) -> dict:
        """Gemma's two more norms of a layer (SandwichDecoderLayer), or none."""
        if not hasattr(layer, "pre_feedforward_layernorm"):
            return {}
        return dict(pre_ffn_norm=layer.pre_feedforward_layernorm.weight.data_ptr(),
                    post_ffn_norm=layer.post_feedforward_layernorm.weight.data_ptr())


_PACKED_BF16 = (dense_linear.GenericPanelWeight, quant_int8_rows.QuantDotWeight)


def why_not_bf16(model) -> str | None:
    """Why the bf16 build of the C loop cannot run this bf16 model's layers exactly as its modules would."""
    if fused_ops.load() is not None and not fused_ops.norm_kernel_ok():
        return "the fused RMSNorm does not reproduce this torch's sum order"
    return _why_not(model, torch.bfloat16, (load_bf16(), dense_linear.load_fixed_order(), quant_int8_rows.load(),
                                            fused_ops.load(), paged_fixed_order.load()), _PACKED_BF16)


class CpuDecoderBF16Generic(CpuDecoderF32):
    """The float32 loop's C source built for bf16 elements: bf16 engines below avx512_bf16."""

    dtype = torch.bfloat16

    @staticmethod
    def why_not(model) -> str | None:
        return why_not_bf16(model)

    def _entry(self):
        return load_bf16().decoder_layers_bf16_generic

    def _kernels(self) -> dict[str, int]:
        ops = fused_ops.load()
        return dict(dense=address(dense_linear.load_fixed_order(), "linear_bf16_generic"), dense_bf16w=None,
                    quant=address(quant_int8_rows.load(), "quant_dot_linear_bf16"),
                    dot=address(quant_int8_rows.load(), "quant_dot_linear_bf16"),
                    norm=address(ops, fused_ops.bf16_norm_name()),
                    rotary=address(ops, "rotary_bf16"), act_and_mul=address(ops, "silu_and_mul_bf16"),
                    attention=address(paged_fixed_order.load(), "generic_paged_attention"))
