/* y = x W^T + b for W in GGUF Q6_K blocks (gguf_types.py has the layout) and 1-4 bf16 input rows: decode steps,
 * straight from the blocks, on CPUs with AVX512-BF16 (AMD Zen 4 and later, Intel Sapphire Rapids and later).
 *
 * Why: llama.cpp's quantizer writes a tied embedding / LM head as Q6_K (Llama-3.2-1B's Q4_0 GGUF: 128256 x 2048,
 * 215 MB, a quarter of the bytes a decode step reads). The generic path decoded every weight to a float32 row one
 * scalar at a time (gguf_linear.c) and took ~100 ms per token there, more than the 16 Q4_0 layers together.
 *
 * How: per 32 consecutive weights of a row (two sub-blocks of 16, one scale each) the 6-bit values q are built in
 * 16-bit lanes from the low-nibble bytes and the 2-bit high bytes, and ORed with 0x4300, which makes each lane the
 * bf16 of 128 + q exactly (exponent 2^7, q in the 7 mantissa bits). VDPBF16PS multiplies them with 32 columns of
 * the input row: lane l sums the pair of products of columns 2l, 2l + 1, so lanes 0-7 belong to the first
 * sub-block, 8-15 to the second, and one FMA applies the two sub-blocks' scales d * sc. Since w = d sc (q - 32),
 *     y = sum_j d sc_j (sum_{l in j} (128 + q_l) x_l - 160 X_j),   X_j = sum_{l in j} x_l (once per call),
 * the second term accumulated per block as a 16-lane vector. Per 32 weights: two or three shifts and logic ops,
 * one permute (the scales), then per input row one VDPBF16PS and one FMA.
 *
 * Numerics: the products (128 + q) x are exact in float32 (8-bit by 8-bit significands), the sums float32, the
 * scales d * sc as the reference computes them; the result differs from the float32 matmul on the reference
 * dequantization (gguf_types.py) by float32 rounding only (the 160 X_j subtraction cancels a few bits of it),
 * then it is rounded once to bf16 after the bias. Unlike the many-row path (decoded_linear.h) the weights are
 * not rounded to bf16 first.
 *
 * Layouts: x [m, k] bf16, w [n, row_bytes] uint8 (k / 256 blocks of 210 bytes per row), bias [n] float32 or
 * NULL, y [m, n] bf16. Returns 0, or -1 where the build lacks the instructions, m is outside 1..4, k is not a
 * multiple of 256 or scratch is refused (the caller takes another path).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "fp16.h"

#define QK_K 256
#define Q6_K_BYTES 210
#define SUBS 16              /* sub-blocks of 16 weights per block */
#define PASS_ROWS 4          /* input rows per pass over a weight row */
#define MAX_ROWS 4 /* from 5 rows the many-row strips (decoded once per call, gguf_linear.c) are as fast or faster */
#define PREFETCH_BYTES 4096  /* ahead of the weight stream, within the thread's contiguous range of rows */

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#include <omp.h>

int tgictl_q6_k_rows_bf16_available(void) { return 1; }

/* Permute indices that spread the 16 sub-block scales of a block over the lanes of group g (0..7, 32 weights):
 * lanes 0-7 the scale of sub-block 2g, lanes 8-15 that of 2g + 1. */
static inline __m512i scale_index(int g) {
    return _mm512_set_epi32(2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1,
                            2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g);
}

/* bf16(128 + q) per 16-bit lane: the low 4 bits from `low`, bits 4-5 from `high`, the rest of each cleared and
 * 0x4300 set (ternary-logic immediates: 0xE4 = c ? a : b, 0xEA = (a & b) | c). */
static inline __m512i q6_words(__m512i low, __m512i high, __m512i low4, __m512i six, __m512i bias) {
    const __m512i picked = _mm512_ternarylogic_epi32(low, high, low4, 0xE4);
    return _mm512_ternarylogic_epi32(picked, six, bias, 0xEA);
}

