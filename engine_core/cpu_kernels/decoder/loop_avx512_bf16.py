"""A Llama-family model's decoder layers in one C call per step (loop_avx512_bf16.c), on bf16 CPUs.

The module path spends ~0.25 ms of host work per layer (module calls, wrapper checks, views, a dozen
ctypes calls): 15-20% of a batched decode step. Where every kernel it would call is nvllm's own
(panel-packed or kept-quantized linears with the fused gate/up, the fused norm and rotary kernels, the
paged attention kernels), `CpuDecoder` runs the same kernels in the same order from C instead, bit-identical to the
module path. Elsewhere (float32, oneDNN weights, tensor parallelism, biases after a row-parallel
linear, other attention backends or shapes) `why_not` says why, and the model runner runs the modules.
NVLLM_CPU_DECODER=0 turns it off.
"""

import ctypes

import torch

from engine_core.cpu_kernels.attention import paged_avx512_bf16
from engine_core.platform.batch_invariance import batch_invariant
from engine_core.cpu_kernels import table
from engine_core.distributed.parallel_state import tp_size
from engine_core.layers.forward_context import get_forward_context
from engine_core.cpu_kernels.linear import dense_linear, quant_bf16_dot, quant_int8_rows
from engine_core.cpu_kernels.ops import fused_ops
from engine_core.layers.quant_pieces import PiecewiseQuantWeight

_ptr, _long, _float = ctypes.c_void_p, ctypes.c_long, ctypes.c_float


_LINEARS = ("qkv", "o", "gate_up", "down")
MAX_PIECES, KIND_DOT = 3, 100  # decoder/linear_pieces.h


class _Linear(ctypes.Structure):
    _fields_ = [("w", _ptr * MAX_PIECES), ("kind", _long * MAX_PIECES), ("rows", _long * MAX_PIECES),
                ("pieces", _long)]


def pieces_of(packed) -> list:
    """The packed weights a linear layer's C loop runs, in output order: its pieces, or the weight itself."""
    return packed.packs if isinstance(packed, PiecewiseQuantWeight) else [packed]


def linear_struct(packed, kind_of) -> _Linear:
    """The C view of one linear layer's weights; `kind_of(pack)` is the loop's code for the kernel of a piece."""
    packs = pieces_of(packed)
    if len(packs) > MAX_PIECES:
        raise ValueError(f"a fused layer of {len(packs)} pieces (the C loops take at most {MAX_PIECES})")
    struct = _Linear(pieces=len(packs))
    for p, pack in enumerate(packs):
        struct.w[p], struct.kind[p], struct.rows[p] = pack.panels.data_ptr(), kind_of(pack), pack.out_features
    return struct


class _Layer(ctypes.Structure):
    _fields_ = ([(name, _ptr) for name in ("input_norm", "post_norm", "q_norm", "k_norm")]
                + [(name, _Linear) for name in _LINEARS]
                + [(name, _ptr) for name in ("qkv_bias", "gate_up_bias", "k_cache", "v_cache")]
                + [("window", _long)]  # the layer's sliding window in keys, 0: none
                # the float32 loop's Gemma fields (NULL / 0: none): its two more norms, the layer's own rotary
                # tables, its attention soft cap
                + [(name, _ptr) for name in ("pre_ffn_norm", "post_ffn_norm", "cos", "sin")]
                + [("softcap", _float)])


class _Model(ctypes.Structure):
    _fields_ = ([(name, _ptr) for name in ("linear", "gated", "quant_linear", "quant_gated", "quant_prompt",
                                           "quant_prompt_gated", "dot", "dot_prompt", "silu", "norm", "rotary",
                                           "decode", "chunk", "silu_table", "cos", "sin")]
                + [(name, _long) for name in ("max_position", "num_layers", "hidden", "num_heads", "num_kv_heads",
                                              "head_dim", "intermediate", "block_size", "rotary_dim")]
                + [(name, _float) for name in ("eps", "qk_eps", "scale")]
                + [("layers", ctypes.POINTER(_Layer))])


class _Step(ctypes.Structure):
    _fields_ = ([("tokens", _long), ("positions", _ptr), ("slot_mapping", _ptr), ("num_seqs", _long),
                 ("num_decodes", _long), ("table_row", _long), ("block_tables", _ptr), ("seq_lens", _ptr),
                 ("query_start_loc", _ptr)]
                + [(name, _ptr) for name in ("residual", "x", "normed", "qkv", "attn", "act", "q_normed",
                                             "k_normed", "gate_up")]
                + [("threads", ctypes.c_int), ("every_row_alike", ctypes.c_int)]
                + [("prompt_runs", _ptr), ("num_prompt_runs", _long)])


