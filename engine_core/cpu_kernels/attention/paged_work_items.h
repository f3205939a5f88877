/* Work items of the paged attention kernels that take any number of query rows per sequence
 * (paged_avx512_bf16.c's chunk kernel, paged_fixed_order.c): one item is (sequence, KV head, up to
 * `rows_per_item` consecutive query rows of that sequence). Which items a step has never changes how
 * a row is computed; it only decides which thread computes it and when. */
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    int seq, kv_head, row0;
    long cost; /* query rows x keys up to the last row's diagonal: the item's share of the work */
} WorkItem;

static int costlier_first(const void *a, const void *b) {
    const long x = ((const WorkItem *)a)->cost, y = ((const WorkItem *)b)->cost;
    return (x < y) - (x > y);
}

/* The step's items, costliest first (a dynamic schedule then ends with short items and the threads
 * finish together), their number in *count. NULL where a sequence's query rows do not fit its
 * seq_lens (bad arguments) or memory ran out; the caller frees the list. */
static WorkItem *paged_work_items(const int32_t *query_start_loc, const int32_t *seq_lens, int num_seqs,
                                  int num_kv_heads, int rows_per_item, long *count) {
    long n = 0;
    for (int s = 0; s < num_seqs; s++) {
        const int q_len = query_start_loc[s + 1] - query_start_loc[s];
        if (q_len < 0 || q_len > seq_lens[s]) return NULL;
        n += (long)(q_len + rows_per_item - 1) / rows_per_item * num_kv_heads;
    }
    WorkItem *items = malloc(sizeof(WorkItem) * (n ? n : 1));
    if (!items) return NULL;
    n = 0;
    for (int s = 0; s < num_seqs; s++) {
        const int q_len = query_start_loc[s + 1] - query_start_loc[s];
        for (int row0 = 0; row0 < q_len; row0 += rows_per_item) {
            const int rows = q_len - row0 < rows_per_item ? q_len - row0 : rows_per_item;
            const long keys = seq_lens[s] - q_len + row0 + rows;
            for (int h = 0; h < num_kv_heads; h++) items[n++] = (WorkItem){s, h, row0, keys * rows};
        }
    }
    qsort(items, n, sizeof(WorkItem), costlier_first);
    *count = n;
    return items;
}
