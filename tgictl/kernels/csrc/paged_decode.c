/* Decode attention straight from the paged KV cache, on the CPU.
 *
 * One query token per sequence. For every (sequence, KV head) pair the kernel walks the sequence's
 * own slots (no copy of its context: the torch path gathers every sequence's K and V into a padded
 * tensor in every layer, then multiplies), scores the KV head's group of query heads against each
 * key in float32, takes the softmax in float32 and accumulates the values in float32. Padding is never
 * read: each sequence stops at its own context length.
 *
 * Layouts (all contiguous, row-major):
 *   query, out: [n, heads, d]; head h*group + g uses KV head h (GQA, as transformers repeats KV heads)
 *   key_cache, value_cache: [num_slots, kv_heads, d] (the paged cache viewed by slot)
 *   slots: [n, max_len] int64 slot of each context position; context_lens: [n] int64
 * Element types: float32, or bfloat16 held as uint16 (converted exactly to float32; the output is
 * rounded to nearest even). Parallel over (sequence, KV head) with OpenMP, `threads` wide.
 *
 * Built at run time by tgictl/kernels/native.py (cc -O3 -march=native -fopenmp); loaded with ctypes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "exp.h"
#include "vec16.h"

/* One (sequence, KV head) pair. q: [group, d] float32 scaled query rows; scores: [group, len] and
 * acc: [group, d] float32 scratch; row: [d] float32 scratch. `load_row` converts one cached row. */
#define DEFINE_PAIR(NAME, T, LOAD, D)                                                                    \
    static void NAME(const float *q, const T *key_cache, const T *value_cache, const int64_t *slots,   \
                     int64_t len, int64_t kv_heads, int64_t h, int64_t group, int64_t d_runtime,        \
                     float softcap, float *scores, float *acc, float *row, float *out_rows) {           \
        const int64_t d = (D);                                                                          \
        (void)d_runtime;                                                                                \
        for (int64_t t = 0; t < len; t++) {                                                             \
            const T *k = key_cache + (slots[t] * kv_heads + h) * d;                                     \
            _Pragma("omp simd") for (int64_t j = 0; j < d; j++) row[j] = LOAD(k[j]);                    \
            for (int64_t g = 0; g < group; g++) {                                                       \
                const float *qg = q + g * d;                                                            \
                float dot = 0.0f;                                                                       \
                _Pragma("omp simd reduction(+ : dot)") for (int64_t j = 0; j < d; j++) dot += qg[j] * row[j]; \
                if (softcap > 0.0f) dot = tanhf(dot / softcap) * softcap;                               \
                scores[g * len + t] = dot;                                                              \
            }                                                                                           \
        }                                                                                               \
        for (int64_t g = 0; g < group; g++) {                                                           \
            float *s = scores + g * len;                                                                \
            float max = s[0];                                                                           \
            for (int64_t t = 1; t < len; t++) max = s[t] > max ? s[t] : max;                            \
            float sum = 0.0f;                                                                           \
            _Pragma("omp simd reduction(+ : sum)") for (int64_t t = 0; t < len; t++) {                  \
                s[t] = exp_nonpositive(s[t] - max);                                                     \
                sum += s[t];                                                                            \
            }                                                                                           \
            float inv = 1.0f / sum;                                                                     \
            _Pragma("omp simd") for (int64_t t = 0; t < len; t++) s[t] *= inv;                          \
        }                                                                                               \
        memset(acc, 0, (size_t)(group * d) * sizeof(float));                                           \
        for (int64_t t = 0; t < len; t++) {                                                             \
            const T *v = value_cache + (slots[t] * kv_heads + h) * d;                                   \
            _Pragma("omp simd") for (int64_t j = 0; j < d; j++) row[j] = LOAD(v[j]);                    \
            for (int64_t g = 0; g < group; g++) {                                                       \
                const float p = scores[g * len + t];                                                    \
                float *a = acc + g * d;                                                                 \
                _Pragma("omp simd") for (int64_t j = 0; j < d; j++) a[j] += p * row[j];                 \
            }                                                                                           \
        }                                                                                               \
        memcpy(out_rows, acc, (size_t)(group * d) * sizeof(float));                                     \
    }

/* Head sizes 64 and 128 (nearly every model) get their own copies with the size as a constant: the
 * per-key loops then unroll into a few vector instructions instead of a loop with a remainder each. */
DEFINE_PAIR(pair_f32_64, float, load_f32, 64)
DEFINE_PAIR(pair_f32_128, float, load_f32, 128)
DEFINE_PAIR(pair_f32_any, float, load_f32, d_runtime)
DEFINE_PAIR(pair_bf16_any, uint16_t, bf16_to_float, d_runtime)

