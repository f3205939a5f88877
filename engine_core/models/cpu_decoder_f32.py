"""A Llama-family model's decoder layers in one C call per step, float32 engines on every CPU tier
(cpu_decoder_f32.c): cpu_decoder.py's loop for the kernels float32 runs with (cpu_gemm_f32's panels or
quant_f32's GGUF blocks, cpu_ops_f32's norm / rotary / SiLU-and-mul, the generic attention kernel),
bit-identical to the module path. Batch-invariant engines only (the kernels it calls are that path's);
elsewhere `for_model` returns None and the modules run. NVLLM_CPU_DECODER=0 turns it off.
"""

import ctypes
import logging

import torch

from engine_core.attention import cpu_generic_attention
from engine_core.batch_invariance import batch_invariant
from engine_core.cpu_kernels import table
from engine_core.distributed.parallel_state import tp_size
from engine_core.forward_context import get_forward_context
from engine_core.layers import cpu_gemm_f32, cpu_ops, cpu_quant_f32
from engine_core.models.cpu_decoder import _LINEARS, _Layer, _Step, address, layers_issue

_ptr, _long, _float = ctypes.c_void_p, ctypes.c_long, ctypes.c_float

logger = logging.getLogger("nvllm")


class _Model(ctypes.Structure):
    _fields_ = ([(name, _ptr) for name in ("dense", "quant", "norm", "rotary", "silu", "attention", "cos", "sin")]
                + [(name, _long) for name in ("max_position", "num_layers", "hidden", "num_heads", "num_kv_heads",
                                              "head_dim", "intermediate", "block_size")]
                + [(name, _float) for name in ("eps", "qk_eps", "scale")]
                + [("layers", ctypes.POINTER(_Layer))])


@table.loader("cpu_decoder_f32")
def load(library):
    library.decoder_layers_f32.argtypes = [ctypes.POINTER(_Model), ctypes.POINTER(_Step)]
    library.decoder_layers_f32.restype = ctypes.c_int
    return library


_PACKED = (cpu_gemm_f32.GenericPanelWeight, cpu_quant_f32.QuantF32Weight)


def why_not(model) -> str | None:
    """Why the C loop cannot run this float32 model's layers exactly as its modules would; None if it can."""
    if tp_size() != 1:
        return "tensor parallel"
    if not batch_invariant():
        return "batch invariance off"
    if None in (load(), cpu_gemm_f32.load(), cpu_quant_f32.load(), cpu_ops.load_f32(), cpu_generic_attention.load()):
        return "a kernel library is missing"
    return layers_issue(model, torch.float32, lambda attn, mlp: all(
        isinstance(m.packed_weight, _PACKED) and getattr(m.packed_weight, "dtype", torch.float32) is torch.float32
        for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)))


def _type(packed) -> int:
    """-1 for cpu_gemm_f32's panels, else the GGUF type quant_f32.c reads."""
    return packed.type_id if isinstance(packed, cpu_quant_f32.QuantF32Weight) else -1


