/* Decode attention over a paged int8 KV cache (--kv-cache-dtype int8; kv_int8.h's rows: int8 values and a bf16
 * scale per slot and KV head), for bf16 or float32 queries; output in the query's dtype.
 *
 * Why its own kernel: at long contexts decode attention reads the whole cache every step (16 rows x 8,192 cached
 * tokens of a Llama-3.2-1B-shaped model are 4.3 GB of bf16 K and V per step); int8 halves those bytes, and the
 * arithmetic must keep up with them, so the products run on the integer units:
 *
 * - Scores (AVX512-VNNI): the query of each head is quantized once per task to two int8 parts with their own
 *   scales, q ~ s q_hi + (s / 254) q_lo (the second part the first's rounding error): one int8 query (as llama.cpp's
 *   q8_0 cache has) lost 0.05-0.18 of an attention output on SmolLM2's outlier query dimensions, enough to change a
 *   greedy answer; two parts leave ~1/500 of a step of the scale, at one more VPDPBUSD per four dimensions.
 *   Per block of 16 keys and KV head, the 16 rows (d bytes each)
 *   are transposed so that a 32-bit lane holds four dimensions of one key, and a head's 16 scores are d / 4
 *   VPDPBUSD (unsigned key bytes, k + 128 by flipping the sign bit, times the signed query bytes; 128 times the
 *   query's sum is taken off after) with the query's four bytes broadcast: no sums across lanes. Then times the
 *   query's and the keys' scales.
 * - Softmax online (flash decoding, decode_tasks.h's chunks and merge), in float32.
 * - p v in float32: a value row widened (int8 to int32 to float32, exact), each head's p times that key's value
 *   scale, FMA into the head's sums in registers.
 *
 * Elsewhere (no AVX512-VNNI, other head sizes or groups) a portable loop per (sequence, KV head), dequantizing each
 * row to float32 (compiler-vectorised). Both return 0, or -1 when memory is refused.
 *
 * Layouts: query, out [n, heads, d] (bf16 or float32); key_cache, value_cache [num_slots, kv_heads, d] int8;
 * key_scales, value_scales [num_slots, kv_heads] bf16; slots [n, max_len] int64; context_lens [n] int64.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "decode_tasks.h"
#include "exp.h"

typedef struct {
    const void *query;
    int query_bf16;
    const int8_t *key_cache, *value_cache;
    const uint16_t *key_scales, *value_scales;
    const int64_t *slots;
    int64_t max_len, heads, kv_heads, d;
    float scale, softcap;
    const int8_t *query_q8; /* per sequence: query_parts_bytes(heads, d) (quantize_query's parts, sums, scales) */
} q8_call;

static inline float query_at(const q8_call *a, int64_t index) { return bf16_or_f32_at(a->query, a->query_bf16, index); }

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>

#include "exp512.h"
#include "read_ahead.h"

#define MAX_GROUP 8
#define ACC_VECTORS 24 /* float32 value sums kept in registers in one pass over a block's value rows */

/* r[j] (16 int32 lanes each) -> r[p] lane j = the old r[j] lane p: a 16 x 16 transpose in 64 in-lane unpacks and
 * 128-bit shuffles. */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* u[4i + k], 128-bit lane L: rows 4i .. 4i + 3 of column 4L + k */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88), v1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xdd);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
        const __m512i v3 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xdd);
        r[k] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        r[8 + k] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
        r[4 + k] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        r[12 + k] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
    }
}

/* Per task scratch (floats): m, rescale [heads] each, w [heads][16], l [heads][16] (each head's running sum
 * per lane: summed across lanes once, at the chunk's end, not per block), acc [heads][d]. */
static int64_t q8_scratch_floats(int64_t heads, int64_t d) { return heads * (2 + 2 * KEY_BLOCK + d) + 16; }

/* One sequence's quantized query (quantize_query), computed once before its chunks' tasks (every chunk of a
 * sequence uses the same: per chunk it took ~20% of the kernel at 8k cached, 16 chunks a sequence): q8 [2][heads][d]
 * bytes, then qsum [2][heads] int32, then qmul [2][heads] float. */
