/* Paged attention on AMX tiles (the amx tier): paged_avx512_bf16.c's chunk kernel with its two products per tile of
 * 64 keys, the scores (Q K^T) and the weighted values (P V), run by TDPBF16PS instead of vdpbf16ps.
 *
 * Why: in a prefill step with the linear layers on tiles (amx_gemm.c), the chunk kernel's vdpbf16ps were a
 * third of the step. A tile product does 16 query vectors x 16 keys x 32 head dims in one instruction.
 *
 * What stays paged_avx512_bf16.c's: the work items, the walk over an item's key tiles (keys read in place through
 * the block table, the tile's keys transposed into key pairs kT and its values interleaved into pairs vP),
 * the online softmax of each query vector (softmax_step) and the output. kT and vP are already the layouts
 * of B tiles: for 16 keys and 32 head dims, kT's 16 vectors are one B tile (row i: head dims 2i, 2i + 1 of
 * each key); for 32 keys and 16 output dims, vP's vectors D / 16 apart are one (row k: keys 2k, 2k + 1).
 *
 * Per item (sequence, KV head, up to ROWS rows), its query vectors v = row x group + head are copied side
 * by side, and each block of 16 of them is one A tile. Per key tile and block:
 *   scores    C[v][key] over the 16-key parts the block's last row sees, stored to memory;
 *   softmax   per vector, as the AVX512 kernel does it (masks, running max, rescale, sums, bf16 probs);
 *   values    the tile's P V from zero in C tiles (a row's probabilities past what it sees are 0), added to
 *             the vector's running sums: acc = acc x correction + (P V of this tile).
 * Row independence: a tile product forms each row of C from that row of A alone, over the same key pairs in
 * the same order whatever the other rows; a block that takes more parts than a row sees adds exact zeros to
 * that row (probabilities 0, masked scores -inf), and TDPBF16PS's output is never a denormal (flushed), so
 * adding zeros leaves its sums as they were. Tiles are aligned to absolute key positions as in paged_avx512_bf16.c.
 * So a row's bits depend on its position and its own keys only: not on the batch, its chunking or a cached
 * prefix. (They differ from the avx512_bf16 tier's in the last bits: another order of sums.)
 *
 * A drop-in library: the same exported functions as paged_avx512_bf16.c (paged_decode_attention unchanged), so the
 * attention backend and the C decoder loop take it unchanged. Where the OS refuses the tile state
 * (amx_tiles.h), amx_ready() says so and paged_avx512_bf16.c's library serves instead.
 */
#define paged_attention avx512_paged_attention
#include "paged_avx512_bf16.c"
#undef paged_attention

#include "../linear/amx_tiles.h"

#define BLOCK 16 /* query vectors per A tile */

int amx_ready(void) { return amx_permitted(); }

/* tiles 0-3: C (scores of 4 16-key parts, or 4 groups of 16 output dims); 4: A; 5, 6: B; each 16 x 64 bytes */
static void configure_tiles(void) {
    static const uint8_t rows[7] = {16, 16, 16, 16, 16, 16, 16};
    amx_configure_rows(rows, 7);
}

typedef struct {
    uint16_t *queries; /* [blocks x BLOCK][D]: the item's query vectors, zeros past the last */
    float *scores;     /* [BLOCK][CT] */
    uint16_t *probs;   /* [BLOCK][CT] bf16 */
    float *values;     /* [BLOCK][D]: a block's P V over one tile */
    RowState st;
} AmxScratch;

/* C tile `n` += A 4 x (B tile `b` from kT); n, b constants */
#define SCORE_PART(n, b)                                                                         \
    if (parts > n) {                                                                              \
        _tile_loadd(b, kT + n * (D / 2) + h * 16, 64);                                            \
        _tile_dpbf16ps(n, 4, b);                                                                  \
    }

/* C tile `x` += A 4 x (B tile `b`: 32 keys' pairs for output dims group g0 + x) */
#define VALUE_GROUP(x, b)                                                                        \
    if (g0 + x < D / 16) {                                                                        \
        _tile_loadd(b, vP + (long)16 * kh * (D / 16) + g0 + x, D / 16 * 64);                      \
        _tile_dpbf16ps(x, 4, b);                                                                  \
    }

/* the block's scores over the first `parts` 16-key parts of the tile, into s->scores */
static inline __attribute__((always_inline)) void block_scores(const __m512bh *kT, const uint16_t *queries, int parts,
                                                               float *scores, const int D) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int h = 0; h < D / 32; h++) {
        _tile_loadd(4, queries + 32 * h, 2 * D);
        SCORE_PART(0, 5) SCORE_PART(1, 6) SCORE_PART(2, 5) SCORE_PART(3, 6)
    }
    _tile_stored(0, scores, CT * 4);
    if (parts > 1) _tile_stored(1, scores + 16, CT * 4);
    if (parts > 2) _tile_stored(2, scores + 32, CT * 4);
    if (parts > 3) _tile_stored(3, scores + 48, CT * 4);
}

