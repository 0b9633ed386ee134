/* y = x W^T + b for int4 tiles (tgictl/kernels/linear_methods/int4.py) and many bf16 input rows: prefill,
 * and decode of more sequences than the matrix-vector kernels serve, on the CPU.
 *
 * quant_linear.c multiplies on the stored integers in float32: right for a few rows, where the weight
 * bytes are the cost, but at 16 rows and more it is compute bound (on SmolLM2, 2 Sapphire Rapids cores,
 * a GGUF decode step at 16 rows took 88 ms against bf16's 74, prefill ran at 40% of bf16's speed). Here
 * each tile of 64 output rows is dequantized once per call into bf16, in the pair-interleaved ("VNNI")
 * layout the bf16 dot-product instructions read, into a per-thread buffer that stays in L2
 * (K x 128 bytes), and every input row is multiplied against it:
 *   - with AMX (Sapphire Rapids and later, once Linux has granted the process the tile state): 16 x 16
 *     output blocks by TDPBF16PS, 32 input rows by 32 output rows per pass over K;
 *   - with AVX512-BF16 only (AMD Zen 4): VDPBF16PS, 8 input rows by 32 output rows per pass;
 *   - with neither: the call returns -1 and the caller takes another backend.
 * Numerics: the weight is (q - 8) scale + zero in float32, rounded once to bf16 (as a bf16 model holding
 * the dequantized weights has it); products and sums are float32 (the instructions' order); the output is
 * rounded once to bf16 after the bias.
 *
 * Layouts: x [m, k_pad] bf16 (the caller pads the columns to the tiles' K_pad with zeros), packed
 * [ceil(n / 64), k_pad, 32] uint8 and scales_zeros bf16 ([k_pad / group, n_pad, 2], or [k_pad / group, n_pad]
 * without zeros as `sz_form` says: int4_scales.h) as int4.py describes,
 * bias [n] float32 or NULL, y [m, n] bf16. Parallel over tiles with OpenMP, `threads` wide.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "bf16.h"
#include "int4_scales.h"

#define TILE 64
#define HALF_TILE 32
#define KBLOCK 32          /* columns per block: one 64-byte row of bf16 */
#define BLOCK_ELEMS 512    /* one block of 16 output rows x 32 columns, in bf16 */
/* Input rows per pass on the AVX512-BF16 path: 2 ROW_BLOCK accumulators, enough independent VDPBF16PS chains
 * to cover the instruction's latency (4 rows: 8 chains; SmolLM2's GGUF on 2 Zen 5 cores, a 110-token prefill
 * 52.6-56.8 -> 40.3-40.9 ms with 8, the same with 10, 41.4 with 12; a batch-32 decode step 32.0-32.6 -> 28.8 ms).
 * Each row's sums run in the same order whatever the block, so results do not change with it. */
#define ROW_BLOCK 8

#if defined(__AVX512BF16__)
#define HAVE_BF16_DOT 1
#endif
#if defined(HAVE_AMX)
/* tmm0..3 accumulate [input rows 0-15 | 16-31] x [output rows 0-15 | 16-31] of a pass, tmm4/5 hold the two
 * blocks of 16 input rows, tmm6/7 the two blocks of 16 output rows (32 columns each). */
static void configure_tiles(int rows0, int rows1) {
    const int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, KBLOCK / 2, KBLOCK / 2};
    amx_configure(rows);
}
#endif

int tgictl_int4_bf16_path(void) {
#if defined(HAVE_AMX)
    if (amx_ready()) return 2;
#endif
#if defined(HAVE_BF16_DOT)
    return 1;
#else
    return 0;
#endif
}

#if defined(HAVE_BF16_DOT)
/* Block (half, kb, s) of a tile's buffer: output rows 32 half + 16 s .. + 16, columns 32 kb .. + 32; its row r
 * holds columns 32 kb + 2r and + 1 of each of the 16 output rows, interleaved. */
static inline uint16_t *block_at(uint16_t *buffer, int64_t k_pad, int half, int64_t kb, int s) {
    return buffer + half * k_pad * HALF_TILE + (kb * 2 + s) * BLOCK_ELEMS;
}

