/* LoRA deltas of a batch whose tokens use different adapters (or none), added in place to a linear's
 * output (kernels/lora.py calls it; docs/architecture.md, "Multi-LoRA").
 *
 * For token t of adapter slot k: s = x[t] A_k^T (the "shrink", P * R values: R per projection the
 * linear fuses), then y[t, projection p's columns] += s[p R .. p R + R) B_{k,p}^T (the "expand"). The
 * factors are float32 and laid out for unit-stride inner loops:
 *     a: [N, in, P * R]    A^T of every projection, side by side
 *     b: [N, R, out]       B^T of every projection (scaling folded in), projection p at columns
 *                          [bounds[p], bounds[p + 1]) of the linear's output
 * Why one call: as torch ops the grouped products cost a dozen small ops per linear (gathers, bmm,
 * masks, cat, scatter), ~1,200 per step at batch 32, and their dispatch was most of the overhead.
 * Here the tokens of one adapter share each read of its factors (decode at batch 32 over 8 adapters
 * read every adapter's factors once per step instead of once per token); tokens without an adapter
 * are not touched. The sums run in float32 and y is rounded once (bf16), as the torch path does.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

/* Register tiles: TOKENS_PER_TILE tokens x two 16-float vectors of output (8 accumulators, enough to
 * keep two FMA pipes busy). GCC's vector extension lowers to AVX-512, AVX2 or SSE alike. */
typedef float vec __attribute__((vector_size(64)));
#define LANES 16
#define TOKENS_PER_TILE 4

static inline vec vload(const float *p) {
    vec v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vstore(float *p, vec v) { memcpy(p, &v, sizeof v); }

/* The factors are float32 or bf16 (a bf16 model's); `bf16` is a constant at every call site below, so
 * each kernel is compiled once per factor dtype with no branch in its loops. */
typedef uint16_t half_vec __attribute__((vector_size(32)));
typedef uint32_t bits_vec __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) vec fload(const void *base, int64_t index, int bf16) {
    if (!bf16) return vload((const float *)base + index);
    half_vec h;
    memcpy(&h, (const uint16_t *)base + index, sizeof h);
    const bits_vec bits = __builtin_convertvector(h, bits_vec) << 16; /* bf16 is a float's top half */
    vec v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) float fscalar(const void *base, int64_t index, int bf16) {
    return bf16 ? bf16_to_float(((const uint16_t *)base)[index]) : ((const float *)base)[index];
}

/* s[t, 0 .. pr) = x[t] A^T for the n tokens of one chunk; a: [in, pr]. x holds n rows padded with
 * zero rows to a multiple of TOKENS_PER_TILE (their s rows are computed and not used). */
static inline __attribute__((always_inline)) void shrink(const float *x, int64_t n, const void *a, int64_t in_features,
                                                         int64_t pr, float *s, int bf16) {
    const int64_t vec_end = pr - pr % LANES;
    for (int64_t t0 = 0; t0 < n; t0 += TOKENS_PER_TILE) {
        const float *xt = x + t0 * in_features;
        int64_t j = 0;
        for (; j + 2 * LANES <= vec_end; j += 2 * LANES) {
            vec acc[TOKENS_PER_TILE][2] = {{0}};
            for (int64_t i = 0; i < in_features; ++i) {
                const vec a0 = fload(a, i * pr + j, bf16), a1 = fload(a, i * pr + j + LANES, bf16);
                for (int t = 0; t < TOKENS_PER_TILE; ++t) {
                    const float xi = xt[t * in_features + i];
                    acc[t][0] += xi * a0;
                    acc[t][1] += xi * a1;
                }
            }
            for (int t = 0; t < TOKENS_PER_TILE; ++t) {
                vstore(s + (t0 + t) * pr + j, acc[t][0]);
                vstore(s + (t0 + t) * pr + j + LANES, acc[t][1]);
            }
        }
        for (; j < vec_end; j += LANES) {
            vec acc[TOKENS_PER_TILE] = {0};
            for (int64_t i = 0; i < in_features; ++i) {
                const vec a0 = fload(a, i * pr + j, bf16);
                for (int t = 0; t < TOKENS_PER_TILE; ++t) acc[t] += xt[t * in_features + i] * a0;
            }
            for (int t = 0; t < TOKENS_PER_TILE; ++t) vstore(s + (t0 + t) * pr + j, acc[t]);
        }
        for (; j < pr; ++j) { /* ranks that leave pr off a multiple of 16 */
            for (int t = 0; t < TOKENS_PER_TILE; ++t) {
                float dot = 0.0f;
                for (int64_t i = 0; i < in_features; ++i) dot += xt[t * in_features + i] * fscalar(a, i * pr + j, bf16);
                s[(t0 + t) * pr + j] = dot;
            }
        }
    }
}

