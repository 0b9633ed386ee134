/* y = x W^T + b for int4 tiles (tgictl/kernels/linear_methods/int4.py), on the CPU, for bf16 or float32 scales
 * and any number of input rows (int8 rows: int8_linear.c).
 *
 * Decode at small batch reads every weight once per step: 4-bit weights move a quarter of bf16's bytes. The
 * kernel computes on the stored integers and applies the scales per group, so the weights are never
 * expanded in memory:
 *   y[i, n] = sum_g scale[g, n] * sum_{k in g} q[n, k] x[i, k] + (zero[g, n] - 8 scale[g, n]) * sum_{k in g} x[i, k]
 * which is the float matmul on the dequantized weights up to the order of float additions.
 *
 * Layouts (contiguous, row-major): x [m, k] float32 (the caller converts the few input rows once); int4
 * tiles packed [ceil(n / 64), k_pad, 32] uint8 (byte j of tile t, column c: row 64t + j in the low nibble,
 * row 64t + 32 + j in the high one) with scales_zeros [k_pad / group, n_pad, 2], or the scales alone
 * [k_pad / group, n_pad] for a symmetric format (zero 0). Scales are bf16 (uint16) or float32; `sz_form`
 * (int4_scales.h's SZ_BF16 | SZ_ZERO flags) says which and whether zeros are stored; bias [n] float32 or NULL;
 * y [m, n] float32. Parallel over output rows
 * (tiles) with OpenMP, `threads` wide.
 *
 * The loops are written for the compiler's vectoriser (built with -march=native: AVX-512 where the CPU
 * has it, AVX2 elsewhere, scalar code on neither); tests build the AVX2 and scalar variants too.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "bf16.h"
#include "int4_scales.h"
#include "vec16.h"

#define TILE 64
#define HALF_TILE 32
#define ROW_TILE 4 /* input rows sharing one pass over a weight tile */

/* One tile of 64 output rows against up to ROW_TILE input rows. */
static inline void int4_tile(const float *x, const float *xsum, const uint8_t *tile, const void *sz, int sz_form,
                      int64_t group, int64_t groups, int64_t n_pad, int64_t row0, int64_t rows, int64_t k,
                      float out[ROW_TILE][TILE]) {
    for (int64_t r = 0; r < rows; r++)
        for (int j = 0; j < TILE; j++) out[r][j] = 0.0f;
    for (int64_t g = 0; g < groups; g++) {
        float acc[ROW_TILE][TILE];
        for (int64_t r = 0; r < rows; r++)
            for (int j = 0; j < TILE; j++) acc[r][j] = 0.0f;
        const int64_t end = (g + 1) * group < k ? (g + 1) * group : k; /* padded columns are never read */
        for (int64_t c = g * group; c < end; c++) {
            const uint8_t *bytes = tile + c * HALF_TILE;
            float w[TILE];
            for (int j = 0; j < HALF_TILE; j++) {
                w[j] = (float)(bytes[j] & 15);
                w[j + HALF_TILE] = (float)(bytes[j] >> 4);
            }
            for (int64_t r = 0; r < rows; r++) {
                const float xv = x[r * k + c];
                for (int j = 0; j < TILE; j++) acc[r][j] += w[j] * xv;
            }
        }
        float scale[TILE], offset[TILE];
        for (int j = 0; j < TILE; j++) scale_offset_at(sz, sz_form, g, n_pad, row0 + j, &scale[j], &offset[j]);
        for (int64_t r = 0; r < rows; r++) {
            const float xs = xsum[r * groups + g];
            for (int j = 0; j < TILE; j++) out[r][j] += scale[j] * acc[r][j] + offset[j] * xs;
        }
    }
}

#if defined(__AVX512F__)
/* int4_tile for AVX-512 with explicit vectors: a column's 32 bytes (64 rows' nibbles) widen to four float32
 * vectors in registers, and each input row's sums for the 64 rows stay in four registers over the group
 * (int4_tile goes through a float row in memory, which the compiler keeps scalar-ish: at one input row it
 * ran at 5-8 GB/s, below torch's kernel). Same sums per group in the same order of columns. */
