/* 16-float vectors for the C kernels (GCC vector extensions: AVX-512 registers where the CPU has them, two
 * AVX2 or four SSE registers elsewhere), and the shuffle-free widening of bf16 pairs they share. */
#ifndef TGICTL_VEC16_H
#define TGICTL_VEC16_H

#include <stdint.h>
#include <string.h>

typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

static inline v16f load_v16f(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline v16u load_v16u(const void *p) {
    v16u u;
    memcpy(&u, p, sizeof u);
    return u;
}

static inline v16f bits_v16f(v16u u) {
    v16f f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* 32 bf16 values in 16 32-bit lanes as float32: the even elements (lane << 16) and the odd ones (the lane
 * with its low half cleared). No shuffle: a per-element widening (vpmovzxwd) runs on one port and capped
 * the matrix-vector kernel at 10 GB/s per core even from L2. */
static inline v16f bf16_even(v16u u) { return bits_v16f(u << 16); }
static inline v16f bf16_odd(v16u u) { return bits_v16f(u & ((v16u){0} + 0xFFFF0000u)); }

static inline float sum_v16f(v16f v) {
    const v8f a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const v4f b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

#endif