static int64_t query_parts_bytes(int64_t heads, int64_t d) { return 2 * heads * d + 16 * heads; }

/* The query of every head as two int8 parts: q8 [0][x] = rint(q / s) with s = amax / 127, q8 [1][x] the rounding
 * error in steps of s / 254 (|error| <= s / 2, so it fits in +-127); qsum [part][x] the bytes' sums, qmul [part][x]
 * the part's scale times the softmax scale. */
static void quantize_query(const q8_call *a, int64_t seq, int8_t *q8, int32_t *qsum, float *qmul) {
    const int64_t d = a->d, heads = a->heads;
    for (int64_t x = 0; x < heads; x++) {
        const int64_t base = (seq * a->heads + x) * d;
        float amax = 0.0f;
        for (int64_t j = 0; j < d; j++) {
            const float v = fabsf(query_at(a, base + j));
            amax = v > amax ? v : amax;
        }
        const float s = amax / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f, s_lo = s / 254.0f;
        const float inv_lo = s > 0.0f ? 1.0f / s_lo : 0.0f;
        int32_t sum = 0, sum_lo = 0;
        for (int64_t j = 0; j < d; j++) {
            const float v = query_at(a, base + j);
            const int32_t q = (int32_t)nearbyintf(v * inv);
            int32_t lo = (int32_t)nearbyintf((v - (float)q * s) * inv_lo);
            lo = lo > 127 ? 127 : (lo < -127 ? -127 : lo);
            q8[x * d + j] = (int8_t)q;
            q8[(heads + x) * d + j] = (int8_t)lo;
            sum += q;
            sum_lo += lo;
        }
        qsum[x] = sum;
        qsum[heads + x] = sum_lo;
        qmul[x] = s * a->scale;
        qmul[heads + x] = s_lo * a->scale;
    }
}

/* The 16 keys' bf16 scales of KV head h as float32. The keys of a block usually sit in consecutive slots (one
 * page of 16, or two pages' runs): their scales are then 16 kv_heads-strided values of one stretch, picked out of
 * (at most) 64 bf16 by two masked loads and one permute instead of 16 scalar loads; otherwise one at a time. */
static inline __m512 gather_scales(const uint16_t *scales, const int64_t *slots, int64_t kv_heads, int64_t h) {
    if (kv_heads <= 4 && slots[KEY_BLOCK - 1] - slots[0] == KEY_BLOCK - 1) {
        int consecutive = 1;
        for (int j = 1; j < KEY_BLOCK; j++) consecutive &= slots[j] == slots[0] + j;
        if (consecutive) {
            const int64_t count = KEY_BLOCK * kv_heads, high = count > 32 ? count - 32 : 0; /* bf16 values */
            const uint16_t *from = scales + slots[0] * kv_heads;
            const __m512i low_half = _mm512_maskz_loadu_epi16((__mmask32)((1ull << (count - high)) - 1ull), from);
            const __m512i high_half = _mm512_maskz_loadu_epi16((__mmask32)((1ull << high) - 1ull), from + 32);
            const __m512i index = _mm512_add_epi16(_mm512_mullo_epi16(
                _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11,
                                 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi16((short)kv_heads)),
                _mm512_set1_epi16((short)h));
            const __m256i picked = _mm512_castsi512_si256(_mm512_permutex2var_epi16(low_half, index, high_half));
            return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(picked), 16));
        }
    }
    float s[KEY_BLOCK];
    for (int j = 0; j < KEY_BLOCK; j++) s[j] = bf16_to_float(scales[slots[j] * kv_heads + h]);
    return _mm512_loadu_ps(s);
}

/* acc + the products of a's unsigned bytes and the signed bytes of the 32-bit value at b, broadcast to every lane
 * by the instruction itself ({1to16}): the compiler emitted a separate broadcast per product (a third of the
 * scores' instructions). */
static inline __m512i dpbusd_broadcast(__m512i acc, __m512i a, const int32_t *b) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*b));
    return acc;
}