static void dequantize_tile(const uint8_t *tile, const uint16_t *sz, int sz_form, int64_t group, int64_t k_pad,
                            int64_t n_pad,
                            int64_t row0, uint16_t *buffer) {
    uint16_t order[32]; /* element 2i <- i (column c), 2i + 1 <- 16 + i (column c + 1) */
    for (int i = 0; i < 16; i++) {
        order[2 * i] = (uint16_t)i;
        order[2 * i + 1] = (uint16_t)(16 + i);
    }
    const __m512i interleave = _mm512_loadu_si512(order);
    const __m512i low4 = _mm512_set1_epi32(15);
    for (int64_t g = 0; g < k_pad / group; g++) {
        __m512 scale[4], offset[4]; /* output rows 16 v .. + 16 of the tile */
        for (int v = 0; v < 4; v++) scales_offsets(sz, sz_form, g, n_pad, row0, v, &scale[v], &offset[v]);
        for (int64_t c = g * group; c < (g + 1) * group; c += 2) {
            for (int s = 0; s < 2; s++) { /* bytes 16 s .. + 16: rows 16 s + j (low nibble), 32 + 16 s + j (high) */
                __m512 w[2][2];          /* [half][column c + e] */
                for (int e = 0; e < 2; e++) {
                    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(tile + (c + e) * HALF_TILE + 16 * s)));
                    w[0][e] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(b, low4)), scale[s], offset[s]);
                    w[1][e] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)), scale[2 + s], offset[2 + s]);
                }
                for (int half = 0; half < 2; half++) {
                    const __m512i pair = (__m512i)_mm512_cvtne2ps_pbh(w[half][1], w[half][0]); /* low 16: column c */
                    _mm512_storeu_si512(block_at(buffer, k_pad, half, c / KBLOCK, s) + (c % KBLOCK) / 2 * 32,
                                        _mm512_permutexvar_epi16(interleave, pair));
                }
            }
        }
    }
}

/* rows x up to 32 output rows of float sums (row stride 32) -> y, bias added, rounded to bf16. */
static void write_rows(const float *sums, int rows, const float *bias, uint16_t *y, int64_t n, int64_t i0,
                       int64_t col0, int64_t valid) {
    for (int i = 0; i < rows; i++)
        for (int64_t j = 0; j < valid; j++)
            y[(i0 + i) * n + col0 + j] = float_to_bf16(sums[i * 32 + j] + (bias != NULL ? bias[col0 + j] : 0.0f));
}

static inline __attribute__((always_inline)) void dot_rows(const uint16_t *x, uint16_t *buffer, int64_t k_pad,
                                                           int half, int rows, float sums[ROW_BLOCK * 32]) {
    __m512 acc[ROW_BLOCK][2];
    for (int i = 0; i < rows; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < k_pad / KBLOCK; kb++) {
        const uint16_t *b0 = block_at(buffer, k_pad, half, kb, 0), *b1 = block_at(buffer, k_pad, half, kb, 1);
        for (int r = 0; r < KBLOCK / 2; r++) {
            const __m512bh w0 = (__m512bh)_mm512_loadu_si512(b0 + r * 32);
            const __m512bh w1 = (__m512bh)_mm512_loadu_si512(b1 + r * 32);
            for (int i = 0; i < rows; i++) {
                int32_t pair;
                memcpy(&pair, x + i * k_pad + kb * KBLOCK + 2 * r, sizeof pair);
                const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
                acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xv, w0);
                acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xv, w1);
            }
        }
    }
    for (int i = 0; i < rows; i++) {
        _mm512_storeu_ps(sums + i * 32, acc[i][0]);
        _mm512_storeu_ps(sums + i * 32 + 16, acc[i][1]);
    }
}

/* The AVX512-BF16 path: one tile's two halves against every input row, ROW_BLOCK rows at a time. */
static void tile_by_dot(const uint16_t *x, uint16_t *buffer, int64_t m, int64_t k_pad, const float *bias, uint16_t *y,
                        int64_t n, int64_t row0) {
    float sums[ROW_BLOCK * 32];
    for (int half = 0; half < 2; half++) {
        const int64_t col0 = row0 + half * HALF_TILE, valid = n - col0 < HALF_TILE ? n - col0 : HALF_TILE;
        if (valid <= 0) break;
        for (int64_t i0 = 0; i0 < m; i0 += ROW_BLOCK) {
            const int rows = m - i0 < ROW_BLOCK ? (int)(m - i0) : ROW_BLOCK;
            switch (rows) { /* constant row counts: the sums stay in registers */
            case 1: dot_rows(x + i0 * k_pad, buffer, k_pad, half, 1, sums); break;
            case 2: dot_rows(x + i0 * k_pad, buffer, k_pad, half, 2, sums); break;
            case 3: dot_rows(x + i0 * k_pad, buffer, k_pad, half, 3, sums); break;
            case 4: dot_rows(x + i0 * k_pad, buffer, k_pad, half, 4, sums); break;
            case 5: dot_rows(x + i0 * k_pad, buffer, k_pad, half, 5, sums); break;
            case 6: dot_rows(x + i0 * k_pad, buffer, k_pad, half, 6, sums); break;
            case 7: dot_rows(x + i0 * k_pad, buffer, k_pad, half, 7, sums); break;
            default: dot_rows(x + i0 * k_pad, buffer, k_pad, half, ROW_BLOCK, sums); break;
            }
            write_rows(sums, rows, bias, y, n, i0, col0, valid);
        }
    }
}

