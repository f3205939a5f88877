/* A Llama-family model's decoder layers for one step, in one call (bfloat16, AVX512-BF16 CPUs).
 *
 * The Python model runs each layer as about a dozen module calls, wrapper checks, tensor views and
 * ctypes calls: ~0.25 ms of host work per layer, 15-20% of a batched decode step. This file runs the
 * same kernels, in the same order, on the same buffers, from one loop: the results are the Python
 * path's bit for bit (tested). It holds no arithmetic of its own: every kernel is a function of the
 * other kernel libraries (dense_bf16_dot.c, quant_bf16_dot.c, quant_int8_rows.c, fused_torch_rounding.c, paged_avx512_bf16.c), passed in as a pointer.
 *
 * One layer, as models/decoder.py's DecoderLayer: (residual add +) RMSNorm, the qkv matmul, per-head q/k
 * RMSNorm (Qwen3) and rotary, the new keys and values written to the paged cache, attention (the
 * decode kernel for one-token sequences, the chunk kernel for the rest), o_proj, residual add +
 * RMSNorm, gate/up matmul with silu(gate) * up, down_proj.
 */
#include <stdint.h>
#include <string.h>

#include "linear_pieces.h"

typedef uint16_t bf16;

typedef void (*LinearFn)(const bf16 *x, long M, long K, long x_stride, const bf16 *packed, long N,
                         const float *bias, bf16 *out, long out_stride, int threads);
typedef void (*GatedFn)(const bf16 *x, long M, long K, long x_stride, const bf16 *packed, long I,
                        const float *bias, bf16 *out, long out_stride, const bf16 *silu, int threads);
typedef int (*QuantLinearFn)(const bf16 *x, long M, long K, long x_stride, const void *packed, int format, long N,
                             const float *bias, bf16 *out, long out_stride, int every_row_alike, int threads);
typedef int (*QuantGatedFn)(const bf16 *x, long M, long K, long x_stride, const void *packed, int format, long I,
                            const float *bias, bf16 *out, long out_stride, const bf16 *silu, int every_row_alike,
                            int threads);
typedef int (*QuantPromptFn)(const bf16 *x, long M, long K, long x_stride, const void *packed, int format, long N,
                             const float *bias, bf16 *out, long out_stride, int threads);
typedef int (*QuantPromptGatedFn)(const bf16 *x, long M, long K, long x_stride, const void *packed, int format,
                                  long I, const float *bias, bf16 *out, long out_stride, const bf16 *silu,
                                  int threads);
typedef int (*DotFn)(const bf16 *x, long M, long K, long x_stride, const void *packed, int type, long N,
                     const float *bias, bf16 *out, long out_stride, int threads);
typedef int (*SiluFn)(const bf16 *x, long xs0, bf16 *out, long os0, long rows, long n, int threads);
typedef int (*NormFn)(const bf16 *x, long xs0, long xs1, bf16 *residual, long rs0, long rs1, bf16 *out, long os0,
                      long os1, const bf16 *weight, long n0, long n1, long n, float eps, int threads);
typedef int (*RotaryFn)(bf16 *x, long xs0, long xs1, long tokens, long heads, long d, const int64_t *positions,
                        const float *cos, const float *sin, long max_position, int threads);
typedef int (*DecodeFn)(const bf16 *q, long q_row, const bf16 *k_cache, const bf16 *v_cache,
                        const int32_t *block_tables, long table_row, const int32_t *seq_lens, bf16 *out,
                        long out_row, int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size,
                        float scale, int window, int threads);
typedef int (*ChunkFn)(const bf16 *q, long q_row, const bf16 *k_cache, const bf16 *v_cache,
                       const int32_t *block_tables, long table_row, const int32_t *seq_lens,
                       const int32_t *query_start_loc, bf16 *out, long out_row, int num_seqs, int num_heads,
                       int num_kv_heads, int head_dim, int block_size, float scale, int window, int threads);

typedef struct {
    const bf16 *input_norm, *post_norm, *q_norm, *k_norm; /* q_norm, k_norm: NULL without per-head norms */
    /* kinds: -1: bf16 panels; f >= 0: quant_bf16_dot.c's format f; KIND_DOT + t: quant_int8_rows.c's GGUF type t. A gate_up of
     * one piece of the first two kinds is a fused gated kernel (gated order), else gate | up then SiLU-and-mul */
    Linear qkv, o, gate_up, down;
    const float *qkv_bias, *gate_up_bias;                 /* fp32 in packed order, or NULL */
    bf16 *k_cache, *v_cache;                              /* [blocks, block_size, kv_heads, head_dim] */
    long window;                                          /* the layer's sliding window in keys; 0: none */
    /* loop_portable.c's Gemma fields (the layout is shared): NULL / 0 here, where IMPLEMENTED refuses Gemma */
    const bf16 *pre_ffn_norm, *post_ffn_norm;
    const float *cos, *sin;
    float softcap;
} Layer;

