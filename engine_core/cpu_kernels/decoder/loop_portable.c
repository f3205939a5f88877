/* A Llama-family model's decoder layers for one step, in one call: float32 engines on every CPU tier, and
 * bf16 engines on the tiers below avx512_bf16 (this file built with -DDECODER_BF16: see the end of this comment).
 *
 * loop_avx512_bf16.c's loop for float32 (what the tiers below avx512_bf16 run by default): the Python model
 * spends ~0.25 ms of host work per layer on module calls, views and ctypes calls, more than a decode
 * step's matmuls of a small quantized model. This file runs the same kernels in the same order on the
 * same values, so the results are the module path's bit for bit (tested); it holds no arithmetic of its
 * own. The kernels come in as pointers: linear layers from dense_fixed_order.c (dense panels, fp32 or bf16), quant_exact_f32.c
 * (GGUF Q4_0 / Q4_1 / Q8_0 blocks at their exact values) or quant_int8_rows.c (any kept GGUF type, 8-bit input rows;
 * a fused layer may be pieces of several types: linear_pieces.h), norm / rotary / SiLU-and-mul from fused_fixed_order.c, attention from paged_fixed_order.c
 * (one call for decodes and chunks alike: the batch-invariant path, the only one this loop serves).
 *
 * One layer, as models/decoder.py's DecoderLayer: (residual add +) RMSNorm, the qkv matmul, per-head q/k RMSNorm
 * (Qwen3, Gemma 3) and rotary, the new keys and values written to the paged cache, attention (scores soft-capped
 * where the layer caps them: Gemma 2), o_proj, residual add + RMSNorm, the gate/up matmul, act(gate) * up (SiLU
 * or GELU's tanh form, in place over the gate half), down_proj. Gemma's sandwich (SandwichDecoderLayer, float32
 * only: its norms' weights hold 1 + weight, so the kernels' arithmetic is the modules'): the attention's output
 * normed before the residual add + the MLP's input norm, and the MLP's output normed too.
 *
 * Built with -DDECODER_BF16 the same loop runs a bf16 engine where loop_avx512_bf16.c's kernels do not exist
 * (below avx512_bf16): the elements are bf16, the kernels dense_fixed_order.c's linear_bf16_generic (bf16 panels
 * widened to fp32), quant_int8_rows.c's quant_dot_linear_bf16 (GGUF blocks), fused_torch_rounding.c's bf16 norm / rotary /
 * SiLU-and-mul and the generic attention on bf16 caches; its entry is decoder_layers_bf16_generic.
 */
#include <stdint.h>
#include <string.h>

#include "linear_pieces.h"

#ifdef DECODER_BF16
typedef uint16_t elem;
#define ATTENTION_BF16 1
#define DECODER_ENTRY decoder_layers_bf16_generic
#else
typedef float elem;
#define ATTENTION_BF16 0
#define DECODER_ENTRY decoder_layers_f32
#endif

typedef void (*DenseFn)(const elem *x, long M, long K, long x_stride, const void *packed, long N, const float *bias,
                        elem *out, long out_stride, int threads);
typedef int (*QuantFn)(const elem *x, long M, long K, long x_stride, const void *packed, int type, long N,
                       const float *bias, elem *out, long out_stride, int threads);
typedef int (*NormFn)(elem *x, long xs0, long xs1, elem *residual, long rs0, long rs1, elem *out, long os0,
                      long os1, const elem *weight, long n0, long n1, long n, float eps, int threads);
typedef int (*RotaryFn)(elem *x, long xs0, long xs1, long tokens, long heads, long d, const int64_t *positions,
                        const float *cos, const float *sin, long max_position, int threads);
typedef int (*ActFn)(const elem *x, long xs0, elem *out, long os0, long rows, long n, int threads);
typedef int (*AttentionFn)(const void *q, long q_row, const void *k_cache, const void *v_cache,
                           const int32_t *block_tables, long table_row, const int32_t *seq_lens,
                           const int32_t *query_start_loc, void *out, long out_row, int num_seqs, int num_heads,
                           int num_kv_heads, int head_dim, int block_size, float scale, int is_bf16, int window,
                           float softcap /* 0: none */,
                           int threads);

typedef struct {
    const elem *input_norm, *post_norm, *q_norm, *k_norm;  /* q_norm, k_norm: NULL without per-head norms */
    Linear qkv, o, gate_up, down; /* kinds: -1, -2: dense_fixed_order.c's fp32, bf16 panels; t: quant_exact_f32.c's GGUF type t;
                                   * KIND_DOT + t: quant_int8_rows.c's (the bf16 build: quant_int8_rows.c's either way) */
    const float *qkv_bias, *gate_up_bias;                  /* fp32, or NULL */
    elem *k_cache, *v_cache;                               /* [blocks, block_size, kv_heads, head_dim] */
    long window;                                           /* the layer's sliding window in keys; 0: none */
    const elem *pre_ffn_norm, *post_ffn_norm;              /* Gemma's two more norms; NULL: no sandwich */
    const float *cos, *sin;                                /* the layer's own rotary tables; NULL: the model's */
    float softcap;                                         /* attention scores capped at this; 0: none */
} Layer;