/* The scores of KV head h's G query heads for one block of 16 keys (rows at `sl`) into w [G][16], before the
 * softmax. V: d / 16. */
static inline __attribute__((always_inline)) void block_scores(
    const q8_call *a, const int64_t *sl, int64_t h, const int8_t *q8, const int32_t *qsum, const float *qmul,
    float *w, const int G, const int V) {
    const int64_t d = 16 * V, row = a->kv_heads * d, lo = a->heads; /* lo: the second part's offset in heads */
    const __m512 sk = gather_scales(a->key_scales, sl, a->kv_heads, h);
    __m512i dot[MAX_GROUP][2];
    for (int g = 0; g < G; g++) dot[g][0] = dot[g][1] = _mm512_setzero_si512();
    for (int part = 0; part < V / 4; part++) { /* 64 dimensions at a time */
        __m512i c[16];
        for (int j = 0; j < KEY_BLOCK; j++)
            c[j] = _mm512_xor_si512(_mm512_loadu_si512(a->key_cache + sl[j] * row + h * d + 64 * part),
                                    _mm512_set1_epi8((char)0x80));
        transpose16(c); /* c[p] lane j: dimensions 64 part + 4p .. + 3 of key j, as k + 128 */
        for (int g = 0; g < G; g++) {
            const int32_t *qd = (const int32_t *)(q8 + (h * G + g) * d + 64 * part);
            const int32_t *qd_lo = (const int32_t *)(q8 + (lo + h * G + g) * d + 64 * part);
            for (int p = 0; p < 16; p++) {
                dot[g][0] = dpbusd_broadcast(dot[g][0], c[p], qd + p);
                dot[g][1] = dpbusd_broadcast(dot[g][1], c[p], qd_lo + p);
            }
        }
    }
    for (int g = 0; g < G; g++) {
        const int64_t x = h * G + g;
        const __m512i raw = _mm512_sub_epi32(dot[g][0], _mm512_set1_epi32(128 * qsum[x]));
        const __m512i raw_lo = _mm512_sub_epi32(dot[g][1], _mm512_set1_epi32(128 * qsum[lo + x]));
        const __m512 q_k = _mm512_fmadd_ps(_mm512_cvtepi32_ps(raw_lo), _mm512_set1_ps(qmul[lo + x]),
                                           _mm512_mul_ps(_mm512_cvtepi32_ps(raw), _mm512_set1_ps(qmul[x])));
        __m512 s = _mm512_mul_ps(q_k, sk);
        if (a->softcap > 0.0f) {
            float lanes[KEY_BLOCK];
            _mm512_storeu_ps(lanes, s);
            for (int j = 0; j < KEY_BLOCK; j++) lanes[j] = tanhf(lanes[j] / a->softcap) * a->softcap;
            s = _mm512_loadu_ps(lanes);
        }
        _mm512_storeu_ps(w + g * KEY_BLOCK, s);
    }
}

/* p v for KV head h's G heads over the block's n keys, on the integer units: each head's weights w [G][16] (its
 * e^(s - m) times the key's value scale, 0 past n) become int16 against the block's largest (15 bits), two keys'
 * value rows are widened to int16 and interleaved so a 32-bit lane holds one dimension of both, and VPDPWSSD adds
 * w_t v_t + w_t+1 v_t+1 per lane into int32 sums (at most 8 * 2 * 32767 * 127 < 2^31), which then join the head's
 * float32 sums acc [G][d] (multiplied by rescale [G] first) times the block's weight step. acc holds each 32
 * dimensions in the interleaved order (even16_order). */