static inline v16f as_v16f(__m512 x) {
    v16f v;
    memcpy(&v, &x, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void int4_tile_vec(
    const float *x, const float *xsum, const uint8_t *tile, const void *sz, int sz_form, int64_t group,
    int64_t groups, int64_t n_pad, int64_t row0, int M, int64_t k, float out[ROW_TILE][TILE]) {
    v16f total[ROW_TILE][4];
    for (int r = 0; r < M; r++)
        for (int v = 0; v < 4; v++) total[r][v] = (v16f){0};
    const __m512i low4 = _mm512_set1_epi32(15);
    for (int64_t g = 0; g < groups; g++) {
        v16f acc[ROW_TILE][4];
        for (int r = 0; r < M; r++)
            for (int v = 0; v < 4; v++) acc[r][v] = (v16f){0};
        const int64_t end = (g + 1) * group < k ? (g + 1) * group : k; /* padded columns are never read */
        for (int64_t c = g * group; c < end; c++) {
            const uint8_t *bytes = tile + c * HALF_TILE;
            const __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)bytes));
            const __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(bytes + 16)));
            const v16f w[4] = {as_v16f(_mm512_cvtepi32_ps(_mm512_and_si512(b0, low4))),  /* rows 0..15 */
                               as_v16f(_mm512_cvtepi32_ps(_mm512_and_si512(b1, low4))),  /* rows 16..31 */
                               as_v16f(_mm512_cvtepi32_ps(_mm512_srli_epi32(b0, 4))),    /* rows 32..47 */
                               as_v16f(_mm512_cvtepi32_ps(_mm512_srli_epi32(b1, 4)))};   /* rows 48..63 */
            for (int r = 0; r < M; r++) {
                const float xv = x[r * k + c];
                for (int v = 0; v < 4; v++) acc[r][v] += w[v] * xv;
            }
        }
        for (int v = 0; v < 4; v++) {
            __m512 scale, offset;
            scales_offsets(sz, sz_form, g, n_pad, row0, v, &scale, &offset);
            const v16f sv = as_v16f(scale), ov = as_v16f(offset);
            for (int r = 0; r < M; r++) total[r][v] += sv * acc[r][v] + ov * xsum[r * groups + g];
        }
    }
    for (int r = 0; r < M; r++)
        for (int v = 0; v < 4; v++) memcpy(&out[r][16 * v], &total[r][v], sizeof total[r][v]);
}

#define HAVE_INT4_TILE_VEC 1
#elif defined(__AVX2__) && defined(__FMA__)
/* int4_tile for AVX2 (AMD Zen 2/3 and older Intel): the generic loop went through a float row in memory and
 * ran compute-bound at ~7 G weights/s on 2 Zen 3 cores (a quarter of the bf16 matrix-vector kernel's speed).
 * Here 16 bytes of a column (32 rows' nibbles: low ones rows 16p.., high ones rows 32 + 16p..) widen to four
 * float32 vectors in registers, and two input rows' sums for those 32 rows stay in eight registers over the
 * group: each tile takes two passes (p) per pair of input rows. Same sums per group, columns in order. */
static inline void scales_offsets8(const void *sz, int sz_form, int64_t base, __m256 *scale, __m256 *offset) {
    __m256 zero = _mm256_setzero_ps();
    if (!(sz_form & SZ_ZERO)) { /* scales alone (zero 0): bf16 widened by a shift, or float32 as stored */
        *scale = (sz_form & SZ_BF16)
            ? _mm256_castsi256_ps(_mm256_slli_epi32(
                  _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)sz + base))), 16))
            : _mm256_loadu_ps((const float *)sz + base);
    } else if (sz_form & SZ_BF16) { /* a row's (scale, zero) bf16 pair is one 32-bit lane: widened by shift and mask */
        const __m256i u = _mm256_loadu_si256((const __m256i *)((const uint16_t *)sz + base));
        *scale = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
        zero = _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xFFFF0000u)));
    } else {
        const float *f = (const float *)sz + base;
        const __m256 a = _mm256_loadu_ps(f), b = _mm256_loadu_ps(f + 8);
        *scale = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
        zero = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
    }
    *offset = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), *scale, zero);
}