typedef struct {
    DenseFn dense, dense_bf16w; /* linear_f32, linear_f32_bf16w (bf16: linear_bf16_generic, unused) */
    QuantFn quant, dot; /* quant_f32_linear, quant_dot_linear_f32 (bf16: quant_dot_linear_bf16, both) */
    NormFn norm;
    RotaryFn rotary;
    ActFn act_and_mul; /* silu_and_mul or gelu_tanh_and_mul: the model's activation */
    AttentionFn attention;
    const float *cos, *sin;
    long max_position, num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, block_size;
    long rotary_dim; /* each head's leading dims that rotate (the cos/sin rows' width); head_dim, or less */
    float eps, qk_eps, scale;
    const Layer *layers;
} Model;

#define DECODER_ELEM elem
#include "decoder_step.h"

static int piece(const Model *m, const Step *s, const elem *x, long M, long K, long x_stride, const void *w,
                 long kind, long N, const float *bias, elem *out, long out_stride) {
    if (kind < 0) {
        (kind == -1 ? m->dense : m->dense_bf16w)(x, M, K, x_stride, w, N, bias, out, out_stride, s->threads);
        return 0;
    }
    if (kind >= KIND_DOT) return m->dot(x, M, K, x_stride, w, (int)(kind - KIND_DOT), N, bias, out, out_stride, s->threads);
    return m->quant(x, M, K, x_stride, w, (int)kind, N, bias, out, out_stride, s->threads);
}

/* the pieces side by side: piece p writes its rows[p] columns after the earlier pieces' */
static int linear(const Model *m, const Step *s, const elem *x, long M, long K, long x_stride, const Linear *l,
                  const float *bias, elem *out, long out_stride) {
    long at = 0;
    for (long p = 0; p < l->pieces; at += l->rows[p], p++)
        if (piece(m, s, x, M, K, x_stride, l->w[p], l->kind[p], l->rows[p], bias ? bias + at : NULL, out + at,
                  out_stride))
            return -1;
    return 0;
}

/* 0 when done; -1 when a kernel declined in layer 0 (nothing but scratch and the new tokens' own cache slots
 * written: the caller runs its modules instead); -2 when one failed later (the step cannot be run again) */
int DECODER_ENTRY(const Model *m, const Step *s) {
    const long T = s->tokens, H = m->hidden, D = m->head_dim, I = m->intermediate, th = s->threads;
    const long q_size = m->num_heads * D, kv_size = m->num_kv_heads * D, qkv_width = q_size + 2 * kv_size;
    for (long li = 0; li < m->num_layers; li++) {
        const Layer *l = &m->layers[li];
        const int failed = li == 0 ? -1 : -2;
        elem *normed = li == 0 ? s->normed : s->x;
        if (li == 0 ? m->norm(s->residual, H, 0, NULL, 0, 0, s->normed, H, 0, l->input_norm, T, 1, H, m->eps, th)
                    : m->norm(s->x, H, 0, s->residual, H, 0, s->x, H, 0, l->input_norm, T, 1, H, m->eps, th))
            return failed;
        if (linear(m, s, normed, T, H, H, &l->qkv, l->qkv_bias, s->qkv, qkv_width))
            return failed;
        const elem *q, *k, *v = s->qkv + q_size + kv_size;
        long q_row, k_row;
        if (rotated_queries_and_keys(m, s, l, &q, &q_row, &k, &k_row)) return failed;
        write_cache(l, s, k, k_row, v, qkv_width, kv_size);
        if (m->attention(q, q_row, l->k_cache, l->v_cache, s->block_tables, s->table_row, s->seq_lens,
                         s->query_start_loc, s->attn, q_size, (int)s->num_seqs, (int)m->num_heads,
                         (int)m->num_kv_heads, (int)D, (int)m->block_size, m->scale, ATTENTION_BF16, (int)l->window,
                         l->softcap, (int)th))
            return failed;
        if (linear(m, s, s->attn, T, q_size, q_size, &l->o, NULL, s->x, H))
            return -2;
        if (l->pre_ffn_norm) { /* sandwich: post_norm is the attention output's own norm */
            if (m->norm(s->x, H, 0, NULL, 0, 0, s->x, H, 0, l->post_norm, T, 1, H, m->eps, th) ||
                m->norm(s->x, H, 0, s->residual, H, 0, s->x, H, 0, l->pre_ffn_norm, T, 1, H, m->eps, th))
                return -2;
        } else if (m->norm(s->x, H, 0, s->residual, H, 0, s->x, H, 0, l->post_norm, T, 1, H, m->eps, th))
            return -2;
        if (linear(m, s, s->x, T, H, H, &l->gate_up, l->gate_up_bias, s->act, 2 * I) ||
            m->act_and_mul(s->act, 2 * I, s->act, 2 * I, T, I, (int)th) ||
            linear(m, s, s->act, T, I, 2 * I, &l->down, NULL, s->x, H) ||
            (l->post_ffn_norm && m->norm(s->x, H, 0, NULL, 0, 0, s->x, H, 0, l->post_ffn_norm, T, 1, H, m->eps, th)))
            return -2;
    }
    return 0;
}
