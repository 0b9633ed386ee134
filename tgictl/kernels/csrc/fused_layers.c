/* The decoder's elementwise steps fused into one pass each, on the CPU.
 *
 * At decode batch sizes a layer's elementwise work is tiny, and as torch ops it is ~40 calls per
 * layer (casts, pow, mean, rsqrt, muls, chunk, cat, index_copy_), each a dispatch and a pass over
 * memory; together they cost more than the layer's matmuls. Each kernel here does one such group in
 * one call, with the same arithmetic and the same roundings as the torch ops it replaces:
 *
 *   rmsnorm:       [sum = x + delta, rounded to T,] out = w * T(sum * rsqrt(mean(sum^2) + eps))
 *                  (statistics in float32: transformers' LlamaRMSNorm); bf16 only, see fused.py
 *   silu_mul:      out = T(T(silu(gate)) * up) from the fused gate|up projection's rows
 *   rotary_store:  q and k rotated ("rotate half": transformers' apply_rotary_pos_emb, each product
 *                  rounded to T as torch's bf16 ops round them), q written out, k and v stored in
 *                  the paged caches at their slots (as T, or int8 rows with their scales)
 *
 * T is float32, or bfloat16 held as uint16 (ROUND rounds a float32 to the nearest bf16 value and
 * back, which is what a bf16 torch op does to each result). Sums of squares run in a different order
 * than torch's, so results may differ by float rounding there; everything else is the same formula.
 * Rows are independent: a row's result does not depend on the others (batch invariance).
 *
 * Built at run time by tgictl/kernels/native.py; loaded with ctypes. Parallel over rows with OpenMP
 * when the work is large enough to pay for waking the threads (prefill), serial at decode sizes.
 */
#include <math.h>
#include <stdint.h>

#include "bf16.h"
#include "exp.h"
#include "kv_int8.h"

/* Below this many elements a kernel runs on the calling thread: a parallel region costs more. */
#define PARALLEL_MIN_ELEMENTS 65536

static inline float round_f32(float x) { return x; }
static inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }
static inline float store_f32(float x) { return x; }

/* bf16 rows in explicit AVX-512 vectors, 32 values per step as their even and odd elements (no shuffles), with
 * the generic loops' formulas and roundings; they return 0 (the caller takes the generic loop) where the row is
 * not a multiple of 32 or the build has no AVX-512. At 1,000 rows the generic SiLU*mul took 0.72 ms per
 * layer on 2 Xeon cores (the bf16 conversions kept it from vectorising well). */
#define NO_VECTOR_ROW(...) 0 /* the generic loop for every row */

#if defined(__AVX512F__)
#include <immintrin.h>

#include "exp512.h"

static inline __m512 even_bf16(__m512i u) { return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)); }
static inline __m512 odd_bf16(__m512i u) {
    return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u)));
}

/* x rounded to the nearest bf16 (ties to even; NaN stays a quiet NaN), in the top half of each lane. */
static inline __m512i round_bits(__m512 x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_and_si512(_mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x400000)),
                            _mm512_set1_epi32((int)0xFFFF0000u));
}

static inline __m512 round_v(__m512 x) { return _mm512_castsi512_ps(round_bits(x)); }

/* Even results' bf16 in the low halves, odd ones' in the high halves: 32 bf16 values in order. */
static inline __m512i pack_even_odd(__m512 even, __m512 odd) {
    return _mm512_or_si512(_mm512_srli_epi32(round_bits(even), 16), round_bits(odd));
}