typedef struct {
    LinearFn linear;
    GatedFn gated;
    QuantLinearFn quant_linear; /* quant_bf16_dot.c's, for layers whose weights are kept quantized */
    QuantGatedFn quant_gated;
    /* amx_quant.c's arithmetic for prompt rows (the dequantized model's, on AMX tiles); NULL: one arithmetic */
    QuantPromptFn quant_prompt;
    QuantPromptGatedFn quant_prompt_gated;
    DotFn dot;   /* quant_int8_rows.c's quant_dot_linear_bf16 */
    /* amx_quant.c's dot_prompt_linear_bf16 for the prompt rows of quant_int8_rows.c's Q5 layers; NULL: one arithmetic */
    DotFn dot_prompt;
    SiluFn silu; /* fused_torch_rounding.c's silu_and_mul_bf16, after a gate_up that is not a fused gated kernel */
    NormFn norm;
    RotaryFn rotary;
    DecodeFn decode;
    ChunkFn chunk;
    const bf16 *silu_table;
    const float *cos, *sin;
    long max_position, num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, block_size;
    long rotary_dim; /* each head's leading dims that rotate (the cos/sin rows' width); head_dim, or less */
    float eps, qk_eps, scale;
    const Layer *layers;
} Model;

#define DECODER_ELEM bf16
#include "decoder_step.h"

/* rows [r0, r1) of a kept-quantized weight of `kind` (gated where silu: quant_bf16_dot.c's formats only): prompt rows
 * through the prompt arithmetic where the weight has one, others through the one for every row */
static int quant_rows(const Model *m, const Step *s, int prompt, const bf16 *x, long r0, long r1, long K,
                      const void *w, long kind, long N, const float *bias, bf16 *out, long out_stride,
                      const bf16 *silu) {
    const bf16 *xr = x + r0 * K;
    bf16 *o = out + r0 * out_stride;
    const long M = r1 - r0;
    if (kind >= KIND_DOT) {
        const int type = (int)(kind - KIND_DOT);
        const int done = prompt ? m->dot_prompt(xr, M, K, K, w, type, N, bias, o, out_stride, s->threads) : 1;
        return done == 1 ? m->dot(xr, M, K, K, w, type, N, bias, o, out_stride, s->threads) : done;
    }
    const int format = (int)kind;
    if (prompt)
        return silu ? m->quant_prompt_gated(xr, M, K, K, w, format, N / 2, bias, o, out_stride, silu, s->threads)
                    : m->quant_prompt(xr, M, K, K, w, format, N, bias, o, out_stride, s->threads);
    return silu ? m->quant_gated(xr, M, K, K, w, format, N / 2, bias, o, out_stride, silu, s->every_row_alike,
                                 s->threads)
                : m->quant_linear(xr, M, K, K, w, format, N, bias, o, out_stride, s->every_row_alike, s->threads);
}

/* every row of a kept-quantized weight: a token's arithmetic depends on whether it is a prompt token, never on
 * which rows share its step (the runs split the rows, each row's result is its own) */
static int kept_linear(const Model *m, const Step *s, const bf16 *x, long M, long K, const void *w, long kind,
                       long N, const float *bias, bf16 *out, long out_stride, const bf16 *silu) {
    const int roles = kind >= KIND_DOT ? m->dot_prompt != NULL : m->quant_prompt != NULL;
    long row = 0;
    for (long r = 0; roles && r < s->num_prompt_runs; r++) {
        const long first = s->prompt_runs[2 * r], end = s->prompt_runs[2 * r + 1];
        if ((first > row && quant_rows(m, s, 0, x, row, first, K, w, kind, N, bias, out, out_stride, silu)) ||
            quant_rows(m, s, 1, x, first, end, K, w, kind, N, bias, out, out_stride, silu))
            return -1;
        row = end;
    }
    return row < M ? quant_rows(m, s, 0, x, row, M, K, w, kind, N, bias, out, out_stride, silu) : 0;
}

/* a linear layer through the kernels its pieces need, each into its columns of out [M, sum rows] (row stride
 * out_stride); 0, or nonzero when a kernel ran out of memory */