static inline __attribute__((always_inline)) void int4_tile_vec(
    const float *x, const float *xsum, const uint8_t *tile, const void *sz, int sz_form, int64_t group,
    int64_t groups, int64_t n_pad, int64_t row0, int M, int64_t k, float out[ROW_TILE][TILE]) {
    static const int first_row[4] = {0, 8, 32, 40}; /* of the four vectors, relative to 16p */
    for (int r = 0; r < M; r++)
        for (int j = 0; j < TILE; j++) out[r][j] = 0.0f;
    const __m256i low4 = _mm256_set1_epi32(15);
    for (int64_t g = 0; g < groups; g++) {
        const int64_t end = (g + 1) * group < k ? (g + 1) * group : k; /* padded columns are never read */
        for (int p = 0; p < 2; p++) {
            for (int r0 = 0; r0 < M; r0 += 2) {
                const int R = M - r0 < 2 ? 1 : 2;
                __m256 acc[2][4];
                for (int r = 0; r < 2; r++)
                    for (int v = 0; v < 4; v++) acc[r][v] = _mm256_setzero_ps();
                for (int64_t c = g * group; c < end; c++) {
                    const uint8_t *bytes = tile + c * HALF_TILE + 16 * p;
                    const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bytes));
                    const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(bytes + 8)));
                    const __m256 w[4] = {_mm256_cvtepi32_ps(_mm256_and_si256(b0, low4)),
                                         _mm256_cvtepi32_ps(_mm256_and_si256(b1, low4)),
                                         _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)),
                                         _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4))};
                    for (int r = 0; r < R; r++) {
                        const __m256 xv = _mm256_set1_ps(x[(r0 + r) * k + c]);
                        for (int v = 0; v < 4; v++) acc[r][v] = _mm256_fmadd_ps(w[v], xv, acc[r][v]);
                    }
                }
                for (int v = 0; v < 4; v++) {
                    const int row = 16 * p + first_row[v];
                    __m256 scale, offset;
                    scales_offsets8(sz, sz_form, sz_index(sz_form, g, n_pad, row0 + row), &scale, &offset);
                    for (int r = 0; r < R; r++) {
                        const __m256 xs = _mm256_set1_ps(xsum[(r0 + r) * groups + g]);
                        const __m256 part = _mm256_fmadd_ps(scale, acc[r][v], _mm256_mul_ps(offset, xs));
                        _mm256_storeu_ps(&out[r0 + r][row], _mm256_add_ps(_mm256_loadu_ps(&out[r0 + r][row]), part));
                    }
                }
            }
        }
    }
}

#define HAVE_INT4_TILE_VEC 1
#endif

#if defined(HAVE_INT4_TILE_VEC)
static void int4_tile_rows(const float *x, const float *xsum, const uint8_t *tile, const void *sz, int sz_form,
                           int64_t group, int64_t groups, int64_t n_pad, int64_t row0, int64_t rows, int64_t k,
                           float out[ROW_TILE][TILE]) {
    switch (rows) { /* constant row counts: the sums stay in registers */
    case 1: int4_tile_vec(x, xsum, tile, sz, sz_form, group, groups, n_pad, row0, 1, k, out); break;
    case 2: int4_tile_vec(x, xsum, tile, sz, sz_form, group, groups, n_pad, row0, 2, k, out); break;
    case 3: int4_tile_vec(x, xsum, tile, sz, sz_form, group, groups, n_pad, row0, 3, k, out); break;
    default: int4_tile_vec(x, xsum, tile, sz, sz_form, group, groups, n_pad, row0, 4, k, out); break;
    }
}
#else
#define int4_tile_rows int4_tile
#endif

/* Returns 0, or -1 when scratch memory is refused (the caller falls back to torch). */
int tgictl_qlinear_int4(const float *x, const uint8_t *packed, const void *scales_zeros, int sz_form, int64_t group,
                        const float *bias, float *y, int64_t m, int64_t n, int64_t k, int64_t k_pad, int threads) {
    const int64_t tiles = (n + TILE - 1) / TILE, n_pad = tiles * TILE, groups = k_pad / group;
    float *xsum = int4_group_sums(x, 0, m, k, group, groups);
    if (xsum == NULL) return -1;
#pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int64_t t = 0; t < tiles; t++) {
        const uint8_t *tile = packed + t * k_pad * HALF_TILE;
        const int64_t row0 = t * TILE, valid = n - row0 < TILE ? n - row0 : TILE;
        for (int64_t i0 = 0; i0 < m; i0 += ROW_TILE) {
            const int64_t rows = m - i0 < ROW_TILE ? m - i0 : ROW_TILE;
            float out[ROW_TILE][TILE];
            int4_tile_rows(x + i0 * k, xsum + i0 * groups, tile, scales_zeros, sz_form, group, groups, n_pad, row0,
                           rows, k, out);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < valid; j++)
                    y[(i0 + r) * n + row0 + j] = out[r][j] + (bias != NULL ? bias[row0 + j] : 0.0f);
        }
    }
    free(xsum);
    return 0;
}