/* the block's probabilities (keys 0 .. 32 halves - 1 of the tile) times the tile's values, into values */
static inline __attribute__((always_inline)) void block_values(const __m512bh *vP, const uint16_t *probs, int halves,
                                                               float *values, const int D) {
    for (int g0 = 0; g0 < D / 16; g0 += 4) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int kh = 0; kh < halves; kh++) {
            _tile_loadd(4, probs + 32 * kh, CT * 2);
            VALUE_GROUP(0, 5) VALUE_GROUP(1, 6) VALUE_GROUP(2, 5) VALUE_GROUP(3, 6)
        }
        _tile_stored(0, values + 16 * g0, D * 4);
        if (g0 + 1 < D / 16) _tile_stored(1, values + 16 * (g0 + 1), D * 4);
        if (g0 + 2 < D / 16) _tile_stored(2, values + 16 * (g0 + 2), D * 4);
        if (g0 + 3 < D / 16) _tile_stored(3, values + 16 * (g0 + 3), D * 4);
    }
}

/* softmax_step with NH a constant (1 to CT_PARTS) */
static inline __attribute__((always_inline)) void softmax_parts(const ChunkJob *j, __m512 *s, int visible, int hidden,
                                                                float *acc, float *running_max, __m512 *running_sum,
                                                                uint16_t *probs, const int D, int parts) {
    switch (parts) {
    case 1: softmax_step(j, s, visible, hidden, acc, running_max, running_sum, probs, D, 1); break;
    case 2: softmax_step(j, s, visible, hidden, acc, running_max, running_sum, probs, D, 2); break;
    case 3: softmax_step(j, s, visible, hidden, acc, running_max, running_sum, probs, D, 3); break;
    default: softmax_step(j, s, visible, hidden, acc, running_max, running_sum, probs, D, CT_PARTS); break;
    }
}

static inline __attribute__((always_inline)) void amx_attend_chunk(const ChunkJob *j, const WorkItem *item,
                                                                   AmxScratch *sc, const int G, const int D) {
    const Job *b = &j->base;
    ItemWalk w;
    walk_begin(j, item, &w, D);
    const int vectors = w.rows * G, blocks = (vectors + BLOCK - 1) / BLOCK;
    for (int v = 0; v < blocks * BLOCK; v++) {
        uint16_t *dst = sc->queries + (long)v * D;
        if (v < vectors)
            memcpy(dst, b->q + (long)(w.q_first + item->row0 + v / G) * b->q_row + w.head_offset * G + (long)(v % G) * D,
                   sizeof(uint16_t) * D);
        else
            memset(dst, 0, sizeof(uint16_t) * D);
    }
    const RowState st = sc->st;
    clear_rows(st, vectors, D);
    __m512bh kT[CT_PARTS * MAX_HEAD_DIM / 2], vP[CT / 2 * MAX_HEAD_DIM / 16];
    for (int start = w.start0, which = 0; start <= w.last; start += CT, which ^= 1) {
        const int parts = walk_tile(j, &w, start, which, kT, vP, D);
        if (parts % 2) /* the unprepared half of the last 32 keys: weighed by 0, and 0 x NaN would be NaN */
            memset(vP + (long)parts * 8 * (D / 16), 0, sizeof(__m512bh) * 8 * (D / 16));
        for (int block = 0; block < blocks; block++) {
            const int v0 = block * BLOCK, v_end = v0 + BLOCK < vectors ? v0 + BLOCK : vectors;
            const int last_pos = w.pos0 + (v_end - 1) / G; /* the block's last row */
            if (last_pos < start) continue; /* every row of the block comes before the tile */
            const int block_parts = last_pos - start >= CT - 1 ? CT_PARTS : (last_pos - start) / 16 + 1;
            const int halves = (block_parts + 1) / 2;
            block_scores(kT, sc->queries + (long)v0 * D, block_parts, sc->scores, D);
            int seen[BLOCK];
            for (int v = v0; v < v_end; v++) {
                const int pos = w.pos0 + v / G, visible = pos - start + 1;
                const int hidden = b->window > 0 ? pos - b->window + 1 - start : 0;
                uint16_t *probs = sc->probs + (long)(v - v0) * CT;
                seen[v - v0] = visible > 0;
                if (!seen[v - v0]) { /* a row before the tile: its state stays, its row of P V is 0 */
                    memset(probs, 0, sizeof(uint16_t) * 32 * halves);
                    continue;
                }
                __m512 s[CT_PARTS];
                for (int h = 0; h < block_parts; h++) s[h] = _mm512_loadu_ps(sc->scores + (long)(v - v0) * CT + 16 * h);
                softmax_parts(j, s, visible, hidden, st.acc + (long)v * D, st.maxes + v, st.sums + v, probs, D,
                              block_parts);
                if (block_parts % 2) memset(probs + 16 * block_parts, 0, sizeof(uint16_t) * 16);
            }
            block_values(vP, sc->probs, halves, sc->values, D);
            for (int v = v0; v < v_end; v++) {
                if (!seen[v - v0]) continue;
                float *acc = st.acc + (long)v * D;
                const float *add = sc->values + (long)(v - v0) * D;
                for (int k = 0; k < D; k += 16)
                    _mm512_store_ps(acc + k, _mm512_add_ps(_mm512_load_ps(acc + k), _mm512_loadu_ps(add + k)));
            }
        }
    }
    write_rows(j, &w, st, item->row0, G, D);
}

