/* The softmax pieces the AVX-512 attention kernels share: e^x in 512-bit vectors (exp.h's polynomial, for
 * scores after subtracting the maximum) and the running (online) softmax's correction factor. */
#ifndef TGICTL_EXP512_H
#define TGICTL_EXP512_H

#include <immintrin.h>
#include <math.h>

/* e^x for x <= 0 (exp.h's polynomial, in vectors; lanes below -87 come out as ~1.6e-38, never 0). */
static inline __m512 exp_nonpositive_v(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f),
                                                          _mm512_set1_ps(0.5f)),
                                          _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* e^(old - top) for a running maximum that moves from `old` to `top` (>= old): what the sums so far are
 * multiplied by. Exactly 1 while the maximum stands (the caller can skip the multiply), 0 before the
 * first key (old = -inf). */
static inline float running_rescale(float old, float top) {
    return old == top ? 1.0f : (old == -INFINITY ? 0.0f : expf(old - top));
}

#endif