/* float32 -> bf16 for 16 values at once, rounding as float_to_bf16 does (nearest, ties to even; a NaN
 * stays a quiet NaN). */
static inline void vstore_bf16(uint16_t *p, vec v) {
    bits_vec u;
    memcpy(&u, &v, sizeof u);
    const bits_vec rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const bits_vec nan = (bits_vec)(v != v);
    const bits_vec bits = (rounded & ~nan) | (((u >> 16) | 0x40u) & nan);
    const half_vec h = __builtin_convertvector(bits, half_vec);
    memcpy(p, &h, sizeof h);
}

/* count values of y's row (bf16 or float32) from column c into float32 dst, and back. */
static inline void load_y(const void *y, int y_bf16, int64_t row, int64_t c, float *dst, int64_t count) {
    if (!y_bf16) {
        memcpy(dst, (const float *)y + row + c, (size_t)count * sizeof *dst);
        return;
    }
    const uint16_t *src = (const uint16_t *)y + row + c;
    int64_t k = 0;
    for (; k + LANES <= count; k += LANES) vstore(dst + k, fload(src, k, 1));
    for (; k < count; ++k) dst[k] = bf16_to_float(src[k]);
}

static inline void store_y(void *y, int y_bf16, int64_t row, int64_t c, const float *src, int64_t count) {
    if (!y_bf16) {
        memcpy((float *)y + row + c, src, (size_t)count * sizeof *src);
        return;
    }
    uint16_t *dst = (uint16_t *)y + row + c;
    int64_t k = 0;
    for (; k + LANES <= count; k += LANES) vstore_bf16(dst + k, vload(src + k));
    for (; k < count; ++k) dst[k] = float_to_bf16(src[k]);
}

/* y[token, first .. stop) += s[t, p R .. p R + R) B^T for one projection; b: [R, out] (this
 * projection's columns first .. stop of it). Columns in tiles of 2 vectors, then 1, then one by one. */
static inline __attribute__((always_inline)) void expand(const float *s, int64_t n, const int64_t *tokens,
                                                         const void *b, int64_t rank, int64_t out, int64_t pr,
                                                         int64_t p, int64_t first, int64_t stop, void *y, int y_bf16,
                                                         int bf16) {
    for (int64_t t0 = 0; t0 < n; t0 += TOKENS_PER_TILE) {
        const int64_t tiles = n - t0 < TOKENS_PER_TILE ? n - t0 : TOKENS_PER_TILE;
        for (int64_t c = first; c < stop;) {
            const int64_t width = stop - c >= 2 * LANES ? 2 * LANES : stop - c >= LANES ? LANES : 1;
            float tile[TOKENS_PER_TILE][2 * LANES];
            for (int64_t t = 0; t < tiles; ++t) load_y(y, y_bf16, tokens[t0 + t] * out, c, tile[t], width);
            if (width == 1) {
                for (int64_t t = 0; t < tiles; ++t) {
                    float sum = tile[t][0];
                    for (int64_t r = 0; r < rank; ++r) sum += s[(t0 + t) * pr + p * rank + r] * fscalar(b, r * out + c, bf16);
                    tile[t][0] = sum;
                }
            } else {
                vec acc[TOKENS_PER_TILE][2];
                for (int t = 0; t < TOKENS_PER_TILE; ++t) {
                    acc[t][0] = vload(tile[t]);
                    acc[t][1] = width == 2 * LANES ? vload(tile[t] + LANES) : (vec){0};
                }
                for (int64_t r = 0; r < rank; ++r) {
                    const vec b0 = fload(b, r * out + c, bf16);
                    const vec b1 = width == 2 * LANES ? fload(b, r * out + c + LANES, bf16) : (vec){0};
                    for (int t = 0; t < TOKENS_PER_TILE; ++t) {
                        const float sr = s[(t0 + t) * pr + p * rank + r];
                        acc[t][0] += sr * b0;
                        acc[t][1] += sr * b1;
                    }
                }
                for (int t = 0; t < TOKENS_PER_TILE; ++t) {
                    vstore(tile[t], acc[t][0]);
                    vstore(tile[t] + LANES, acc[t][1]);
                }
            }
            for (int64_t t = 0; t < tiles; ++t) store_y(y, y_bf16, tokens[t0 + t] * out, c, tile[t], width);
            c += width;
        }
    }
}

