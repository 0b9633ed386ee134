/* y = x W^T + b for int4 tiles (tgictl/kernels/linear_methods/int4.py) and 1-4 bf16 input rows: decode at
 * small batch, on CPUs with AVX512-BF16 and AVX512-VBMI (AMD Zen 4 and later, Intel Sapphire Rapids and later).
 *
 * quant_linear.c's float32 kernel widens every weight nibble to a float (byte -> int32 -> float) and does one
 * FMA per weight and input row: at one row it is compute bound, at ~30 GB/s of packed weights on 2 Zen 5 cores
 * with the tile in cache, and a GGUF SmolLM2 decode step spent ~40% of its time there. Here the two columns
 * c, c + 1 of a tile (64 bytes, one load) become bf16 pairs in registers: one VPERMB per 32 rows places row
 * j's bytes of the two columns side by side in a 32-bit lane, a mask or a shift keeps one nibble per 16-bit
 * half, and VPERMW looks the nibble's bf16 value up in a 16-entry table (0..15 are exact in bf16). VDPBF16PS
 * then multiplies 16 rows by both columns at once against the input row's pair (x[c], x[c+1]) broadcast.
 * Per 2 columns and 64 rows: 1 load, 2 VPERMB, 4 VPERMW, 4 AND/shift, 4 VDPBF16PS per input row, against
 * 10 + 4 per input row per column before.
 *
 * Numerics: x is bf16 (the serving dtype), so every product q x is exact in float32; the sums run per group
 * in float32, two columns per instruction, then the group's scale and offset apply as in quant_linear.c:
 *   y[i, n] = sum_g scale[g, n] * sum_{k in g} q[n, k] x[i, k] + (zero[g, n] - 8 scale[g, n]) * sum_{k in g} x[i, k]
 * (x's group sums in float32, in column order). The same value as the float32 kernel up to the order of
 * float additions (and VDPBF16PS's flushing of denormal inputs and products to zero).
 *
 * Layouts as quant_linear.c: x [m, k] bf16, packed [ceil(n / 64), k_pad, 32] uint8, scales_zeros bf16 as
 * `sz_form` says ([k_pad / group, n_pad, 2] pairs, or [k_pad / group, n_pad] scales of a symmetric format, whose
 * step then reads 18 bytes per 32 weights instead of 20), bias [n] float32 or NULL, y [m, n] float32. The group
 * size is even.
 * Returns 0; -1 where this build lacks the instructions (tgictl_int4_rows_bf16_available() says so once),
 * m is outside 1..4, the group size is odd, the scales are not bf16 or scratch memory was refused (the caller
 * then takes the float32 kernel).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "int4_scales.h"

#define TILE 64
#define HALF_TILE 32
#define MAX_ROWS 4
/* How far ahead of the load the weight stream is prefetched: alone, the hardware prefetchers kept a decode
 * step's stream of tiles at 20-25 GB/s of DRAM's ~45 (2 Zen 5 threads, SmolLM2's 120 projections at one row,
 * 66 MB); 4 KiB ahead (into the next tile of the same thread's range) read it at 40-48 GB/s. */
#define PREFETCH_BYTES 4096

#if defined(__AVX512BF16__) && defined(__AVX512VBMI__)
#define HAVE_INT4_ROWS_BF16 1
#else
#define HAVE_INT4_ROWS_BF16 0
#endif

int tgictl_int4_rows_bf16_available(void) { return HAVE_INT4_ROWS_BF16; }

#if HAVE_INT4_ROWS_BF16

/* Byte indices into a 64-byte load of columns c (bytes 0..31) and c + 1 (32..63) for the 16-bit words of the
 * rows 16 s + i (low nibbles) and 32 + 16 s + i (high nibbles), i = 0..15: lane i holds column c's byte of
 * the row in its low word and column c + 1's in its high word; odd bytes are zeroed by the mask. */
static __m512i pair_indices(int s) {
    uint8_t index[64];
    for (int i = 0; i < 16; i++) {
        index[4 * i] = (uint8_t)(16 * s + i);
        index[4 * i + 1] = 0;
        index[4 * i + 2] = (uint8_t)(32 + 16 * s + i);
        index[4 * i + 3] = 0;
    }
    return _mm512_loadu_si512(index);
}

static __m512i nibble_table(void) {
    uint16_t table[32] = {0};
    for (int j = 0; j < 16; j++) table[j] = float_to_bf16((float)j);
    return _mm512_loadu_si512(table);
}