/* bf16 caches with head size 64 or 128 on CPUs without AVX512-BF16 (decode_attention_bf16.c serves the others):
 * the same pair, written with explicit 16-float vectors. A bf16
 * pair in a 32-bit lane widens without a shuffle (the even element is the lane shifted left by 16, the odd
 * one the lane with its low half cleared), so a cached row is read in "even|odd" order per 32 elements; the
 * query is laid out in that order once, and the output is put back in order at the end. The value sums of
 * up to ACC_VECTORS vectors stay in registers across the whole context (more heads per KV head take more
 * passes over V; the widening: vec16.h). On SmolLM2's shapes (9 heads, 3 KV heads, d 64) this is ~2-3x the generic loop's speed. */
#define ACC_VECTORS 24
#define MAX_VECTORS 8 /* d 128 */

/* One cached bf16 row of d = 16 * V elements as V float32 vectors in even|odd order. */
static inline void load_row_bf16(const uint16_t *row, int V, v16f out[MAX_VECTORS]) {
    for (int c = 0; c < V / 2; c++) {
        const v16u u = load_v16u(row + 32 * c);
        out[2 * c] = bf16_even(u);
        out[2 * c + 1] = bf16_odd(u);
    }
}

/* Position of element j of a row in even|odd order. */
static inline int64_t even_odd_index(int64_t j) { return j / 32 * 32 + (j % 2) * 16 + (j % 32) / 2; }

static inline __attribute__((always_inline)) void pair_bf16_vec(
    const float *q_in, const uint16_t *key_cache, const uint16_t *value_cache, const int64_t *slots, int64_t len,
    int64_t kv_heads, int64_t h, int64_t group, float softcap, float *scores, float *q, float *out_rows, int V) {
    const int64_t d = 16 * V;
    for (int64_t g = 0; g < group; g++)
        for (int64_t j = 0; j < d; j++) q[g * d + even_odd_index(j)] = q_in[g * d + j];
    for (int64_t t = 0; t < len; t++) {
        v16f k[MAX_VECTORS];
        load_row_bf16(key_cache + (slots[t] * kv_heads + h) * d, V, k);
        for (int64_t g = 0; g < group; g++) {
            v16f a = load_v16f(q + g * d) * k[0], b = load_v16f(q + g * d + 16) * k[1];
            for (int v = 2; v < V; v += 2) {
                a += load_v16f(q + g * d + 16 * v) * k[v];
                b += load_v16f(q + g * d + 16 * v + 16) * k[v + 1];
            }
            float dot = sum_v16f(a + b);
            if (softcap > 0.0f) dot = tanhf(dot / softcap) * softcap;
            scores[g * len + t] = dot;
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float *s = scores + g * len;
        float max = s[0];
        for (int64_t t = 1; t < len; t++) max = s[t] > max ? s[t] : max;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; t++) {
            s[t] = exp_nonpositive(s[t] - max);
            sum += s[t];
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int64_t t = 0; t < len; t++) s[t] *= inv;
    }
    const int64_t heads_per_pass = ACC_VECTORS / V;
    for (int64_t g0 = 0; g0 < group; g0 += heads_per_pass) {
        const int64_t heads = group - g0 < heads_per_pass ? group - g0 : heads_per_pass;
        v16f acc[ACC_VECTORS];
        for (int x = 0; x < ACC_VECTORS; x++) acc[x] = (v16f){0};
        for (int64_t t = 0; t < len; t++) {
            v16f v[MAX_VECTORS];
            load_row_bf16(value_cache + (slots[t] * kv_heads + h) * d, V, v);
            for (int64_t g = 0; g < heads; g++) {
                const float p = scores[(g0 + g) * len + t];
                for (int c = 0; c < V; c++) acc[g * V + c] += p * v[c];
            }
        }
        for (int64_t g = 0; g < heads; g++) {
            float row[16 * MAX_VECTORS];
            memcpy(row, &acc[g * V], sizeof(float) * (size_t)d);
            for (int64_t j = 0; j < d; j++) out_rows[(g0 + g) * d + j] = row[even_odd_index(j)];
        }
    }
}

/* The two head sizes as the entry's function-pointer signature (d, row: the generic pair's arguments). */
#define DEFINE_PAIR_VEC(NAME, V)                                                                         \
    static void NAME(const float *q_in, const uint16_t *kc, const uint16_t *vc, const int64_t *slots,     \
                     int64_t len, int64_t kv_heads, int64_t h, int64_t group, int64_t d, float softcap,   \
                     float *scores, float *acc, float *row, float *out_rows) {                            \
        (void)d;                                                                                         \
        (void)row;                                                                                       \
        pair_bf16_vec(q_in, kc, vc, slots, len, kv_heads, h, group, softcap, scores, acc, out_rows, V);  \
    }
