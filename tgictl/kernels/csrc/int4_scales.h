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

#if defined(__AVX512F__)
#include <immintrin.h>

/* Scales and offsets (zero - 8 scale) of 16 rows row0 + 16v.. at group g, from [groups, n_pad, 2] (scale, zero)
 * pairs, as vectors: a scalar loop over the 64 rows of a tile cost more than the group's 32 columns of
 * products at group size 32. bf16 pairs: the scale is a 32-bit lane shifted left by 16, the zero the lane
 * with its low half cleared; float32 pairs are split by two permutes. */
static inline void scales_offsets(const void *sz, int sz_bf16, int64_t base, int v, __m512 *scale, __m512 *offset) {
    __m512 zero;
    if (sz_bf16) {
        const __m512i u = _mm512_loadu_si512((const uint16_t *)sz + base + 32 * v);
        *scale = _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
        zero = _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u)));
    } else {
        const float *f = (const float *)sz + base + 32 * v;
        const __m512 a = _mm512_loadu_ps(f), b = _mm512_loadu_ps(f + 16);
        const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        *scale = _mm512_permutex2var_ps(a, even, b);
        zero = _mm512_permutex2var_ps(a, odd, b);
    }
    *offset = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), *scale, zero);
}

#endif
#endif
