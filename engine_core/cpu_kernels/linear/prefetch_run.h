/* A one-pass kernel that reads a few adjacent columns (or panels) a piece of each at a time reads them as one run
 * of bytes. It prefetches that run in order, `PREFETCH_AHEAD` bytes past its position in the run: a prefetch per
 * column would leave the hardware a new stream to find at every column, a few hundred bytes each in GGUF files. */
#ifndef NVLLM_PREFETCH_RUN_H
#define NVLLM_PREFETCH_RUN_H
#include <stdint.h>

/* the `bytes` bytes that follow position `at` of the run by `ahead` */
static inline void prefetch_run(const uint8_t *at, long bytes, long ahead) {
    for (long offset = 0; offset < bytes; offset += 64) __builtin_prefetch(at + ahead + offset, 0, 3);
}
#endif