static inline __attribute__((always_inline)) void int4_tile_bf16(
    const uint16_t *x, const float *xsum, const uint8_t *tile, const uint16_t *sz, int sz_form, int64_t group,
    int64_t groups, int64_t n_pad, int64_t row0, const int M, int64_t k, __m512i index0, __m512i index1, __m512i table,
    float out[MAX_ROWS][TILE]) {
    const __mmask64 even_bytes = 0x5555555555555555ull;
    const __m512i low4 = _mm512_set1_epi16(15);
    __m512 total[MAX_ROWS][4];
    for (int r = 0; r < M; r++)
        for (int v = 0; v < 4; v++) total[r][v] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512 acc[MAX_ROWS][4];
        for (int r = 0; r < M; r++)
            for (int v = 0; v < 4; v++) acc[r][v] = _mm512_setzero_ps();
        const int64_t end = (g + 1) * group < k ? (g + 1) * group : k; /* padded columns are never read */
        for (int64_t c = g * group; c < end; c += 2) {
            _mm_prefetch((const char *)(tile + c * HALF_TILE + PREFETCH_BYTES), _MM_HINT_T0);
            const __m512i bytes = _mm512_loadu_si512(tile + c * HALF_TILE); /* columns c and c + 1 */
            const __m512i t0 = _mm512_maskz_permutexvar_epi8(even_bytes, index0, bytes);
            const __m512i t1 = _mm512_maskz_permutexvar_epi8(even_bytes, index1, bytes);
            const __m512bh w[4] = {
                (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(t0, low4), table),  /* rows 0..15 */
                (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(t1, low4), table),  /* rows 16..31 */
                (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(t0, 4), table),    /* rows 32..47 */
                (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(t1, 4), table)};   /* rows 48..63 */
            for (int r = 0; r < M; r++) {
                uint32_t pair;
                if (c + 1 < end) {
                    memcpy(&pair, x + r * k + c, sizeof pair);
                } else { /* an odd last column: its partner's weight is padding, multiplied by 0 */
                    pair = x[r * k + c];
                }
                const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)pair);
                for (int v = 0; v < 4; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], w[v], xv);
            }
        }
        /* the scales two groups on: one strided line per group and vector (pairs) or per two vectors (scales
         * alone), which no prefetcher follows */
        if (g + 2 < groups)
            for (int v = 0; v < 4; v++)
                _mm_prefetch((const char *)(sz + sz_index(sz_form, g + 2, n_pad, row0 + 16 * v)), _MM_HINT_T0);
        for (int v = 0; v < 4; v++) {
            __m512 scale, offset;
            scales_offsets(sz, sz_form, g, n_pad, row0, v, &scale, &offset);
            for (int r = 0; r < M; r++) {
                total[r][v] = _mm512_fmadd_ps(scale, acc[r][v], total[r][v]);
                total[r][v] = _mm512_fmadd_ps(offset, _mm512_set1_ps(xsum[r * groups + g]), total[r][v]);
            }
        }
    }
    for (int r = 0; r < M; r++)
        for (int v = 0; v < 4; v++) _mm512_storeu_ps(&out[r][16 * v], total[r][v]);
}

int tgictl_qlinear_int4_rows_bf16(const uint16_t *x, const uint8_t *packed, const uint16_t *scales_zeros,
                                  int sz_form, int64_t group, const float *bias, float *y, int64_t m, int64_t n,
                                  int64_t k, int64_t k_pad, int threads) {
    if (m < 1 || m > MAX_ROWS || group % 2 != 0 || !(sz_form & SZ_BF16)) return -1;
    const int64_t tiles = (n + TILE - 1) / TILE, n_pad = tiles * TILE, groups = k_pad / group;
    float *xsum = int4_group_sums(x, 1, m, k, group, groups);
    if (xsum == NULL) return -1;
    const __m512i index0 = pair_indices(0), index1 = pair_indices(1), table = nibble_table();
    /* Tiles handed out in runs of consecutive tiles (guided: shrinking runs), so a thread streams contiguous
     * memory that its prefetches run ahead into (one tile at a time, threads alternating, left the prefetch
     * into a tile the other thread reads: 31 GB/s against 43), and on 2 shared cores a thread that loses its
     * core to the router for a while still leaves the later, shorter runs to the other. */
#pragma omp parallel for num_threads(threads) schedule(guided)
    for (int64_t t = 0; t < tiles; t++) {
        const uint8_t *tile = packed + t * k_pad * HALF_TILE;
        const int64_t row0 = t * TILE, valid = n - row0 < TILE ? n - row0 : TILE;
        const uint16_t *sz = scales_zeros;
        float out[MAX_ROWS][TILE];
        switch (m) { /* constant row counts: the sums stay in registers */
        case 1: int4_tile_bf16(x, xsum, tile, sz, sz_form, group, groups, n_pad, row0, 1, k, index0, index1, table, out); break;
        case 2: int4_tile_bf16(x, xsum, tile, sz, sz_form, group, groups, n_pad, row0, 2, k, index0, index1, table, out); break;
        case 3: int4_tile_bf16(x, xsum, tile, sz, sz_form, group, groups, n_pad, row0, 3, k, index0, index1, table, out); break;
        default: int4_tile_bf16(x, xsum, tile, sz, sz_form, group, groups, n_pad, row0, 4, k, index0, index1, table, out); break;
        }
        for (int64_t r = 0; r < m; r++)
            for (int64_t j = 0; j < valid; j++) y[r * n + row0 + j] = out[r][j] + (bias != NULL ? bias[row0 + j] : 0.0f);
    }
    free(xsum);
    return 0;
}

#else

int tgictl_qlinear_int4_rows_bf16(const uint16_t *x, const uint8_t *packed, const uint16_t *scales_zeros,
                                  int sz_form, int64_t group, const float *bias, float *y, int64_t m, int64_t n,
                                  int64_t k, int64_t k_pad, int threads) {
    (void)x, (void)packed, (void)scales_zeros, (void)sz_form, (void)group, (void)bias, (void)y, (void)m, (void)n;
    (void)k, (void)k_pad, (void)threads;
    return -1;
}

#endif
