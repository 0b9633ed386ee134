/* AVX2 helpers the kernels share (fma_linear.c, gguf_linear.c). */
#ifndef TGICTL_AVX2_H
#define TGICTL_AVX2_H

#if defined(__AVX2__)
#include <immintrin.h>

/* The sum of a vector's 8 floats. */
static inline float sum8(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#endif

#endif