/* One weight row (k / 256 blocks at w) against M input rows; out[r] = the row's dot product with x row r. */
static inline __attribute__((always_inline)) void q6_k_row(const uint8_t *w, const uint16_t *x, const float *xsum,
                                                          int64_t k, const int M, const __m512i index[8],
                                                          float out[PASS_ROWS]) {
    const __m512i low4 = _mm512_set1_epi16(0x000F), six = _mm512_set1_epi16(0x003F), bias = _mm512_set1_epi16(0x4300);
    __m512 acc[PASS_ROWS][2], corr[PASS_ROWS];
    for (int r = 0; r < M; r++) acc[r][0] = acc[r][1] = corr[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / QK_K; b++) {
        const uint8_t *block = w + b * Q6_K_BYTES;
        for (int line = 0; line < Q6_K_BYTES; line += 64) _mm_prefetch((const char *)(block + PREFETCH_BYTES + line), _MM_HINT_T0);
        const __m512 scales = _mm512_mul_ps(
            _mm512_set1_ps(load_fp16(block + 208)),
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(block + 192)))));
        for (int r = 0; r < M; r++) corr[r] = _mm512_fmadd_ps(scales, _mm512_loadu_ps(xsum + r * (k / 16) + b * SUBS), corr[r]);
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = block + 64 * half, *qh = block + 128 + 32 * half;
            const __m512i a0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)ql));
            const __m512i a1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(ql + 32)));
            const __m512i h = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)qh));
            const __m512i q[4] = {
                q6_words(a0, _mm512_slli_epi16(h, 4), low4, six, bias),                       /* weights 0-31 */
                q6_words(a1, _mm512_slli_epi16(h, 2), low4, six, bias),                       /* 32-63 */
                q6_words(_mm512_srli_epi16(a0, 4), h, low4, six, bias),                       /* 64-95 */
                q6_words(_mm512_srli_epi16(a1, 4), _mm512_srli_epi16(h, 2), low4, six, bias)}; /* 96-127 */
            for (int g = 0; g < 4; g++) {
                const __m512 s = _mm512_permutexvar_ps(index[4 * half + g], scales);
                const int64_t col = b * QK_K + 128 * half + 32 * g;
                for (int r = 0; r < M; r++) {
                    const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * k + col);
                    const __m512 dot = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)q[g], xv);
                    acc[r][g & 1] = _mm512_fmadd_ps(dot, s, acc[r][g & 1]);
                }
            }
        }
    }
    for (int r = 0; r < M; r++)
        out[r] = _mm512_reduce_add_ps(_mm512_fmadd_ps(corr[r], _mm512_set1_ps(-160.0f), _mm512_add_ps(acc[r][0], acc[r][1])));
}

/* One row of k / 256 blocks -> k bf16 weights for the many-row products (gguf_linear.c's strips): the reference's
 * float32 values (d * sc, then times q - 32, each rounded as gguf_types.py rounds them; q - 32 is exact, from
 * bf16(128 + q) widened to float32 minus 160) rounded to nearest even, 32 at a time. A sub-block is one
 * 16-float vector, so its scale is a broadcast. */