class CpuDecoderF32:
    """Runs `model.layers` for one float32 step from C; `run` returns None where the modules must run instead."""

    @classmethod
    def for_model(cls, model) -> "CpuDecoderF32 | None":
        why = why_not(model)
        if why is not None:
            logger.debug("decoder layers run as modules: %s", why)
            return None
        return cls(model)

    def __init__(self, model):
        self.model = model
        first = model.layers[0]
        self.heads, self.kv_heads = first.self_attn.num_heads, first.self_attn.num_kv_heads
        self.head_dim = first.self_attn.head_dim
        self.intermediate = first.mlp.gate_up_proj.packed_weight.out_features // 2
        self.qk_norm = first.self_attn.q_norm is not None
        self._struct: _Model | None = None
        self._cache_ptr = None

    def _build(self) -> _Model:
        layers = []
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            packed = {"qkv": attn.qkv_proj.packed_weight, "o": attn.o_proj.packed_weight,
                      "gate_up": mlp.gate_up_proj.packed_weight, "down": mlp.down_proj.packed_weight}
            biases = {"qkv": attn.qkv_proj.bias, "gate_up": mlp.gate_up_proj.bias}
            layers.append(_Layer(
                **{f"{name}_format": _type(weight) for name, weight in packed.items()},
                **{name: packed[name].panels.data_ptr() for name in _LINEARS},
                **{f"{name}_bias": None if bias is None else packed[name].float_bias(bias).data_ptr()
                   for name, bias in biases.items()},
                input_norm=layer.input_layernorm.weight.data_ptr(),
                post_norm=layer.post_attention_layernorm.weight.data_ptr(),
                q_norm=attn.q_norm.weight.data_ptr() if self.qk_norm else None,
                k_norm=attn.k_norm.weight.data_ptr() if self.qk_norm else None,
                k_cache=attn.attn.k_cache.data_ptr(), v_cache=attn.attn.v_cache.data_ptr()))
        self._layers = (_Layer * len(layers))(*layers)  # kept alive: the struct points into it
        first = self.model.layers[0]
        ops, rotary = cpu_ops.load_f32(), first.self_attn.rotary
        return _Model(
            dense=address(cpu_gemm_f32.load(), "linear_f32"), quant=address(cpu_quant_f32.load(), "quant_f32_linear"),
            norm=address(ops, "rms_norm_f32"), rotary=address(ops, "rotary_f32"), silu=address(ops, "silu_and_mul_f32"),
            attention=address(cpu_generic_attention.load(), "generic_paged_attention"),
            cos=rotary.cos.data_ptr(), sin=rotary.sin.data_ptr(), max_position=rotary.cos.shape[0],
            num_layers=len(self.model.layers), hidden=first.input_layernorm.weight.shape[0], num_heads=self.heads,
            num_kv_heads=self.kv_heads, head_dim=self.head_dim, intermediate=self.intermediate,
            block_size=first.self_attn.attn.k_cache.shape[1], eps=first.input_layernorm.eps,
            qk_eps=first.self_attn.q_norm.eps if self.qk_norm else 0.0, scale=first.self_attn.attn.scale,
            layers=self._layers)

    def run(self, embeddings: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(the last layer's output, the residual stream: `embeddings` updated in place), or None (nothing but
        the new tokens' own cache slots written) where a kernel declined the step."""
        cache = self.model.layers[0].self_attn.attn.k_cache
        if (cache.numel() == 0 or embeddings.dtype is not torch.float32 or not embeddings.is_contiguous()
                or positions.dtype is not torch.int64):
            return None
        if self._struct is None or self._cache_ptr != cache.data_ptr():
            self._struct, self._cache_ptr = self._build(), cache.data_ptr()
        meta = get_forward_context().meta
        tokens, hidden = embeddings.shape
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        widths = [hidden, hidden, q_size + 2 * kv_size, q_size, 2 * self.intermediate]
        widths += [q_size, kv_size] if self.qk_norm else []
        x, normed, qkv, attn, act, *qk = (torch.empty((tokens, w), dtype=torch.float32, device="cpu") for w in widths)
        q_normed, k_normed = qk if qk else (None, None)
        positions = positions.contiguous()
        step = _Step(
            tokens=tokens, positions=positions.data_ptr(), slot_mapping=meta.slot_mapping.data_ptr(),
            num_seqs=meta.num_seqs, table_row=meta.block_tables.stride(0), num_decodes=0,
            block_tables=meta.block_tables.data_ptr(), seq_lens=meta.seq_lens.data_ptr(),
            query_start_loc=meta.query_start_loc.data_ptr(), residual=embeddings.data_ptr(), x=x.data_ptr(),
            normed=normed.data_ptr(), qkv=qkv.data_ptr(), attn=attn.data_ptr(), act=act.data_ptr(),
            q_normed=None if q_normed is None else q_normed.data_ptr(),
            k_normed=None if k_normed is None else k_normed.data_ptr(), threads=torch.get_num_threads(),
            every_row_alike=1)
        status = load().decoder_layers_f32(ctypes.byref(self._struct), ctypes.byref(step))
        if status == -1:
            return None
        if status:
            raise RuntimeError("a CPU kernel failed in the middle of a step (out of memory?)")
        return x, embeddings