@table.loader("loop_avx512_bf16")
def load(library):
    library.decoder_layers_bf16.argtypes = [ctypes.POINTER(_Model), ctypes.POINTER(_Step)]
    library.decoder_layers_bf16.restype = ctypes.c_int
    return library


def address(library, name: str) -> int:
    """The address of the C function `name` of a loaded library (a kernel handed to the C loop)."""
    return ctypes.cast(getattr(library, name), ctypes.c_void_p).value


def _why_not(model) -> str | None:
    """Why the C loop cannot run this model's layers exactly as its modules would; None if it can."""
    if tp_size() != 1:
        return "tensor parallel"
    if (None in (load(), dense_linear.load(), fused_ops.load(), paged_avx512_bf16.load())
            or not fused_ops.norm_kernel_ok()):
        return "a kernel library is missing"
    first = model.layers[0].self_attn
    heads, kv_heads, head_dim = first.num_heads, first.num_kv_heads, first.head_dim
    if head_dim % 32 or head_dim > 256 or heads % kv_heads or heads // kv_heads > 8 or not first.attn.scale > 0:
        return "an attention shape the kernels do not take"
    dot_runs = quant_int8_rows.load() is not None and fused_ops.load() is not None
    plain = (dense_linear.PanelWeight, quant_bf16_dot.QuantPanelWeight) + ((quant_int8_rows.QuantDotWeight,)
                                                                          if dot_runs else ())

    def takes(packed, also=()) -> bool:
        return all(type(pack) in plain + also for pack in pieces_of(packed))
    return layers_issue(model, torch.bfloat16, lambda attn, mlp: (
        takes(attn.qkv_proj.packed_weight) and takes(attn.o_proj.packed_weight) and takes(mlp.down_proj.packed_weight)
        and takes(mlp.gate_up_proj.packed_weight,
                  (dense_linear.GatedPanelWeight, quant_bf16_dot.GatedQuantPanelWeight))))


def _kind(packed) -> int:
    """The bf16 loop's code for the kernel of a packed weight: -1 dense_bf16_dot.c's panels, a quant_bf16_dot.c
    format, or KIND_DOT + the GGUF type quant_int8_rows.c reads."""
    if isinstance(packed, quant_int8_rows.QuantDotWeight):
        return KIND_DOT + packed.type_id
    return getattr(packed, "format", -1)


def _fused_gate_up(packed) -> bool:
    return isinstance(packed, (dense_linear.GatedPanelWeight, quant_bf16_dot.GatedQuantPanelWeight))


# The ModelSpec values (families/spec.py) the C loops implement; a model with any other value of these fields runs
# its modules. q/k/v biases, q/k norms, rotary scaling, partial rotary (cos/sin rows narrower than a head:
# rotary_dim) and per-layer sliding windows (each layer passes its window to the attention kernels) are implemented
# either way. The float32 loop implements Gemma as well (IMPLEMENTED_F32).
IMPLEMENTED = {
    "activation": ("silu",),
    "norm_offset": (0.0,),
    "o_bias": (False,),  # a bias after a row-parallel linear
    "mlp_bias": (False,),
    "attn_logit_softcap": (None,),
    "num_experts": (0,),
    "embed_scale": (None,),
    "attn_scale": (None,),
    "sandwich_norms": (False,),
}


# float32: Gemma's GELU (tanh form), (1 + weight) norms (a float32 norm weight holds 1 + weight: the plain norm
# kernel's arithmetic), embedding scale (applied before the loop), attention scale (the model's one scale), soft-
# capped scores (the generic attention kernel caps) and sandwich norms; no value of those is refused
_GEMMA_FIELDS = ("embed_scale", "attn_scale", "attn_logit_softcap")
IMPLEMENTED_F32 = {name: values for name, values in IMPLEMENTED.items() if name not in _GEMMA_FIELDS} | {
    "activation": ("silu", "gelu_tanh"),
    "norm_offset": (0.0, 1.0),
    "sandwich_norms": (False, True),
}


def spec_issue(spec, implemented_values: dict = IMPLEMENTED) -> str | None:
    """The first ModelSpec value a C loop does not implement (IMPLEMENTED: the bf16 loops'), by name; None if it
    implements them all."""
    for name, implemented in implemented_values.items():
        value = getattr(spec, name)
        if value not in implemented:
            return f"{name} = {value!r} (the C loop implements {', '.join(map(repr, implemented))})"
    return None