static inline __m512 silu_v(__m512 g) {
    const __m512 e = exp_nonpositive_v(_mm512_castsi512_ps(
        _mm512_or_si512(_mm512_castps_si512(g), _mm512_set1_epi32((int)0x80000000u)))); /* e^-|g| */
    const __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_div_ps(_mm512_mask_mul_ps(g, negative, g, e), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

static inline int silu_mul_row_bf16_vector(const uint16_t *g, const uint16_t *u, uint16_t *o, int64_t inter) {
    if (inter % 32 != 0) return 0;
    for (int64_t j = 0; j < inter; j += 32) {
        const __m512i gv = _mm512_loadu_si512(g + j), uv = _mm512_loadu_si512(u + j);
        const __m512 even = _mm512_mul_ps(round_v(silu_v(even_bf16(gv))), even_bf16(uv));
        const __m512 odd = _mm512_mul_ps(round_v(silu_v(odd_bf16(gv))), odd_bf16(uv));
        _mm512_storeu_si512(o + j, pack_even_odd(even, odd));
    }
    return 1;
}

/* One row: [s = x + delta rounded, written to sum_out,] out = w * round(s * rsqrt(mean(s^2) + eps)). */
static inline int rmsnorm_row_bf16_vector(const uint16_t *x, const uint16_t *delta, uint16_t *sum_out,
                                          const uint16_t *weight, uint16_t *o, int64_t dim, float eps) {
    if (dim % 32 != 0) return 0;
    __m512 squares = _mm512_setzero_ps();
    if (delta != NULL) {
        for (int64_t j = 0; j < dim; j += 32) {
            const __m512i xv = _mm512_loadu_si512(x + j), dv = _mm512_loadu_si512(delta + j);
            const __m512 even = round_v(_mm512_add_ps(even_bf16(xv), even_bf16(dv)));
            const __m512 odd = round_v(_mm512_add_ps(odd_bf16(xv), odd_bf16(dv)));
            _mm512_storeu_si512(sum_out + j, pack_even_odd(even, odd));
            squares = _mm512_fmadd_ps(odd, odd, _mm512_fmadd_ps(even, even, squares));
        }
        x = sum_out;
    } else {
        for (int64_t j = 0; j < dim; j += 32) {
            const __m512i xv = _mm512_loadu_si512(x + j);
            const __m512 even = even_bf16(xv), odd = odd_bf16(xv);
            squares = _mm512_fmadd_ps(odd, odd, _mm512_fmadd_ps(even, even, squares));
        }
    }
    const __m512 inv = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(squares) / (float)dim + eps));
    for (int64_t j = 0; j < dim; j += 32) {
        const __m512i xv = _mm512_loadu_si512(x + j), wv = _mm512_loadu_si512(weight + j);
        const __m512 even = _mm512_mul_ps(even_bf16(wv), round_v(_mm512_mul_ps(even_bf16(xv), inv)));
        const __m512 odd = _mm512_mul_ps(odd_bf16(wv), round_v(_mm512_mul_ps(odd_bf16(xv), inv)));
        _mm512_storeu_si512(o + j, pack_even_odd(even, odd));
    }
    return 1;
}
#else
#define silu_mul_row_bf16_vector NO_VECTOR_ROW
#define rmsnorm_row_bf16_vector NO_VECTOR_ROW
#endif

#define DEFINE_RMSNORM(NAME, T, LOAD, STORE, ROUND, VECTOR_ROW)                                          \
    void NAME(const T *x, const T *delta, T *sum_out, const T *weight, T *out, int64_t rows, int64_t dim, \
              float eps, int threads) {                                                                  \
        _Pragma("omp parallel for num_threads(threads) if (rows * dim >= PARALLEL_MIN_ELEMENTS)")        \
        for (int64_t r = 0; r < rows; r++) {                                                             \
            const T *xr = x + r * dim;                                                                   \
            T *o = out + r * dim;                                                                        \
            if (VECTOR_ROW(xr, delta == NULL ? NULL : delta + r * dim,                                   \
                           delta == NULL ? NULL : sum_out + r * dim, weight, o, dim, eps))               \
                continue;                                                                                \
            float squares = 0.0f;                                                                        \
            if (delta != NULL) {                                                                         \
                const T *dr = delta + r * dim;                                                           \
                T *sr = sum_out + r * dim;                                                               \
                _Pragma("omp simd reduction(+ : squares)") for (int64_t j = 0; j < dim; j++) {           \
                    const T s = STORE(LOAD(xr[j]) + LOAD(dr[j]));                                        \
                    sr[j] = s;                                                                           \
                    squares += LOAD(s) * LOAD(s);                                                        \
                }                                                                                        \
                xr = sr;                                                                                 \
            } else {                                                                                     \
                _Pragma("omp simd reduction(+ : squares)") for (int64_t j = 0; j < dim; j++)             \
                    squares += LOAD(xr[j]) * LOAD(xr[j]);                                                \
            }                                                                                            \
            const float inv = 1.0f / sqrtf(squares / (float)dim + eps);                                  \
            _Pragma("omp simd") for (int64_t j = 0; j < dim; j++)                                        \
                o[j] = STORE(LOAD(weight[j]) * ROUND(LOAD(xr[j]) * inv));                                \
        }                                                                                                \
    }

DEFINE_RMSNORM(tgictl_rmsnorm_bf16, uint16_t, bf16_to_float, float_to_bf16, round_bf16, rmsnorm_row_bf16_vector)

/* silu(g) = g / (1 + e^-g), with e^-|g| so the exponential never overflows:
 * g >= 0: g / (1 + e^-g); g < 0: g e^g / (1 + e^g). */
static inline float silu(float g) {
    const float e = exp_nonpositive(-fabsf(g));
    return (g >= 0.0f ? g : g * e) / (1.0f + e);
}

