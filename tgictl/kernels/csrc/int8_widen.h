/* 16 int8 -> 16 float32 for the kernels that read int8 weights a vector at a time (gguf_linear.c's Q8_0 blocks,
 * int8_linear.c's rows at one input row). */
#ifndef TGICTL_INT8_WIDEN_H
#define TGICTL_INT8_WIDEN_H

#include <stdint.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "vec16.h"

/* Intrinsics where the CPU has them: GCC 12 turns the vector-extension conversion (int8 -> int32 -> float) into
 * 16 scalar ones, 5x slower than the sign extension it should be. */
static inline v16f widen_i8(const int8_t *p) {
    v16f v;
#if defined(__AVX512F__)
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
    memcpy(&v, &f, sizeof v);
#elif defined(__AVX2__)
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8))));
    memcpy(&v, &lo, sizeof lo);
    memcpy((char *)&v + sizeof lo, &hi, sizeof hi);
#else
    for (int i = 0; i < 16; i++) v[i] = (float)p[i];
#endif
    return v;
}

#endif