DEFINE_PAIR_VEC(pair_bf16_vec64, 4)
DEFINE_PAIR_VEC(pair_bf16_vec128, 8)

typedef void (*pair_f32_fn)(const float *, const float *, const float *, const int64_t *, int64_t, int64_t,
                            int64_t, int64_t, int64_t, float, float *, float *, float *, float *);
typedef void (*pair_bf16_fn)(const float *, const uint16_t *, const uint16_t *, const int64_t *, int64_t,
                             int64_t, int64_t, int64_t, int64_t, float, float *, float *, float *, float *);

/* Returns 0, or -1 when scratch memory could not be allocated (the caller falls back to torch). */
#define DEFINE_ENTRY(NAME, T, LOAD, STORE, FN, PAIR64, PAIR128, PAIR_ANY)                               \
    int NAME(const T *query, const T *key_cache, const T *value_cache, const int64_t *slots,             \
             const int64_t *context_lens, int64_t n, int64_t max_len, int64_t heads, int64_t kv_heads,  \
             int64_t d, float scale, float softcap, T *out, int threads) {                               \
        const int64_t group = heads / kv_heads;                                                          \
        const FN pair = d == 64 ? PAIR64 : d == 128 ? PAIR128 : PAIR_ANY;                                \
        int failed = 0;                                                                                  \
        _Pragma("omp parallel num_threads(threads) reduction(| : failed)") {                             \
            /* per-thread scratch: scores [group, max_len], acc/q/out [group, d], row [d] */             \
            float *scratch = malloc((size_t)(group * max_len + 3 * group * d + d) * sizeof(float));      \
            failed |= scratch == NULL; /* every thread still meets the `omp for` below */                \
            float *scores = scratch, *acc = scores + group * max_len, *q = acc + group * d;              \
            float *res = q + group * d, *row = res + group * d;                                          \
            _Pragma("omp for schedule(dynamic, 1)") for (int64_t task = 0; task < n * kv_heads; task++) { \
                if (scratch == NULL) continue;                                                           \
                const int64_t i = task / kv_heads, h = task % kv_heads;                                  \
                const T *qi = query + (i * heads + h * group) * d;                                       \
                for (int64_t x = 0; x < group * d; x++) q[x] = LOAD(qi[x]) * scale;                      \
                pair(q, key_cache, value_cache, slots + i * max_len, context_lens[i], kv_heads, h,       \
                     group, d, softcap, scores, acc, row, res);                                          \
                T *o = out + (i * heads + h * group) * d;                                                \
                for (int64_t x = 0; x < group * d; x++) o[x] = STORE(res[x]);                            \
            }                                                                                            \
            free(scratch);                                                                               \
        }                                                                                                \
        return failed ? -1 : 0;                                                                          \
    }

static inline float store_f32(float x) { return x; }
DEFINE_ENTRY(tgictl_paged_decode_f32, float, load_f32, store_f32, pair_f32_fn, pair_f32_64, pair_f32_128, pair_f32_any)
DEFINE_ENTRY(paged_decode_bf16_pairs, uint16_t, bf16_to_float, float_to_bf16, pair_bf16_fn, pair_bf16_vec64,
             pair_bf16_vec128, pair_bf16_any)

int tgictl_decode_attention_bf16(const uint16_t *query, const uint16_t *key_cache, const uint16_t *value_cache,
                                 const int64_t *slots, const int64_t *context_lens, int64_t n, int64_t max_len,
                                 int64_t heads, int64_t kv_heads, int64_t d, float scale, float softcap, uint16_t *out,
                                 int threads);

/* bf16: decode_attention_bf16.c where it serves this build and shape (AVX512-BF16, head sizes 64 and 128, up
 * to 8 query heads per KV head), the pairs above elsewhere. */
int tgictl_paged_decode_bf16(const uint16_t *query, const uint16_t *key_cache, const uint16_t *value_cache,
                             const int64_t *slots, const int64_t *context_lens, int64_t n, int64_t max_len,
                             int64_t heads, int64_t kv_heads, int64_t d, float scale, float softcap, uint16_t *out,
                             int threads) {
    const int status = tgictl_decode_attention_bf16(query, key_cache, value_cache, slots, context_lens, n, max_len,
                                                    heads, kv_heads, d, scale, softcap, out, threads);
    if (status != -2) return status;
    return paged_decode_bf16_pairs(query, key_cache, value_cache, slots, context_lens, n, max_len, heads, kv_heads,
                                   d, scale, softcap, out, threads);
}