#define DEFINE_SILU_MUL(NAME, T, LOAD, STORE, ROUND, VECTOR_ROW)                                         \
    void NAME(const T *gate_up, T *out, int64_t rows, int64_t inter, int threads) {                      \
        _Pragma("omp parallel for num_threads(threads) if (rows * inter >= PARALLEL_MIN_ELEMENTS)")      \
        for (int64_t r = 0; r < rows; r++) {                                                             \
            const T *g = gate_up + r * 2 * inter, *u = g + inter;                                        \
            T *o = out + r * inter;                                                                      \
            if (VECTOR_ROW(g, u, o, inter)) continue;                                                    \
            _Pragma("omp simd") for (int64_t j = 0; j < inter; j++)                                      \
                o[j] = STORE(ROUND(silu(LOAD(g[j]))) * LOAD(u[j]));                                      \
        }                                                                                                \
    }

DEFINE_SILU_MUL(tgictl_silu_mul_f32, float, load_f32, store_f32, round_f32, NO_VECTOR_ROW)
DEFINE_SILU_MUL(tgictl_silu_mul_bf16, uint16_t, bf16_to_float, float_to_bf16, round_bf16, silu_mul_row_bf16_vector)

/* One head of `d` values: first half x1*c - x2*s, second half x2*c + x1*s, each product rounded. */
#define DEFINE_ROTATE(NAME, T, LOAD, STORE, ROUND)                                                       \
    static inline void NAME(const T *x, const T *cos, const T *sin, T *out, int64_t half) {              \
        _Pragma("omp simd") for (int64_t j = 0; j < half; j++) {                                         \
            const float x1 = LOAD(x[j]), x2 = LOAD(x[j + half]), c = LOAD(cos[j]), s = LOAD(sin[j]);     \
            out[j] = STORE(ROUND(x1 * c) - ROUND(x2 * s));                                               \
            out[j + half] = STORE(ROUND(x2 * c) + ROUND(x1 * s));                                        \
        }                                                                                                \
    }

DEFINE_ROTATE(rotate_f32, float, load_f32, store_f32, round_f32)
DEFINE_ROTATE(rotate_bf16, uint16_t, bf16_to_float, float_to_bf16, round_bf16)

/* qkv: [tokens, (heads + 2 * kv_heads) * d], rows q | k | v; cos, sin: [tokens, d / 2];
 * slots: [tokens]; q_out: [tokens, heads, d]; caches: [num_slots, kv_heads, d].
 * Returns 0, or -1 (nothing written) when a slot lies outside [0, num_slots). */
#define DEFINE_ROTARY_STORE(NAME, T, ROTATE)                                                             \
    int NAME(const T *qkv, const T *cos, const T *sin, const int64_t *slots, T *q_out, T *key_cache,     \
             T *value_cache, int64_t tokens, int64_t heads, int64_t kv_heads, int64_t d, int64_t num_slots, \
             int threads) {                                                                              \
        for (int64_t t = 0; t < tokens; t++)                                                             \
            if (slots[t] < 0 || slots[t] >= num_slots) return -1;                                        \
        const int64_t half = d / 2, width = (heads + 2 * kv_heads) * d;                                  \
        _Pragma("omp parallel for num_threads(threads) if (tokens * width >= PARALLEL_MIN_ELEMENTS)")    \
        for (int64_t t = 0; t < tokens; t++) {                                                           \
            const T *row = qkv + t * width, *c = cos + t * half, *s = sin + t * half;                    \
            for (int64_t h = 0; h < heads; h++) ROTATE(row + h * d, c, s, q_out + (t * heads + h) * d, half); \
            T *k = key_cache + slots[t] * kv_heads * d, *v = value_cache + slots[t] * kv_heads * d;      \
            for (int64_t h = 0; h < kv_heads; h++) ROTATE(row + (heads + h) * d, c, s, k + h * d, half); \
            const T *vr = row + (heads + kv_heads) * d;                                                  \
            for (int64_t j = 0; j < kv_heads * d; j++) v[j] = vr[j];                                     \
        }                                                                                                \
        return 0;                                                                                        \
    }

DEFINE_ROTARY_STORE(tgictl_rotary_store_f32, float, rotate_f32)
DEFINE_ROTARY_STORE(tgictl_rotary_store_bf16, uint16_t, rotate_bf16)

/* The same into an int8 cache (--kv-cache-dtype int8): each k row (rotated and rounded to T, as above) and each v
 * row quantized as written with its own scale (kv_int8.h's rule, the torch store's bytes). key_scales,
 * value_scales: [num_slots, kv_heads] bf16. Returns 0, -1 (nothing written) when a slot lies outside the cache,
 * -2 when the head size is over MAX_Q8_HEAD (the caller takes the torch ops). */