static inline __attribute__((always_inline)) void block_values(
    const q8_call *a, const int64_t *sl, int n, int64_t h, const float *w, const float *rescale, float *acc,
    const int G, const int V) {
    const int64_t d = 16 * V, row = a->kv_heads * d;
    int32_t pairs[MAX_GROUP][KEY_BLOCK / 2]; /* per head, keys 2i and 2i + 1 as two int16 */
    float step[MAX_GROUP];
    for (int g = 0; g < G; g++) {
        const __m512 wg = _mm512_loadu_ps(w + g * KEY_BLOCK);
        const float top = _mm512_reduce_max_ps(wg);
        step[g] = top / 32767.0f;
        const __m512 to_int = _mm512_set1_ps(top > 0.0f ? 32767.0f / top : 0.0f);
        const __m256i w16 = _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(wg, to_int)));
        _mm256_storeu_si256((__m256i *)pairs[g], w16);
    }
    const int per_pass = ACC_VECTORS / V < G ? ACC_VECTORS / V : G;
    for (int g0 = 0; g0 < G; g0 += per_pass) {
        const int heads = G - g0 < per_pass ? G - g0 : per_pass;
        __m512i sums[ACC_VECTORS];
        for (int x = 0; x < heads * V; x++) sums[x] = _mm512_setzero_si512();
        for (int i = 0; 2 * i < n; i++) {
            const int8_t *r0 = a->value_cache + sl[2 * i] * row + h * d;
            const int8_t *r1 = 2 * i + 1 < n ? a->value_cache + sl[2 * i + 1] * row + h * d : r0; /* weight 0 */
            __m512i x[8];
            for (int c = 0; c < V / 2; c++) {
                const __m512i u0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(r0 + 32 * c)));
                const __m512i u1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(r1 + 32 * c)));
                x[2 * c] = _mm512_unpacklo_epi16(u0, u1);
                x[2 * c + 1] = _mm512_unpackhi_epi16(u0, u1);
            }
            for (int g = 0; g < heads; g++) {
                const __m512i wp = _mm512_set1_epi32(pairs[g0 + g][i]);
                for (int c = 0; c < V; c++) sums[g * V + c] = _mm512_dpwssd_epi32(sums[g * V + c], x[c], wp);
            }
        }
        for (int g = 0; g < heads; g++) {
            float *hacc = acc + (g0 + g) * d;
            const __m512 r = _mm512_set1_ps(rescale[g0 + g]), st = _mm512_set1_ps(step[g0 + g]);
            for (int c = 0; c < V; c++)
                _mm512_storeu_ps(hacc + 16 * c, _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[g * V + c]), st,
                                                                 _mm512_mul_ps(_mm512_loadu_ps(hacc + 16 * c), r)));
        }
    }
}

/* Where dimension j of a head sits in block_values' sums: per 32 dimensions (one unpack pair), the low unpack's
 * vector holds dims 8L + k and the high one 8L + 4 + k at lane 4L + k (L the 128-bit lane, k < 4). */
static inline int64_t even16_order(int64_t j) {
    const int64_t c = j / 32, r = j % 32, lane = r / 8, k = r % 8;
    return 32 * c + (k < 4 ? 0 : 16) + 4 * lane + k % 4;
}