#define AMX_INSTANCE(G, HD) \
    static void amx_chunk_g##G##_d##HD(const ChunkJob *j, const WorkItem *item, AmxScratch *s) { amx_attend_chunk(j, item, s, G, HD); }
AMX_INSTANCE(1, 64) AMX_INSTANCE(2, 64) AMX_INSTANCE(3, 64) AMX_INSTANCE(4, 64) AMX_INSTANCE(8, 64)
AMX_INSTANCE(1, 128) AMX_INSTANCE(2, 128) AMX_INSTANCE(4, 128) AMX_INSTANCE(8, 128)
static void amx_chunk_any(const ChunkJob *j, const WorkItem *item, AmxScratch *s) {
    amx_attend_chunk(j, item, s, j->base.num_heads / j->base.num_kv_heads, j->base.head_dim);
}

typedef void (*AmxChunkFn)(const ChunkJob *, const WorkItem *, AmxScratch *);

static AmxChunkFn pick_amx_chunk(int group, int head_dim) {
#define CASE(G, HD) if (group == G && head_dim == HD) return amx_chunk_g##G##_d##HD;
    CASE(1, 64) CASE(2, 64) CASE(3, 64) CASE(4, 64) CASE(8, 64)
    CASE(1, 128) CASE(2, 128) CASE(4, 128) CASE(8, 128)
#undef CASE
    return amx_chunk_any;
}

/* paged_avx512_bf16.c's paged_attention, its arguments and results the same */
int paged_attention(const uint16_t *q, long q_row, const uint16_t *k_cache, const uint16_t *v_cache,
                    const int32_t *block_tables, long table_row, const int32_t *seq_lens,
                    const int32_t *query_start_loc, uint16_t *out, long out_row, int num_seqs, int num_heads,
                    int num_kv_heads, int head_dim, int block_size, float scale, int window, int nthreads) {
    if (!amx_permitted())
        return avx512_paged_attention(q, q_row, k_cache, v_cache, block_tables, table_row, seq_lens, query_start_loc,
                                      out, out_row, num_seqs, num_heads, num_kv_heads, head_dim, block_size, scale,
                                      window, nthreads);
    ChunkJob job;
    long n = 0;
    WorkItem *items = chunk_work(q, q_row, k_cache, v_cache, block_tables, table_row, seq_lens, query_start_loc, out,
                                 out_row, num_seqs, num_heads, num_kv_heads, head_dim, block_size, scale, window, &job,
                                 &n);
    if (!items) return -1;
    const int group = num_heads / num_kv_heads, D = head_dim;
    const AmxChunkFn fn = pick_amx_chunk(group, head_dim);
    const long vectors = (long)ROWS * group, padded = (vectors + BLOCK - 1) / BLOCK * BLOCK;
    /* each part a multiple of 64 bytes: acc, sums (vectors), maxes, queries, scores, probs, values */
    const size_t acc = sizeof(float) * vectors * D, sums = 64 * vectors, maxes = (sizeof(float) * vectors + 63) / 64 * 64;
    const size_t queries = 2 * padded * D, scores = sizeof(float) * BLOCK * CT, probs = 2 * BLOCK * CT;
    const size_t bytes = acc + sums + maxes + queries + scores + probs + sizeof(float) * BLOCK * D;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        char *base = aligned_alloc(64, bytes);
        if (!base) {
#pragma omp atomic write
            failed = 1;
        } else {
            configure_tiles();
        }
        AmxScratch scratch = {0};
        if (base) {
            scratch.st = (RowState){(float *)base, (__m512 *)(base + acc), (float *)(base + acc + sums)};
            scratch.queries = (uint16_t *)(base + acc + sums + maxes);
            scratch.scores = (float *)((char *)scratch.queries + queries);
            scratch.probs = (uint16_t *)((char *)scratch.scores + scores);
            scratch.values = (float *)((char *)scratch.probs + probs);
        }
#pragma omp for schedule(dynamic, 1) nowait /* one barrier (the region's end), not two */
        for (long i = 0; i < n; i++)
            if (base) fn(&job, &items[i], &scratch);
        /* tiles left configured keep the thread's AMX state live: the AVX512 work that follows ran slower (a
         * one-user decode step took 1.2x as long) */
        if (base) _tile_release();
        free(base);
    }
    free(items);
    return failed ? -1 : 0;
}