#define MAX_Q8_HEAD 512
#define DEFINE_ROTARY_STORE_Q8(NAME, T, LOAD, ROTATE)                                                    \
    int NAME(const T *qkv, const T *cos, const T *sin, const int64_t *slots, T *q_out, int8_t *key_cache, \
             uint16_t *key_scales, int8_t *value_cache, uint16_t *value_scales, int64_t tokens, int64_t heads, \
             int64_t kv_heads, int64_t d, int64_t num_slots, int threads) {                              \
        if (d > MAX_Q8_HEAD) return -2;                                                                  \
        for (int64_t t = 0; t < tokens; t++)                                                             \
            if (slots[t] < 0 || slots[t] >= num_slots) return -1;                                        \
        const int64_t half = d / 2, width = (heads + 2 * kv_heads) * d;                                  \
        _Pragma("omp parallel for num_threads(threads) if (tokens * width >= PARALLEL_MIN_ELEMENTS)")    \
        for (int64_t t = 0; t < tokens; t++) {                                                           \
            const T *row = qkv + t * width, *c = cos + t * half, *s = sin + t * half;                    \
            for (int64_t h = 0; h < heads; h++) ROTATE(row + h * d, c, s, q_out + (t * heads + h) * d, half); \
            T rotated[MAX_Q8_HEAD];                                                                      \
            float x[MAX_Q8_HEAD];                                                                        \
            const int64_t at = slots[t] * kv_heads;                                                      \
            for (int64_t h = 0; h < kv_heads; h++) {                                                     \
                ROTATE(row + (heads + h) * d, c, s, rotated, half);                                      \
                for (int64_t j = 0; j < d; j++) x[j] = LOAD(rotated[j]);                                 \
                quantize_row_int8(x, d, key_cache + (at + h) * d, key_scales + at + h);                  \
                const T *vr = row + (heads + kv_heads + h) * d;                                          \
                for (int64_t j = 0; j < d; j++) x[j] = LOAD(vr[j]);                                      \
                quantize_row_int8(x, d, value_cache + (at + h) * d, value_scales + at + h);              \
            }                                                                                            \
        }                                                                                                \
        return 0;                                                                                        \
    }

DEFINE_ROTARY_STORE_Q8(tgictl_rotary_store_q8_f32, float, load_f32, rotate_f32)
DEFINE_ROTARY_STORE_Q8(tgictl_rotary_store_q8_bf16, uint16_t, bf16_to_float, rotate_bf16)

/* Greedy choice and its log-probability for logits [rows, vocab] (float32, or bf16 as the LM head wrote them:
 * widening is exact, so the bf16 version skips a [rows, vocab] float32 copy and gives the same results):
 * ids[r] = the first index of the row's maximum (torch.argmax's tie rule), logprobs[r] = -log(sum_j e^(x_j -
 * max)), the chosen token's log_softmax value (x_chosen - max = 0). The maximum is found by a vectorised pass,
 * then its first index. Rows holding a NaN are left to the caller: returns their count, ids and logprobs of
 * those rows unset. */
#define GREEDY_MIN (4 * PARALLEL_MIN_ELEMENTS) /* logits per call below which the rows run serially */
#define DEFINE_GREEDY(NAME, T, LOAD)                                                                     \
    int64_t NAME(const T *logits, int64_t rows, int64_t vocab, int64_t *ids, float *logprobs, int threads) { \
        int64_t with_nan = 0;                                                                            \
        _Pragma("omp parallel for num_threads(threads) reduction(+ : with_nan) if (rows * vocab >= GREEDY_MIN)") \
        for (int64_t r = 0; r < rows; r++) {                                                             \
            const T *x = logits + r * vocab;                                                             \
            float best = -INFINITY;                                                                      \
            int nan = 0;                                                                                 \
            _Pragma("omp simd reduction(max : best) reduction(| : nan)") for (int64_t j = 0; j < vocab; j++) { \
                const float v = LOAD(x[j]);                                                              \
                nan |= v != v;                                                                           \
                best = v > best ? v : best;                                                              \
            }                                                                                            \
            if (nan || isinf(best)) { /* NaN rows, and +-inf maxima (inf - inf), take torch's path */    \
                with_nan++;                                                                              \
                continue;                                                                                \
            }                                                                                            \
            int64_t at = 0;                                                                              \
            while (LOAD(x[at]) != best) at++;                                                            \
            double sum = 0.0; /* in double: 50k float32 terms would otherwise drift by tens of ulps */   \
            _Pragma("omp simd reduction(+ : sum)") for (int64_t j = 0; j < vocab; j++)                   \
                sum += exp_nonpositive(LOAD(x[j]) - best);                                               \
            ids[r] = at;                                                                                 \
            logprobs[r] = (float)-log(sum);                                                              \
        }                                                                                                \
        return with_nan;                                                                                 \
    }

DEFINE_GREEDY(tgictl_greedy_f32, float, load_f32)
DEFINE_GREEDY(tgictl_greedy_bf16, uint16_t, bf16_to_float)