def layers_issue(model, dtype: torch.dtype, packed_ok, implemented_values: dict = IMPLEMENTED) -> str | None:
    """Why a C loop of `dtype` cannot run these layers as their modules would (a spec value it does not implement,
    weights not in the forms `packed_ok(attn, mlp)` takes, norms in another dtype, rotary tables not in float32);
    None if it can."""
    issue = spec_issue(model.spec, implemented_values)
    if issue is not None:
        return issue
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not packed_ok(attn, mlp):
            return "weights not in the packed forms the C loop takes"
        norms = [layer.input_layernorm, layer.post_attention_layernorm] + (
            [attn.q_norm, attn.k_norm] if attn.q_norm is not None else []) + [
            getattr(layer, name) for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm")
            if hasattr(layer, name)]
        if any(n.weight.dtype is not dtype or not n.weight.is_contiguous() for n in norms):
            return f"a norm weight not in {dtype}"
        if attn.rotary.cos.dtype is not torch.float32 or not attn.rotary.cos.is_contiguous():
            return "rotary tables not in float32"
    return None


class CpuDecoder:
    """Runs `model.layers` for one bf16 step from C; `run` returns None where the modules must run instead.
    loop_portable.CpuDecoderF32 is the float32 loop: another struct, the same step."""

    dtype = torch.bfloat16
    act_widths = 1  # the MLP buffer's width in intermediates (the gated matmul stores silu(gate) * up only)
    takes_prompt_kernels = True  # the loop hands prompt rows to a kept-quantized kernel's prompt arithmetic

    def __init__(self, model):
        self.model = model
        first = model.layers[0]
        # a gate/up that is not a fused gated kernel writes gate | up to a scratch buffer first
        self.gate_up_scratch = not all(_fused_gate_up(layer.mlp.gate_up_proj.packed_weight) for layer in model.layers)
        self.heads, self.kv_heads = first.self_attn.num_heads, first.self_attn.num_kv_heads
        self.head_dim = first.self_attn.head_dim
        self.intermediate = first.mlp.gate_up_proj.packed_weight.out_features // 2  # gate | up
        self.qk_norm = first.self_attn.q_norm is not None
        # prompt rows of kept-quantized layers take their own arithmetic (amx_quant.c): the engine then keys
        # cached blocks by which of their tokens were prompt tokens (kv_cache_manager.py)
        kept = any(isinstance(pack, quant_bf16_dot.QuantPanelWeight)
                   or (isinstance(pack, quant_int8_rows.QuantDotWeight)
                       and pack.qtype in quant_bf16_dot.DOT_PROMPT_TYPES)
                   for layer in model.layers
                   for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                                  layer.mlp.down_proj) for pack in pieces_of(linear.packed_weight))
        self.prompt_arithmetic = (kept and self.takes_prompt_kernels
                                  and quant_bf16_dot.has_prompt_arithmetic(quant_bf16_dot.load()))
        self._struct = None
        self._cache_ptr = None  # the layer 0 key cache the struct was built for

    @staticmethod
    def why_not(model) -> str | None:
        return _why_not(model)

    def _entry(self):
        """The C function that runs the layers."""
        return load().decoder_layers_bf16

    def _num_decodes(self, meta) -> int:
        # batch-invariant: one-token rows through the chunk kernel too (cpu_kernel_backend.py says why)
        return 0 if batch_invariant() else meta.num_decodes

    def _build(self) -> _Model:
        """The C view of the model: weights, norms, caches (rebuilt when the caches are rebound)."""
        layers, self._biases = [], []
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            packed = {"qkv": attn.qkv_proj.packed_weight, "o": attn.o_proj.packed_weight,
                      "gate_up": mlp.gate_up_proj.packed_weight, "down": mlp.down_proj.packed_weight}
            layers.append(_Layer(
                **{name: linear_struct(weight, _kind) for name, weight in packed.items()},
                input_norm=layer.input_layernorm.weight.data_ptr(),
                post_norm=layer.post_attention_layernorm.weight.data_ptr(),
                q_norm=attn.q_norm.weight.data_ptr() if self.qk_norm else None,
                k_norm=attn.k_norm.weight.data_ptr() if self.qk_norm else None,
                qkv_bias=self._bias(attn.qkv_proj), gate_up_bias=self._bias(mlp.gate_up_proj),
                k_cache=attn.attn.k_cache.data_ptr(), v_cache=attn.attn.v_cache.data_ptr(),
                window=attn.attn.sliding_window or 0))
        self._layers = (_Layer * len(layers))(*layers)  # kept alive: the struct points into it
        first = self.model.layers[0]
        gemm, ops, attention = dense_linear.load(), fused_ops.load(), paged_avx512_bf16.load()
        quant = quant_bf16_dot.load()
        dot = quant_int8_rows.load()
        rotary = first.self_attn.rotary
        self._tables = (fused_ops.silu_table(), rotary.cos, rotary.sin)
        return _Model(
            linear=address(gemm, "linear_bf16"), gated=address(gemm, "linear_silu_mul_bf16"),
            quant_linear=quant and address(quant, "quant_linear_bf16"),
            quant_gated=quant and address(quant, "quant_linear_silu_mul_bf16"),
            quant_prompt=address(quant, "quant_prompt_linear_bf16") if self.prompt_arithmetic else None,
            quant_prompt_gated=address(quant, "quant_prompt_linear_silu_mul_bf16") if self.prompt_arithmetic else None,
            dot=dot and address(dot, "quant_dot_linear_bf16"),
            dot_prompt=address(quant, "dot_prompt_linear_bf16") if self.prompt_arithmetic else None,
            silu=address(ops, "silu_and_mul_bf16"),
            norm=address(ops, fused_ops.bf16_norm_name()), rotary=address(ops, "rotary_bf16"),
            decode=address(attention, "paged_decode_attention"), chunk=address(attention, "paged_attention"),
            silu_table=self._tables[0].data_ptr(), cos=rotary.cos.data_ptr(), sin=rotary.sin.data_ptr(),
            max_position=rotary.cos.shape[0], rotary_dim=rotary.cos.shape[1], num_layers=len(self.model.layers),
            hidden=first.input_layernorm.weight.shape[0], num_heads=self.heads, num_kv_heads=self.kv_heads,
            head_dim=self.head_dim, intermediate=self.intermediate, block_size=first.self_attn.attn.k_cache.shape[1],
            eps=first.input_layernorm.eps, qk_eps=first.self_attn.q_norm.eps if self.qk_norm else 0.0,
            scale=first.self_attn.attn.scale, layers=self._layers)

    def _bias(self, linear):
        """A linear layer's bias in float32, in its packed order (its pieces': the output order), or None."""
        if linear.bias is None:
            return None
        packed = linear.packed_weight
        bias = (linear.bias.float().contiguous() if isinstance(packed, PiecewiseQuantWeight)
                else packed.float_bias(linear.bias))
        self._biases.append(bias)  # kept alive: the struct points into it
        return bias.data_ptr()

    def run(self, embeddings: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(the last layer's output, the residual stream) for the step's tokens, the residual being
        `embeddings` updated in place, as the modules leave them; None (nothing but the new tokens' own
        cache slots written) where a kernel declined the step."""
        cache = self.model.layers[0].self_attn.attn.k_cache
        if (cache.numel() == 0 or embeddings.dtype is not self.dtype or not embeddings.is_contiguous()
                or positions.dtype is not torch.int64):
            return None
        if self._struct is None or self._cache_ptr != cache.data_ptr():
            self._struct, self._cache_ptr = self._build(), cache.data_ptr()
        context = get_forward_context()
        meta = context.meta
        tokens, hidden = embeddings.shape
        runs = torch.tensor(context.prompt_runs, dtype=torch.int64)  # [] unless the runner's prompt_arithmetic
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        widths = [hidden, hidden, q_size + 2 * kv_size, q_size, self.act_widths * self.intermediate]
        widths += [q_size, kv_size] if self.qk_norm else []
        x, normed, qkv, attn, act, *qk = (torch.empty((tokens, w), dtype=self.dtype, device="cpu") for w in widths)
        q_normed, k_normed = qk if qk else (None, None)
        gate_up = (torch.empty((tokens, 2 * self.intermediate), dtype=self.dtype, device="cpu")
                   if self.gate_up_scratch and self.act_widths == 1 else None)
        positions = positions.contiguous()
        step = _Step(
            tokens=tokens, positions=positions.data_ptr(), slot_mapping=meta.slot_mapping.data_ptr(),
            num_seqs=meta.num_seqs, table_row=meta.block_tables.stride(0), num_decodes=self._num_decodes(meta),
            block_tables=meta.block_tables.data_ptr(), seq_lens=meta.seq_lens.data_ptr(),
            query_start_loc=meta.query_start_loc.data_ptr(), residual=embeddings.data_ptr(), x=x.data_ptr(),
            normed=normed.data_ptr(), qkv=qkv.data_ptr(), attn=attn.data_ptr(), act=act.data_ptr(),
            q_normed=None if q_normed is None else q_normed.data_ptr(),
            k_normed=None if k_normed is None else k_normed.data_ptr(),
            gate_up=None if gate_up is None else gate_up.data_ptr(), threads=torch.get_num_threads(),
            every_row_alike=int(batch_invariant()), prompt_runs=runs.data_ptr(), num_prompt_runs=runs.numel() // 2)
        status = self._entry()(ctypes.byref(self._struct), ctypes.byref(step))
        if status == -1:
            return None
        if status:
            raise RuntimeError("a CPU kernel failed in the middle of a step (out of memory?)")
        return x, embeddings