#if defined(HAVE_AMX)
/* The AMX path: one tile's two halves against every input row, 32 rows per pass; `configured` holds the
 * thread's current (rows0, rows1) so the configuration is loaded only when the pass shape changes. */
static void tile_by_amx(const uint16_t *x, uint16_t *buffer, int64_t m, int64_t k_pad, const float *bias, uint16_t *y,
                        int64_t n, int64_t row0, int configured[2]) {
    float sums[32 * 32];
    const int64_t stride = k_pad * 2; /* bytes between input rows */
    for (int half = 0; half < 2; half++) {
        const int64_t col0 = row0 + half * HALF_TILE, valid = n - col0 < HALF_TILE ? n - col0 : HALF_TILE;
        if (valid <= 0) break;
        for (int64_t i0 = 0; i0 < m; i0 += 32) {
            const int rows0 = m - i0 < 16 ? (int)(m - i0) : 16;
            const int rows1 = m - i0 - 16 <= 0 ? 0 : (m - i0 - 16 < 16 ? (int)(m - i0 - 16) : 16);
            if (configured[0] != rows0 || configured[1] != rows1) {
                configure_tiles(rows0, rows1);
                configured[0] = rows0;
                configured[1] = rows1;
            }
            const uint16_t *a0 = x + i0 * k_pad, *a1 = a0 + 16 * k_pad;
            _tile_zero(0);
            _tile_zero(1);
            if (rows1 > 0) {
                _tile_zero(2);
                _tile_zero(3);
                for (int64_t kb = 0; kb < k_pad / KBLOCK; kb++) {
                    _tile_loadd(4, a0 + kb * KBLOCK, stride);
                    _tile_loadd(5, a1 + kb * KBLOCK, stride);
                    _tile_loadd(6, block_at(buffer, k_pad, half, kb, 0), 64);
                    _tile_loadd(7, block_at(buffer, k_pad, half, kb, 1), 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
                _tile_stored(2, sums + 16 * 32, 128);
                _tile_stored(3, sums + 16 * 32 + 16, 128);
            } else {
                for (int64_t kb = 0; kb < k_pad / KBLOCK; kb++) {
                    _tile_loadd(4, a0 + kb * KBLOCK, stride);
                    _tile_loadd(6, block_at(buffer, k_pad, half, kb, 0), 64);
                    _tile_loadd(7, block_at(buffer, k_pad, half, kb, 1), 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                }
            }
            _tile_stored(0, sums, 128);
            _tile_stored(1, sums + 16, 128);
            write_rows(sums, rows0 + rows1, bias, y, n, i0, col0, valid);
        }
    }
}
#endif
#endif

/* Returns 0, or -1 when this build has no bf16 dot product, k_pad is not a multiple of 32, the scales are not
 * bf16 or scratch
 * memory is refused (the caller takes another backend). */
int tgictl_qlinear_int4_bf16(const uint16_t *x, const uint8_t *packed, const uint16_t *scales_zeros, int sz_form,
                             int64_t group, const float *bias, uint16_t *y, int64_t m, int64_t n, int64_t k_pad,
                             int threads) {
#if defined(HAVE_BF16_DOT)
    if (k_pad % KBLOCK != 0 || group % 2 != 0 || !(sz_form & SZ_BF16)) return -1;
    const int64_t tiles = (n + TILE - 1) / TILE, n_pad = tiles * TILE;
    const int amx = tgictl_int4_bf16_path() == 2;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        uint16_t *buffer = aligned_alloc(64, (size_t)k_pad * TILE * sizeof(uint16_t));
        int configured[2] = {-1, -1};
        if (buffer == NULL) __atomic_store_n(&failed, 1, __ATOMIC_RELAXED);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            if (buffer == NULL) continue;
            dequantize_tile(packed + t * k_pad * HALF_TILE, scales_zeros, sz_form, group, k_pad, n_pad, t * TILE,
                            buffer);
#if defined(HAVE_AMX)
            if (amx) {
                tile_by_amx(x, buffer, m, k_pad, bias, y, n, t * TILE, configured);
                continue;
            }
#endif
            tile_by_dot(x, buffer, m, k_pad, bias, y, n, t * TILE);
        }
#if defined(HAVE_AMX)
        if (configured[0] >= 0) _tile_release();
#endif
        (void)configured;
        (void)amx;
        free(buffer);
    }
    return failed ? -1 : 0;
#else
    (void)x, (void)packed, (void)scales_zeros, (void)sz_form, (void)group, (void)bias, (void)y, (void)m, (void)n;
    (void)k_pad, (void)threads;
    return -1;
#endif
}