/* x: [tokens, in] (bf16 if x_bf16, else float32); y: [tokens, out] (bf16 if y_bf16), both contiguous.
 * order: token indices grouped by adapter; chunks: [count, 3] (slot, start, stop) ranges of `order`,
 * each one adapter and at most max_chunk tokens (the unit of parallel work). Tokens in no chunk (no
 * adapter) are not touched. Returns 0, or -1 when scratch memory is refused. */
int tgictl_lora_add(const void *x, int x_bf16, void *y, int y_bf16, const int64_t *order, const int64_t *chunks,
                    int64_t count, int64_t max_chunk, int64_t in_features, int64_t out, const void *a,
                    const void *b, int factors_bf16, int64_t rank, int64_t projections, const int64_t *bounds,
                    int threads) {
    const int64_t esize = factors_bf16 ? 2 : 4;
    const int64_t pr = projections * rank;
    /* rows rounded up to whole tiles: the padding rows of x are zeros, their s rows unused */
    const int64_t rows = (max_chunk + TOKENS_PER_TILE - 1) / TOKENS_PER_TILE * TOKENS_PER_TILE;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *scratch = calloc((size_t)(rows * (in_features + pr)), sizeof(float));
        if (scratch == NULL) {
            failed = 1;
        } else {
            float *xf = scratch, *s = xf + rows * in_features;
#pragma omp for schedule(dynamic, 1)
            for (int64_t k = 0; k < count; ++k) {
                const int64_t slot = chunks[3 * k], start = chunks[3 * k + 1], n = chunks[3 * k + 2] - start;
                const int64_t *tokens = order + start;
                const int64_t padded = (n + TOKENS_PER_TILE - 1) / TOKENS_PER_TILE * TOKENS_PER_TILE;
                for (int64_t t = 0; t < padded; ++t) {
                    float *dst = xf + t * in_features;
                    if (t >= n) {
                        memset(dst, 0, (size_t)in_features * sizeof *dst);
                    } else {
                        load_y(x, x_bf16, tokens[t] * in_features, 0, dst, in_features);
                    }
                }
                const char *a_slot = (const char *)a + slot * in_features * pr * esize;
                const char *b_slot = (const char *)b + slot * rank * out * esize;
                if (factors_bf16) {
                    shrink(xf, n, a_slot, in_features, pr, s, 1);
                    for (int64_t p = 0; p < projections; ++p)
                        expand(s, n, tokens, b_slot, rank, out, pr, p, bounds[p], bounds[p + 1], y, y_bf16, 1);
                } else {
                    shrink(xf, n, a_slot, in_features, pr, s, 0);
                    for (int64_t p = 0; p < projections; ++p)
                        expand(s, n, tokens, b_slot, rank, out, pr, p, bounds[p], bounds[p + 1], y, y_bf16, 0);
                }
            }
            free(scratch);
        }
    }
    return failed ? -1 : 0;
}