static inline __attribute__((always_inline)) void chunk_q8(const q8_call *a, int64_t seq, int64_t t0, int64_t len,
                                                          float *scratch, float *out, const int G, const int V) {
    const int64_t d = 16 * V, heads = a->heads, kv_heads = a->kv_heads, row = kv_heads * d;
    const int8_t *q8 = a->query_q8 + seq * query_parts_bytes(heads, d);
    const int32_t *qsum = (const int32_t *)(q8 + 2 * heads * d);
    const float *qmul = (const float *)(qsum + 2 * heads);
    float *m = scratch, *rescale = m + heads, *w = rescale + heads, *l = w + heads * KEY_BLOCK;
    float *acc = l + heads * KEY_BLOCK;
    for (int64_t x = 0; x < heads; x++) m[x] = -INFINITY;
    memset(l, 0, sizeof(float) * (size_t)(heads * KEY_BLOCK));
    memset(acc, 0, sizeof(float) * (size_t)(heads * d));
    const int64_t *slots = a->slots + seq * a->max_len + t0;
    const int64_t window = read_ahead_keys(row, KEY_BLOCK);
    for (int64_t b = 0; b < len; b += KEY_BLOCK) {
        const int n = len - b < KEY_BLOCK ? (int)(len - b) : KEY_BLOCK;
        int64_t sl[KEY_BLOCK];
        for (int j = 0; j < KEY_BLOCK; j++) sl[j] = slots[b + (j < n ? j : 0)]; /* past the end: key b again, p 0 */
        if (b % window == 0) read_ahead(a->key_cache, a->value_cache, slots + b, len - b < window ? len - b : window, row);
        const __mmask16 valid = (__mmask16)((1u << n) - 1u);
        for (int64_t h = 0; h < kv_heads; h++) {
            block_scores(a, sl, h, q8, qsum, qmul, w + h * G * KEY_BLOCK, G, V);
            const __m512 sv = gather_scales(a->value_scales, sl, kv_heads, h);
            for (int g = 0; g < G; g++) { /* the online softmax step of head x */
                const int64_t x = h * G + g;
                const __m512 s = _mm512_loadu_ps(w + x * KEY_BLOCK);
                const float top = fmaxf(m[x], _mm512_mask_reduce_max_ps(valid, s));
                rescale[x] = running_rescale(m[x], top);
                const __m512 e = _mm512_maskz_mov_ps(valid, exp_nonpositive_v(_mm512_sub_ps(s, _mm512_set1_ps(top))));
                float *lx = l + x * KEY_BLOCK;
                _mm512_storeu_ps(lx, _mm512_fmadd_ps(_mm512_loadu_ps(lx), _mm512_set1_ps(rescale[x]), e));
                m[x] = top;
                _mm512_storeu_ps(w + x * KEY_BLOCK, _mm512_mul_ps(e, sv));
            }
            block_values(a, sl, n, h, w + h * G * KEY_BLOCK, rescale + h * G, acc + h * G * d, G, V);
        }
    }
    for (int64_t x = 0; x < heads; x++) {
        out[x * (d + 2)] = m[x];
        out[x * (d + 2) + 1] = _mm512_reduce_add_ps(_mm512_loadu_ps(l + x * KEY_BLOCK));
        for (int64_t j = 0; j < d; j++) out[x * (d + 2) + 2 + j] = acc[x * d + even16_order(j)];
    }
}

#define Q8_CASE(G_, V_)                                 \
    case G_:                                            \
        chunk_q8(a, seq, t0, len, scratch, out, G_, V_); \
        break;

static void chunk_task_q8(const void *args, int64_t seq, int64_t t0, int64_t len, float *scratch, float *out) {
    const q8_call *a = args;
    if (a->d == 64) {
        switch (a->heads / a->kv_heads) { Q8_CASE(1, 4) Q8_CASE(2, 4) Q8_CASE(3, 4) Q8_CASE(4, 4) Q8_CASE(5, 4)
                                          Q8_CASE(6, 4) Q8_CASE(7, 4) Q8_CASE(8, 4) }
    } else {
        switch (a->heads / a->kv_heads) { Q8_CASE(1, 8) Q8_CASE(2, 8) Q8_CASE(3, 8) Q8_CASE(4, 8) Q8_CASE(5, 8)
                                          Q8_CASE(6, 8) Q8_CASE(7, 8) Q8_CASE(8, 8) }
    }
}
#endif

/* The portable loop: one (sequence, KV head) per task, every row dequantized to float32 as it is read. */
/* x [d] = KV head h's row at `slot` read back as float32 (its int8 values times its scale). */
static inline void dequantize_row(const int8_t *cache, const uint16_t *scales, int64_t slot, int64_t kv_heads, int64_t h,
                                  int64_t d, float *x) {
    const int8_t *q = cache + (slot * kv_heads + h) * d;
    const float s = bf16_to_float(scales[slot * kv_heads + h]);
#pragma omp simd
    for (int64_t j = 0; j < d; j++) x[j] = (float)q[j] * s;
}

