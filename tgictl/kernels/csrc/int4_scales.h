/* What the int4-tile kernels (tgictl/kernels/linear_methods/int4.py's layout) share: the (scale, offset)
 * vectors (quant_linear.c, int4_bf16.c, int4_rows_bf16.c) and the input's group sums (the matrix-vector ones). */
#ifndef TGICTL_INT4_SCALES_H
#define TGICTL_INT4_SCALES_H

#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"

/* [m, groups] sums of x [m, k] (float32, or bf16 when x_bf16) over each group of `group` columns, in column
 * order; a group's offset (zero - 8 scale) multiplies this sum. malloc'd for the caller to free; NULL when
 * refused. */
static inline float *int4_group_sums(const void *x, int x_bf16, int64_t m, int64_t k, int64_t group, int64_t groups) {
    float *xsum = malloc(sizeof(float) * (size_t)(m * groups));
    if (xsum == NULL) return NULL;
    for (int64_t i = 0; i < m; i++)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t end = (g + 1) * group < k ? (g + 1) * group : k;
            float s = 0.0f;
            for (int64_t c = g * group; c < end; c++)
                s += x_bf16 ? bf16_to_float(((const uint16_t *)x)[i * k + c]) : ((const float *)x)[i * k + c];
            xsum[i * groups + g] = s;
        }
    return xsum;
}

/* How a tile's scales are stored (`sz_form`, bit flags): SZ_BF16, bf16 values (else float32); SZ_ZERO, a (scale, zero)
 * pair per group and row, [k_pad / group, n_pad, 2] (else the scale alone, [k_pad / group, n_pad], and the zero
 * is 0: symmetric formats such as GGUF's Q4_0, w = scale (q - 8), which then read 2 bytes per group and row
 * instead of 4). */
#define SZ_BF16 1
#define SZ_ZERO 2

/* Index of row `row`'s scale at group g; its zero (SZ_ZERO) is the next value. */
static inline int64_t sz_index(int sz_form, int64_t g, int64_t n_pad, int64_t row) {
    return (sz_form & SZ_ZERO) ? (g * n_pad + row) * 2 : g * n_pad + row;
}

/* Scale and offset (zero - 8 scale) of row `row` at group g, one at a time. */
static inline void scale_offset_at(const void *sz, int sz_form, int64_t g, int64_t n_pad, int64_t row, float *scale,
                                   float *offset) {
    const int64_t i = sz_index(sz_form, g, n_pad, row);
    *scale = bf16_or_f32_at(sz, sz_form & SZ_BF16, i);
    *offset = ((sz_form & SZ_ZERO) ? bf16_or_f32_at(sz, sz_form & SZ_BF16, i + 1) : 0.0f) - 8.0f * *scale;
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* Scales and offsets (zero - 8 scale) of 16 rows row0 + 16v.. at group g, as vectors: a scalar loop over the
 * 64 rows of a tile cost more than the group's 32 columns of products at group size 32. bf16 pairs: the scale
 * is a 32-bit lane shifted left by 16, the zero the lane with its low half cleared; float32 pairs are split by
 * two permutes; scales alone are widened (bf16) or loaded as they are, with a zero of 0 (the offset is then
 * exactly -8 scale, as with a stored zero of 0). */
static inline void scales_offsets(const void *sz, int sz_form, int64_t g, int64_t n_pad, int64_t row0, int v,
                                  __m512 *scale, __m512 *offset) {
    __m512 zero = _mm512_setzero_ps();
    const int64_t base = sz_index(sz_form, g, n_pad, row0 + 16 * v);
    if ((sz_form & SZ_ZERO) && (sz_form & SZ_BF16)) {
        const __m512i u = _mm512_loadu_si512((const uint16_t *)sz + base);
        *scale = _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
        zero = _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u)));
    } else if (sz_form & SZ_ZERO) {
        const float *f = (const float *)sz + base;
        const __m512 a = _mm512_loadu_ps(f), b = _mm512_loadu_ps(f + 16);
        const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        *scale = _mm512_permutex2var_ps(a, even, b);
        zero = _mm512_permutex2var_ps(a, odd, b);
    } else if (sz_form & SZ_BF16) {
        const __m256i u = _mm256_loadu_si256((const __m256i *)((const uint16_t *)sz + base));
        *scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(u), 16));
    } else {
        *scale = _mm512_loadu_ps((const float *)sz + base);
    }
    *offset = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), *scale, zero);
}

#endif
#endif
