/* y = x W^T + b for bf16 weights and decode-sized row counts (5-64 rows) with AMX, on the CPU.
 *
 * TDPBF16PS wants its second operand pair-interleaved along K ([K/2][N][2]); torch's weight is [n, k]
 * row-major, which is already the layout of the first operand. So the product is computed transposed,
 * y^T = W x^T: 16-row blocks of W load straight from the weight as it is stored (no packed copy, no
 * re-layout per call), and x, a few rows, is interleaved once per call into a small buffer. oneDNN
 * needs its own blocked copy of the weight for the same speed (kernels/prepacked.py), which costs the
 * weights' bytes a second time.
 *
 * Each pass: 32 weight rows (tmm4/5) x 32 input rows (tmm6/7) into four 16 x 16 float32 blocks (tmm0..3),
 * over all of K. Parallel over strips of 32 weight rows with OpenMP, `threads` wide. Quantized formats
 * (gguf_linear.c, quant_linear.c) pass a decoder that writes each strip's rows in bf16 into a per-thread
 * buffer first (tgictl_amx_decoded_linear): the weights stay quantized in memory.
 * Layouts: x [m, k] bf16, weight [n, k] bf16, bias [n] float32 or NULL, y [m, n] bf16; k a multiple of 32.
 * Returns 0, or -1 where this build or process has no AMX, k is not a multiple of 32, or scratch memory
 * is refused (the caller takes oneDNN).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"
#include "bf16.h"

#define KBLOCK 32       /* columns per step: one 64-byte tile row of bf16 */
#define BLOCK 16        /* rows of a tile */
#define PASS 32         /* weight rows and input rows per pass */
#define PREFETCH_BLOCKS 4

int tgictl_amx_linear_available(void) {
#if defined(HAVE_AMX)
    return amx_ready();
#else
    return 0;
#endif
}

#if defined(HAVE_AMX)
static size_t blocks_bytes(int64_t m, int64_t k) {
    return (size_t)(((m + BLOCK - 1) / BLOCK) * (k / KBLOCK)) * BLOCK * BLOCK * sizeof(uint32_t);
}

/* x [m, k] -> blocks [ceil(m / 16)][k / 32][16 column pairs][16 rows][2]: the pairs of one row adjacent, as
 * TDPBF16PS reads its second operand; rows past m are zero. */
static void interleave_rows(const uint16_t *x, int64_t m, int64_t k, uint32_t *blocks) {
    const int64_t k_blocks = k / KBLOCK;
    memset(blocks, 0, blocks_bytes(m, k));
    for (int64_t i = 0; i < m; i++) {
        const uint32_t *row = (const uint32_t *)(x + i * k); /* k / 2 pairs */
        for (int64_t kb = 0; kb < k_blocks; kb++) {
            uint32_t *block = blocks + ((i / BLOCK) * k_blocks + kb) * BLOCK * BLOCK + i % BLOCK;
            for (int p = 0; p < BLOCK; p++) block[p * BLOCK] = row[kb * BLOCK + p];
        }
    }
}

/* sums [32 weight rows][32 input rows] -> y[i, n0 + j], bias added, rounded to bf16: 16 weight rows of one
 * input row at a time, gathered down a column of sums. */
static void write_block(const float *sums, int w_rows, int x_rows, const float *bias, uint16_t *y, int64_t n,
                        int64_t n0, int64_t i0) {
    const __m512i down = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(PASS));
    for (int j0 = 0; j0 < w_rows; j0 += BLOCK) {
        const int count = w_rows - j0 < BLOCK ? w_rows - j0 : BLOCK;
        const __mmask16 mask = (__mmask16)((1u << count) - 1u);
        const __m512 b = bias != NULL ? _mm512_maskz_loadu_ps(mask, bias + n0 + j0) : _mm512_setzero_ps();
        for (int i = 0; i < x_rows; i++) {
            const __m512 column = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, down, sums + j0 * PASS + i, 4);
            const __m256i out = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(column, b));
            _mm256_mask_storeu_epi16(y + (i0 + i) * n + n0 + j0, mask, out);
        }
    }
}

/* y[:, n0 .. n0 + w_rows) = x W_strip^T + bias for a strip of w_rows <= 32 weight rows in bf16 (row stride k:
 * the weight itself, or rows a quantized format decoded into a buffer) against interleave_rows'
 * blocks of x. `configured` holds the calling thread's tile shapes, {-1, -1} before its first strip; the
 * thread releases the tiles (_tile_release) when done. */