static int decode_q8_rows(const q8_call *a, const int64_t *context_lens, int64_t n, void *out, int threads) {
    const int64_t d = a->d, group = a->heads / a->kv_heads, kv_heads = a->kv_heads, row = kv_heads * d;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *scratch = malloc(sizeof(float) * (size_t)(group * a->max_len + 2 * group * d + d));
        failed |= scratch == NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n * kv_heads; task++) {
            if (scratch == NULL) continue;
            const int64_t i = task / kv_heads, h = task % kv_heads, len = context_lens[i];
            const int64_t *slots = a->slots + i * a->max_len;
            float *scores = scratch, *q = scores + group * a->max_len, *acc = q + group * d, *x = acc + group * d;
            for (int64_t g = 0; g < group * d; g++) q[g] = query_at(a, (i * a->heads + h * group) * d + g) * a->scale;
            for (int64_t t = 0; t < len; t++) {
                dequantize_row(a->key_cache, a->key_scales, slots[t], kv_heads, h, d, x);
                for (int64_t g = 0; g < group; g++) {
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int64_t j = 0; j < d; j++) dot += q[g * d + j] * x[j];
                    scores[g * len + t] = a->softcap > 0.0f ? tanhf(dot / a->softcap) * a->softcap : dot;
                }
            }
            memset(acc, 0, sizeof(float) * (size_t)(group * d));
            for (int64_t g = 0; g < group; g++) {
                float *s = scores + g * len, max = -INFINITY, sum = 0.0f;
                for (int64_t t = 0; t < len; t++) max = s[t] > max ? s[t] : max;
                for (int64_t t = 0; t < len; t++) {
                    s[t] = len > 0 ? exp_nonpositive(s[t] - max) : 0.0f;
                    sum += s[t];
                }
                for (int64_t t = 0; t < len; t++) s[t] /= sum;
            }
            for (int64_t t = 0; t < len; t++) {
                dequantize_row(a->value_cache, a->value_scales, slots[t], kv_heads, h, d, x);
                for (int64_t g = 0; g < group; g++) {
                    const float p = scores[g * len + t];
#pragma omp simd
                    for (int64_t j = 0; j < d; j++) acc[g * d + j] += p * x[j];
                }
            }
            for (int64_t g = 0; g < group * d; g++) {
                const int64_t at = (i * a->heads + h * group) * d + g;
                if (a->query_bf16)
                    ((uint16_t *)out)[at] = float_to_bf16(acc[g]);
                else
                    ((float *)out)[at] = acc[g];
            }
        }
        free(scratch);
    }
    return failed ? -1 : 0;
}

int tgictl_paged_decode_q8(const void *query, int query_bf16, const int8_t *key_cache, const uint16_t *key_scales,
                           const int8_t *value_cache, const uint16_t *value_scales, const int64_t *slots,
                           const int64_t *context_lens, int64_t n, int64_t max_len, int64_t heads, int64_t kv_heads,
                           int64_t d, float scale, float softcap, void *out, int threads, int portable) {
    q8_call call = {query, query_bf16, key_cache, value_cache, key_scales, value_scales, slots, max_len, heads,
                    kv_heads, d, scale, softcap, NULL};
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
    if (!portable && (d == 64 || d == 128) && heads % kv_heads == 0 && heads / kv_heads <= MAX_GROUP) {
        const int64_t part = query_parts_bytes(heads, d);
        int8_t *parts = aligned_alloc(64, (size_t)((n * part + 63) / 64 * 64 + 64));
        if (parts == NULL) return -1;
        for (int64_t i = 0; i < n; i++) {
            int8_t *q8 = parts + i * part;
            int32_t *qsum = (int32_t *)(q8 + 2 * heads * d);
            quantize_query(&call, i, q8, qsum, (float *)(qsum + 2 * heads));
        }
        call.query_q8 = parts;
        const int status = decode_in_chunks(context_lens, n, heads, d, q8_scratch_floats(heads, d), chunk_task_q8,
                                            &call, out, query_bf16, threads);
        free(parts);
        return status;
    }
#endif
    (void)portable;
    return decode_q8_rows(&call, context_lens, n, out, threads);
}