static int linear(const Model *m, const Step *s, const bf16 *x, long M, long K, const Linear *l, const float *bias,
                  bf16 *out, long out_stride) {
    long at = 0;
    for (long p = 0; p < l->pieces; at += l->rows[p], p++) {
        const long kind = l->kind[p], N = l->rows[p];
        const float *b = bias ? bias + at : NULL;
        if (kind < 0)
            m->linear(x, M, K, K, l->w[p], N, b, out + at, out_stride, s->threads);
        else if (kept_linear(m, s, x, M, K, l->w[p], kind, N, b, out + at, out_stride, NULL))
            return -1;
    }
    return 0;
}

/* silu(gate) * up [M, I] into out: the fused gated kernels, or gate | up into the step's scratch, then SiLU-and-mul */
static int gated(const Model *m, const Step *s, const bf16 *x, long M, long K, const Linear *l, long I,
                 const float *bias, bf16 *out) {
    const long kind = l->kind[0];
    if (l->pieces == 1 && kind < 0) {
        m->gated(x, M, K, K, l->w[0], I, bias, out, I, m->silu_table, s->threads);
        return 0;
    }
    if (l->pieces == 1 && kind < KIND_DOT)
        return kept_linear(m, s, x, M, K, l->w[0], kind, 2 * I, bias, out, I, m->silu_table);
    return linear(m, s, x, M, K, l, bias, s->gate_up, 2 * I) || m->silu(s->gate_up, 2 * I, out, I, M, I, s->threads);
}

/* The decoder layers for one step. 0 when done; -1 when a kernel declined its input (a position past
 * the rotary table, an attention shape the kernels do not take, no memory for a quantized kernel's scratch)
 * in layer 0, where nothing but scratch
 * and the new tokens' own cache slots (rewritten alike by any retry) was written: the caller then
 * runs its own code; -2 when a kernel failed later (the residual stream is then partly
 * updated: the step cannot be run again). */
int decoder_layers_bf16(const Model *m, const Step *s) {
    const long T = s->tokens, H = m->hidden, D = m->head_dim, I = m->intermediate, th = s->threads;
    const long q_size = m->num_heads * D, kv_size = m->num_kv_heads * D, qkv_width = q_size + 2 * kv_size;
    for (long li = 0; li < m->num_layers; li++) {
        const Layer *l = &m->layers[li];
        const int failed = li == 0 ? -1 : -2;
        /* input norm: of the embeddings (layer 0), else of x + residual (in place, as the module does) */
        bf16 *normed = li == 0 ? s->normed : s->x;
        if (li == 0 ? m->norm(s->residual, H, 0, NULL, 0, 0, s->normed, H, 0, l->input_norm, T, 1, H, m->eps, th)
                    : m->norm(s->x, H, 0, s->residual, H, 0, s->x, H, 0, l->input_norm, T, 1, H, m->eps, th))
            return failed;
        if (linear(m, s, normed, T, H, &l->qkv, l->qkv_bias, s->qkv, qkv_width)) return failed;
        const bf16 *q, *k, *v = s->qkv + q_size + kv_size;
        long q_row, k_row;
        if (rotated_queries_and_keys(m, s, l, &q, &q_row, &k, &k_row)) return failed;
        write_cache(l, s, k, k_row, v, qkv_width, kv_size);
        const long nd = s->num_decodes;
        if (nd && m->decode(q, q_row, l->k_cache, l->v_cache, s->block_tables, s->table_row, s->seq_lens, s->attn,
                            q_size, (int)nd, (int)m->num_heads, (int)m->num_kv_heads, (int)D, (int)m->block_size,
                            m->scale, (int)l->window, th))
            return failed;
        if (nd < s->num_seqs &&
            m->chunk(q, q_row, l->k_cache, l->v_cache, s->block_tables + nd * s->table_row, s->table_row,
                     s->seq_lens + nd, s->query_start_loc + nd, s->attn, q_size, (int)(s->num_seqs - nd),
                     (int)m->num_heads, (int)m->num_kv_heads, (int)D, (int)m->block_size, m->scale, (int)l->window, th))
            return failed;
        if (linear(m, s, s->attn, T, q_size, &l->o, NULL, s->x, H) ||
            m->norm(s->x, H, 0, s->residual, H, 0, s->x, H, 0, l->post_norm, T, 1, H, m->eps, th) ||
            gated(m, s, s->x, T, H, &l->gate_up, I, l->gate_up_bias, s->act) ||
            linear(m, s, s->act, T, I, &l->down, NULL, s->x, H))
            return -2;
    }
    return 0;
}
