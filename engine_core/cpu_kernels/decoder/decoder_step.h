/* What both decoder loops share (loop_avx512_bf16.c: bf16, loop_portable.c: float32), for activations of
 * type DECODER_ELEM: the file defines it, and its Layer and Model, before including this. Here: the step's
 * arguments (one layout, loop_avx512_bf16.py's _Step), the new keys and values into their cache slots, and a
 * layer's queries and keys normed per head (Qwen3) and rotated (each head's first rotary_dim dims) by the layer's
 * own rotary tables where it has them (Gemma 3's sliding layers), else the model's. */
#include <stdint.h>
#include <string.h>

typedef struct {
    long tokens;
    const int64_t *positions, *slot_mapping;
    long num_seqs, num_decodes, table_row;
    const int32_t *block_tables, *seq_lens, *query_start_loc;
    /* buffers, rows contiguous: residual [T, hidden] holds the embeddings on entry and the residual stream on
     * return; x [T, hidden] the last layer's output on return; the rest are scratch */
    DECODER_ELEM *residual, *x, *normed, *qkv, *attn, *act, *q_normed, *k_normed; /* q/k_normed: with q_norm only */
    DECODER_ELEM *gate_up; /* [T, 2 x intermediate], where a layer's gate/up is not a fused gated kernel; else NULL */
    int threads;
    int every_row_alike; /* batch-invariant: the kernels that have two arithmetics take the one for every M */
    /* the rows that are prompt tokens, as [first, end) pairs (StepInput.prompt_runs): kept-quantized layers give
     * them their prompt arithmetic where the kernel library has one (loop_avx512_bf16.c) */
    const int64_t *prompt_runs;
    long num_prompt_runs;
} Step;

/* the new tokens' keys and values into their cache slots (slot = block * block_size + offset; a slot < 0, a
 * padding row, stores nothing) */
static void write_cache(const Layer *l, const Step *s, const DECODER_ELEM *k, long k_row, const DECODER_ELEM *v,
                        long v_row, long kv_size) {
#pragma omp parallel for num_threads(s->threads) if (s->tokens >= 256) schedule(static)
    for (long t = 0; t < s->tokens; t++) {
        if (s->slot_mapping[t] < 0) continue;
        memcpy(l->k_cache + s->slot_mapping[t] * kv_size, k + t * k_row, kv_size * sizeof(DECODER_ELEM));
        memcpy(l->v_cache + s->slot_mapping[t] * kv_size, v + t * v_row, kv_size * sizeof(DECODER_ELEM));
    }
}

/* The layer's queries and keys from the qkv rows: with per-head norms (Qwen3) normed into their own buffers,
 * then each rotated; else rotated side by side in place. Their rows and row strides in *q, *q_row, *k, *k_row;
 * nonzero when a kernel declined. */
static int rotated_queries_and_keys(const Model *m, const Step *s, const Layer *l, const DECODER_ELEM **q,
                                    long *q_row, const DECODER_ELEM **k, long *k_row) {
    const long T = s->tokens, D = m->head_dim, R = m->rotary_dim, th = s->threads; /* R <= D: partial rotary */
    const long q_size = m->num_heads * D, kv_size = m->num_kv_heads * D, qkv_width = q_size + 2 * kv_size;
    const float *cos = l->cos ? l->cos : m->cos, *sin = l->sin ? l->sin : m->sin;
    if (l->q_norm) {
        if (m->norm(s->qkv, qkv_width, D, NULL, 0, 0, s->q_normed, q_size, D, l->q_norm, T, m->num_heads, D,
                    m->qk_eps, th) ||
            m->norm(s->qkv + q_size, qkv_width, D, NULL, 0, 0, s->k_normed, kv_size, D, l->k_norm, T,
                    m->num_kv_heads, D, m->qk_eps, th) ||
            m->rotary(s->q_normed, q_size, D, T, m->num_heads, R, s->positions, cos, sin, m->max_position, th) ||
            m->rotary(s->k_normed, kv_size, D, T, m->num_kv_heads, R, s->positions, cos, sin,
                      m->max_position, th))
            return -1;
        *q = s->q_normed, *q_row = q_size, *k = s->k_normed, *k_row = kv_size;
        return 0;
    }
    if (m->rotary(s->qkv, qkv_width, D, T, m->num_heads + m->num_kv_heads, R, s->positions, cos, sin,
                  m->max_position, th))
        return -1;
    *q = s->qkv, *q_row = qkv_width, *k = s->qkv + q_size, *k_row = qkv_width;
    return 0;
}
