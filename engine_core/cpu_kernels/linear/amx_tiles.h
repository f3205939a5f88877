/* What the AMX kernels share: the OS grant of the tile state, and tile configurations.
 *
 * Linux hands out AMX's tile state (8 KB per thread) only on request: arch_prctl(ARCH_REQ_XCOMP_PERM,
 * XTILEDATA), once per process; every thread of the process may then use the tiles. A kernel that is
 * refused (an old kernel, a hypervisor that hides the state) runs its AVX512 path instead.
 */
#ifndef NVLLM_AMX_TILES_H
#define NVLLM_AMX_TILES_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct __attribute__((packed)) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} AmxConfig;

/* 1 where this process may use the tiles (asked once; asking again is harmless, so a race is too) */
static int amx_permitted(void) {
    static int state; /* 0: not asked yet, 1: granted, -1: refused */
    if (!state) state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0 ? 1 : -1;
    return state > 0;
}

/* a configuration of `count` tiles, tile t rows[t] x colsb[t] bytes (a tile of no rows is unused) */
static void amx_load_config(const uint8_t *rows, const uint16_t *colsb, int count) {
    AmxConfig config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < count; t++) config.rows[t] = rows[t], config.colsb[t] = rows[t] ? colsb[t] : 0;
    /* GCC's _tile_loadconfig tells the compiler it reads 8 bytes of the 64: without this barrier, stores of
     * constant rows and widths were dropped as dead, and the first tile instruction faulted */
    __asm__ __volatile__("" : : "r"(&config) : "memory");
    _tile_loadconfig(&config);
}

/* a configuration of `count` tiles, each rows[t] x 64 bytes */
static void amx_configure_rows(const uint8_t *rows, int count) {
    static const uint16_t full[16] = {64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64, 64};
    amx_load_config(rows, full, count);
}

/* the tiles of a pass of up to 32 rows x 2 panels (amx_gemm.c, amx_quant.c): C 0-3 (row tiles 0, 1 x column
 * tiles 0, 1), A 4-5, B 6-7; r0 rows in row tile 0, r1 in row tile 1 (0: unused); B always 16 input pairs */
static void amx_configure_pass(int r0, int r1) {
    const uint8_t rows[8] = {(uint8_t)r0, (uint8_t)r0, (uint8_t)r1, (uint8_t)r1, (uint8_t)r0, (uint8_t)r1, 16, 16};
    amx_configure_rows(rows, 8);
}
#endif
