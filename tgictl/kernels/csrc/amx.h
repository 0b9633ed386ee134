/* AMX tiles for the C kernels (int4_bf16.c, amx_linear.c): whether this process may use them, and a
 * configuration of palette 1 with per-tile shapes. Defines HAVE_AMX where the build targets AMX-BF16. */
#ifndef TGICTL_AMX_H
#define TGICTL_AMX_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "decoded_linear.h"

#if defined(__AVX512BF16__) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define HAVE_AMX 1
#include <immintrin.h>

/* Linux hands out the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA), once
 * per process; without it the first tile instruction faults. Refused (an old kernel): the callers take
 * their AVX-512 paths. */
#define TGICTL_ARCH_REQ_XCOMP_PERM 0x1023
#define TGICTL_XFEATURE_XTILEDATA 18

static inline int amx_ready(void) {
    static int state = 0; /* 0: not asked yet, 1: granted, -1: refused */
    int now = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (now == 0) {
        now = syscall(SYS_arch_prctl, TGICTL_ARCH_REQ_XCOMP_PERM, TGICTL_XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        __atomic_store_n(&state, now, __ATOMIC_RELEASE);
    }
    return now == 1;
}

struct amx_tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Tiles tmm0..7 as rows[t] rows of 64 bytes; a tile of 0 rows stays unconfigured (never touched). */
static inline void amx_configure(const int rows[8]) {
    struct amx_tile_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) {
        config.rows[t] = (uint8_t)rows[t];
        config.colsb[t] = rows[t] > 0 ? 64 : 0;
    }
    _tile_loadconfig(&config);
}
#endif

#endif