static void strip_product(const uint16_t *strip, int w_rows, const uint32_t *blocks, int64_t m, int64_t k,
                          const float *bias, uint16_t *y, int64_t n, int64_t n0, int configured[2]) {
    const int64_t k_blocks = k / KBLOCK, stride = k * 2;
    const int rows0 = w_rows < BLOCK ? w_rows : BLOCK, rows1 = w_rows - rows0;
    if (configured[0] != rows0 || configured[1] != rows1) {
        const int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, BLOCK, BLOCK};
        amx_configure(rows);
        configured[0] = rows0;
        configured[1] = rows1;
    }
    const uint16_t *a0 = strip, *a1 = a0 + BLOCK * k;
    float sums[PASS * PASS];
    for (int64_t i0 = 0; i0 < m; i0 += PASS) {
        const int x_rows = m - i0 < PASS ? (int)(m - i0) : PASS;
        const uint32_t *b0 = blocks + (i0 / BLOCK) * k_blocks * BLOCK * BLOCK;
        const uint32_t *b1 = b0 + k_blocks * BLOCK * BLOCK; /* read only when x_rows > 16 */
        _tile_zero(0);
        _tile_zero(1);
        if (rows1 > 0) {
            _tile_zero(2);
            _tile_zero(3);
        }
        for (int64_t kb = 0; kb < k_blocks; kb++) {
            if (i0 == 0 && kb + PREFETCH_BLOCKS < k_blocks) /* the first pass streams the strip: 41 -> 23 ms at 32 rows */
                for (int r = 0; r < w_rows; r++)
                    _mm_prefetch((const char *)(a0 + r * k + (kb + PREFETCH_BLOCKS) * KBLOCK), _MM_HINT_T0);
            _tile_loadd(4, a0 + kb * KBLOCK, stride);
            _tile_loadd(6, b0 + kb * BLOCK * BLOCK, 64);
            _tile_dpbf16ps(0, 4, 6);
            if (x_rows > BLOCK) {
                _tile_loadd(7, b1 + kb * BLOCK * BLOCK, 64);
                _tile_dpbf16ps(1, 4, 7);
            }
            if (rows1 > 0) {
                _tile_loadd(5, a1 + kb * KBLOCK, stride);
                _tile_dpbf16ps(2, 5, 6);
                if (x_rows > BLOCK) _tile_dpbf16ps(3, 5, 7);
            }
        }
        _tile_stored(0, sums, PASS * 4);
        if (x_rows > BLOCK) _tile_stored(1, sums + BLOCK, PASS * 4);
        if (rows1 > 0) {
            _tile_stored(2, sums + BLOCK * PASS, PASS * 4);
            if (x_rows > BLOCK) _tile_stored(3, sums + BLOCK * PASS + BLOCK, PASS * 4);
        }
        write_block(sums, w_rows, x_rows, bias, y, n, n0, i0);
    }
}
#endif

/* The product over all strips of 32 weight rows: each strip read in place from `weight` (bf16 [n, k]) when
 * `decode` is NULL, else decoded by it into the thread's buffer first (the quantized formats). Returns 0 or
 * -1 (no AMX, k not a multiple of 32, scratch refused). */
int tgictl_amx_decoded_linear(const uint16_t *x, const uint16_t *weight, tgictl_strip_decoder decode,
                              const void *source, const float *bias, uint16_t *y, int64_t m, int64_t n, int64_t k,
                              int threads) {
#if defined(HAVE_AMX)
    if (!amx_ready() || k % KBLOCK != 0 || m <= 0) return -1;
    uint32_t *blocks = aligned_alloc(64, blocks_bytes(m, k));
    if (blocks == NULL) return -1;
    interleave_rows(x, m, k, blocks);
    const int64_t passes = (n + PASS - 1) / PASS;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        uint16_t *strip = NULL;
        float *scratch = NULL;
        if (decode != NULL) {
            strip = aligned_alloc(64, (size_t)PASS * (size_t)k * sizeof(uint16_t));
            scratch = aligned_alloc(64, (size_t)k * sizeof(float));
            if (strip == NULL || scratch == NULL) failed = 1;
        }
        int configured[2] = {-1, -1};
#pragma omp for schedule(static)
        for (int64_t p = 0; p < passes; p++) {
            const int64_t n0 = p * PASS;
            const int rows = n - n0 < PASS ? (int)(n - n0) : PASS;
            if (decode == NULL) {
                strip_product(weight + n0 * k, rows, blocks, m, k, bias, y, n, n0, configured);
            } else if (strip != NULL && scratch != NULL) {
                decode(source, n0, rows, k, strip, scratch);
                strip_product(strip, rows, blocks, m, k, bias, y, n, n0, configured);
            }
        }
        if (configured[0] >= 0) _tile_release();
        free(strip);
        free(scratch);
    }
    free(blocks);
    return failed ? -1 : 0;
#else
    (void)x, (void)weight, (void)decode, (void)source, (void)bias, (void)y, (void)m, (void)n, (void)k, (void)threads;
    return -1;
#endif
}

int tgictl_amx_linear_bf16(const uint16_t *x, const uint16_t *weight, const float *bias, uint16_t *y, int64_t m,
                           int64_t n, int64_t k, int threads) {
    return tgictl_amx_decoded_linear(x, weight, NULL, NULL, bias, y, m, n, k, threads);
}