#if !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off", "no-associative-math") /* each product rounded as the reference's */
#endif
void tgictl_q6_k_decode_row_bf16(const uint8_t *src, uint16_t *dst, int64_t k) {
    const __m512i low4 = _mm512_set1_epi16(0x000F), six = _mm512_set1_epi16(0x003F), bias = _mm512_set1_epi16(0x4300);
    const __m512 offset = _mm512_set1_ps(160.0f);
    for (int64_t b = 0; b < k / QK_K; b++, src += Q6_K_BYTES, dst += QK_K) {
        const float d = load_fp16(src + 208);
        const int8_t *sc = (const int8_t *)(src + 192);
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = src + 64 * half, *qh = src + 128 + 32 * half;
            const __m512i a0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)ql));
            const __m512i a1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(ql + 32)));
            const __m512i h = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)qh));
            const __m512i q[4] = {q6_words(a0, _mm512_slli_epi16(h, 4), low4, six, bias),
                                  q6_words(a1, _mm512_slli_epi16(h, 2), low4, six, bias),
                                  q6_words(_mm512_srli_epi16(a0, 4), h, low4, six, bias),
                                  q6_words(_mm512_srli_epi16(a1, 4), _mm512_srli_epi16(h, 2), low4, six, bias)};
            for (int g = 0; g < 4; g++) {
                const int j = 8 * half + 2 * g; /* the sub-blocks of weights 0-15 and 16-31 of this group */
                __m512 v[2];
                for (int part = 0; part < 2; part++) {
                    const __m256i words = part == 0 ? _mm512_castsi512_si256(q[g]) : _mm512_extracti64x4_epi64(q[g], 1);
                    const __m512 value = _mm512_sub_ps(
                        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(words), 16)), offset);
                    v[part] = _mm512_mul_ps(_mm512_set1_ps(d * (float)sc[j + part]), value);
                }
                _mm512_storeu_si512(dst + 128 * half + 32 * g, (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]));
            }
        }
    }
}
#if !defined(__clang__)
#pragma GCC pop_options
#endif

int tgictl_qlinear_q6_k_rows_bf16(const uint16_t *x, const uint8_t *w, int64_t row_bytes, const float *bias,
                                  uint16_t *y, int64_t m, int64_t n, int64_t k, int threads) {
    if (m < 1 || m > MAX_ROWS || k % QK_K != 0 || row_bytes != k / QK_K * Q6_K_BYTES) return -1;
    float *xsum = malloc(sizeof(float) * (size_t)(m * (k / 16))); /* X_j: each row's sums over sub-blocks */
    if (xsum == NULL) return -1;
    for (int64_t i = 0; i < m * (k / 16); i++) {
        float s = 0.0f;
        for (int l = 0; l < 16; l++) s += bf16_to_float(x[i * 16 + l]);
        xsum[i] = s;
    }
    __m512i index[8];
    for (int g = 0; g < 8; g++) index[g] = scale_index(g);
    /* one contiguous range of weight rows per thread: a single stream its prefetches run ahead in */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t row = 0; row < n; row++) {
        const uint8_t *wr = w + row * row_bytes;
        const float b = bias != NULL ? bias[row] : 0.0f;
        for (int64_t i0 = 0; i0 < m; i0 += PASS_ROWS) {
            float out[PASS_ROWS];
            const uint16_t *xi = x + i0 * k;
            const float *si = xsum + i0 * (k / 16);
            switch (m - i0 < PASS_ROWS ? m - i0 : PASS_ROWS) { /* constant row counts: the sums stay in registers */
            case 1: q6_k_row(wr, xi, si, k, 1, index, out); break;
            case 2: q6_k_row(wr, xi, si, k, 2, index, out); break;
            case 3: q6_k_row(wr, xi, si, k, 3, index, out); break;
            default: q6_k_row(wr, xi, si, k, 4, index, out); break;
            }
            for (int64_t r = 0; r < PASS_ROWS && i0 + r < m; r++) y[(i0 + r) * n + row] = float_to_bf16(out[r] + b);
        }
    }
    free(xsum);
    return 0;
}

#else

int tgictl_q6_k_rows_bf16_available(void) { return 0; }

void tgictl_q6_k_decode_row_bf16(const uint8_t *src, uint16_t *dst, int64_t k) { (void)src, (void)dst, (void)k; }

int tgictl_qlinear_q6_k_rows_bf16(const uint16_t *x, const uint8_t *w, int64_t row_bytes, const float *bias,
                                  uint16_t *y, int64_t m, int64_t n, int64_t k, int threads) {
    (void)x, (void)w, (void)row_bytes, (void)bias, (void)y, (void)m, (void)n, (void)k, (void)threads;
    return -1;
}

#endif
