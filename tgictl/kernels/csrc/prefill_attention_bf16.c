/* Causal prefill attention over a paged bf16 KV cache with the bf16 dot-product instruction (AVX512-BF16),
 * head sizes 64 and 128: one sequence's new tokens against its cached prefix and themselves.
 *
 * Why not torch's SDPA: its CPU flash kernel multiplies bf16 through MKL, which on AMD CPUs takes a generic
 * path that widens to float32 (sgemm); a 1,000-token prompt spent 11.7 ms per layer there on 2 Zen 5
 * cores, more than all the layer's projections together (3.6 ms here). Per task (16 queries, one KV head,
 * every query head of its group), each block of 64 keys is turned once so that a 32-bit lane holds one
 * key's pair of head elements; a query row's scores are then d/2 VDPBF16PS per 16 keys with the query's
 * pair broadcast, no sums across lanes, four row-heads at a time. The softmax runs online (flash attention: running maximum and sum in float32, the
 * value sums rescaled), p is rounded to bf16 (as SDPA's bf16 kernel does before its p @ V), and the values
 * of two keys are interleaved so VDPBF16PS adds p_t v_t + p_t+1 v_t+1 per lane. Blocks past a row's
 * position are skipped and the keys after it in its last block weigh nothing. With a sliding window a row
 * sees only its last `window` keys: blocks before every row's window are skipped, and the keys before a row's
 * window in a block it reaches weigh nothing (masked as the keys after its position are).
 *
 * An int8 cache (--kv-cache-dtype int8, kv_int8.h's rows: int8 values and a bf16 scale per slot and KV head) is
 * read by the same loop (tgictl_prefill_attention_q8): each row is widened to bf16 as it is laid out for the
 * products, q s in float32 rounded once to bf16, the values kv_pages.gather_rows gives the torch path, so the
 * result is this kernel's on the dequantized cache, bit for bit. The widening costs a few instructions per
 * row beside the layout's own copy; the torch path it replaces gathered and widened the whole cached prefix per
 * chunk and ran SDPA (2x the bf16 cache's prefill time for an 8k prompt).
 *
 * Query row r sits at position cache_len + r and sees keys 0 .. cache_len + r (from cache_len + r - window + 1
 * on when window > 0). Layouts: query, out
 * [new_len, heads, d] bf16; caches [num_slots, kv_heads, d] bf16; slots [cache_len + new_len] int64, the
 * sequence's slot per position. Returns 0; -1 when scratch memory is refused; -2 when this build (no
 * AVX512-BF16) or shape (head size, heads not a multiple of kv_heads) is not served here.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "prefill_attention.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>

#include "exp512.h"

#define QUERY_BLOCK 16 /* query rows per task (each with its group's heads) */
#define KEY_BLOCK 64   /* keys per step: SUB score vectors of 16 per query row */
#define SUB (KEY_BLOCK / 16)
#define ROW_TILE 4     /* row-heads scored together: ROW_TILE SUB independent product chains, each key load
                          * shared by ROW_TILE rows (2 rows: 6.0 -> 4.4 ms, 4: 3.6 ms for 1,000 tokens) */

/* An int8 row (16 V values) times its bf16 scale, in float32, rounded to bf16 (nearest, ties to even: bf16.h's
 * float_to_bf16 on 16 lanes; a product of an int8 and a bf16 is never NaN unless the scale is) into out. */
static inline void widen_row_int8(const int8_t *q, uint16_t scale, uint16_t *out, const int V) {
    const __m512 s = _mm512_set1_ps(bf16_to_float(scale));
    for (int c = 0; c < V; c++) {
        const __m512i wide = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16 * c)));
        const __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(wide), s);
        const __m512i bits = _mm512_castps_si512(x);
        const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
        const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
        _mm256_storeu_si256((__m256i *)(out + 16 * c), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
    }
}

/* KV head h's row at `slot` as bf16: in place for a bf16 cache (scales NULL), else widened into buf [d]. */
static inline __attribute__((always_inline)) const uint16_t *cache_row(const void *cache, const uint16_t *scales,
                                                                       int64_t slot, int64_t h, int64_t kv_heads,
                                                                       uint16_t *buf, const int V) {
    const int64_t at = (slot * kv_heads + h) * 16 * V;
    if (scales == NULL) return (const uint16_t *)cache + at;
    widen_row_int8((const int8_t *)cache + at, scales[slot * kv_heads + h], buf, V);
    return buf;
}

/* Keys [k0, k0 + n) of KV head h laid out for the products: kt [pairs][KEY_BLOCK] (lane j of a vector: key j's
 * pair p), vi [KEY_BLOCK / 2][P][lo, hi] (keys 2i and 2i+1 interleaved); keys past n are zeros. The caches are
 * bf16, or int8 with their scales (key_scales, value_scales non-NULL). */
static inline __attribute__((always_inline)) void load_keys_values(
    const void *key_cache, const void *value_cache, const uint16_t *key_scales, const uint16_t *value_scales,
    const int64_t *slots, int64_t k0, int n, int64_t h, int64_t kv_heads, uint32_t *kt, __m512i *vi, const int V) {
    const int P = V / 2, pairs = 8 * V;
    uint16_t kbuf[128], vbuf[2][128]; /* int8 rows widened (d <= 128) */
    for (int j = 0; j < KEY_BLOCK; j++) {
        const uint32_t *row = j < n ? (const uint32_t *)cache_row(key_cache, key_scales, slots[k0 + j], h, kv_heads,
                                                                  kbuf, V) : NULL;
        for (int p = 0; p < pairs; p++) kt[p * KEY_BLOCK + j] = row != NULL ? row[p] : 0u;
    }
    for (int i = 0; i < KEY_BLOCK / 2; i++) {
        const uint16_t *v0 = 2 * i < n ? cache_row(value_cache, value_scales, slots[k0 + 2 * i], h, kv_heads,
                                                   vbuf[0], V) : NULL;
        const uint16_t *v1 = 2 * i + 1 < n ? cache_row(value_cache, value_scales, slots[k0 + 2 * i + 1], h, kv_heads,
                                                       vbuf[1], V) : NULL;
        for (int c = 0; c < P; c++) {
            const __m512i a = v0 != NULL ? _mm512_loadu_si512(v0 + 32 * c) : _mm512_setzero_si512();
            const __m512i b = v1 != NULL ? _mm512_loadu_si512(v1 + 32 * c) : _mm512_setzero_si512();
            vi[(i * P + c) * 2] = _mm512_unpacklo_epi16(a, b);
            vi[(i * P + c) * 2 + 1] = _mm512_unpackhi_epi16(a, b);
        }
    }
}

static inline int clamp16(int x) { return x < 0 ? 0 : (x > 16 ? 16 : x); }

/* One row-head's step over the block: scores (given), softmax update of its state {m, l, acc [V][16]}, p v.
 * Keys first .. visible - 1 of the block count (first > 0 only under a sliding window; first < visible). */
static inline __attribute__((always_inline)) void update_row(__m512 s[SUB], int first, int visible, float scale,
                                                             float *st, const __m512i *vi, const int V) {
    const int P = V / 2;
    __mmask16 valid[SUB];
    __m512 top_v = _mm512_set1_ps(-INFINITY);
    for (int u = 0; u < SUB; u++) {
        const int upto = clamp16(visible - 16 * u), from = clamp16(first - 16 * u);
        valid[u] = (__mmask16)(((1u << upto) - 1u) & ~((1u << from) - 1u));
        s[u] = _mm512_mul_ps(s[u], _mm512_set1_ps(scale));
        top_v = _mm512_mask_max_ps(top_v, valid[u], top_v, s[u]);
    }
    const float block_max = _mm512_reduce_max_ps(top_v);
    const float old = st[0], top = block_max > old ? block_max : old;
    const float rescale = running_rescale(old, top);
    __m512 sum = _mm512_setzero_ps();
    uint32_t pb[KEY_BLOCK / 2];
    for (int u = 0; u < SUB; u++) {
        const __m512 e = _mm512_maskz_mov_ps(valid[u], exp_nonpositive_v(_mm512_sub_ps(s[u], _mm512_set1_ps(top))));
        sum = _mm512_add_ps(sum, e);
        _mm256_storeu_si256((__m256i *)(pb + 8 * u), (__m256i)_mm512_cvtneps_pbh(e));
    }
    st[1] = st[1] * rescale + _mm512_reduce_add_ps(sum);
    st[0] = top;
    __m512 acc[2][8]; /* two chains: even and odd key pairs */
    for (int c = 0; c < V; c++) {
        acc[0][c] = _mm512_loadu_ps(st + 2 + 16 * c);
        if (rescale != 1.0f) acc[0][c] = _mm512_mul_ps(acc[0][c], _mm512_set1_ps(rescale));
        acc[1][c] = _mm512_setzero_ps();
    }
    const int key_pairs = (visible + 1) / 2; /* the pair past an odd end has p = 0 for its second key */
    for (int i0 = first / 4 * 2; i0 < key_pairs; i0 += 2) /* the pairs before `first` hold p = 0 only */
        for (int k = 0; k < 2; k++) { /* constant chain index: the sums stay in registers */
            const int i = i0 + k < key_pairs ? i0 + k : i0; /* past the end: pair i0 again with p = 0 */
            const __m512bh pp = (__m512bh)_mm512_set1_epi32(i0 + k < key_pairs ? (int)pb[i] : 0);
            for (int c = 0; c < P; c++) {
                acc[k][2 * c] = _mm512_dpbf16_ps(acc[k][2 * c], (__m512bh)vi[(i * P + c) * 2], pp);
                acc[k][2 * c + 1] = _mm512_dpbf16_ps(acc[k][2 * c + 1], (__m512bh)vi[(i * P + c) * 2 + 1], pp);
            }
        }
    for (int c = 0; c < V; c++) _mm512_storeu_ps(st + 2 + 16 * c, _mm512_add_ps(acc[0][c], acc[1][c]));
}

/* One task: query rows [r0, r1) of KV head h's group. scratch (64-byte aligned): KEY_BLOCK / 2 (d / 32) 2
 * interleaved value vectors, d / 2 KEY_BLOCK transposed key pairs, then QUERY_BLOCK G (2 + d) floats of
 * running state. */
static inline __attribute__((always_inline)) void query_block(
    const uint16_t *query, const void *key_cache, const void *value_cache, const uint16_t *key_scales,
    const uint16_t *value_scales, const int64_t *slots,
    int64_t cache_len, int64_t r0, int64_t r1, int64_t h, int64_t heads, int64_t kv_heads, float scale,
    int64_t window, float *scratch, uint16_t *out, const int V) {
    const int P = V / 2, pairs = 8 * V; /* 512-bit vectors and 32-bit pairs per head row */
    const int64_t d = 16 * V, G = heads / kv_heads, rows = (r1 - r0) * G;
    __m512i *vi = (__m512i *)scratch;                           /* [KEY_BLOCK / 2][P][lo, hi] */
    uint32_t *kt = (uint32_t *)(vi + KEY_BLOCK / 2 * P * 2);    /* [pairs][KEY_BLOCK] */
    float *state = (float *)(kt + pairs * KEY_BLOCK);           /* per row-head: m, l, acc [V][16] */
    for (int64_t x = 0; x < rows; x++) {
        state[x * (2 + d)] = -INFINITY;
        state[x * (2 + d) + 1] = 0.0f;
        memset(state + x * (2 + d) + 2, 0, sizeof(float) * (size_t)d);
    }
    const int64_t keys = cache_len + r1; /* the last row's position + 1 */
    /* the first key the first row's window reaches (key 0 without a window) */
    const int64_t start = window > 0 && cache_len + r0 - window + 1 > 0 ? cache_len + r0 - window + 1 : 0;
    for (int64_t k0 = start / KEY_BLOCK * KEY_BLOCK; k0 < keys; k0 += KEY_BLOCK) {
        const int n = keys - k0 < KEY_BLOCK ? (int)(keys - k0) : KEY_BLOCK;
        load_keys_values(key_cache, value_cache, key_scales, value_scales, slots, k0, n, h, kv_heads, kt, vi, V);
        /* row-heads x = (r - r0) G + g whose position reaches the block, ROW_TILE at a time */
        const int64_t first_row = k0 - cache_len > r0 ? k0 - cache_len : r0;
        /* ... up to the last row whose window still reaches it (position - window + 1 < k0 + n) */
        int64_t end_rows = rows;
        if (window > 0 && k0 + n + window - 1 - cache_len < r1)
            end_rows = (k0 + n + window - 1 - cache_len - r0) * G;
        for (int64_t x = (first_row - r0) * G; x < end_rows; x += ROW_TILE) {
            const int tile = end_rows - x < ROW_TILE ? (int)(end_rows - x) : ROW_TILE;
            __m512 s[ROW_TILE][SUB];
            const uint32_t *q[ROW_TILE];
            for (int t = 0; t < ROW_TILE; t++) {
                const int64_t y = t < tile ? x + t : x; /* a missing second row repeats the first, unused */
                q[t] = (const uint32_t *)(query + ((r0 + y / G) * heads + h * G + y % G) * d);
                for (int u = 0; u < SUB; u++) s[t][u] = _mm512_setzero_ps();
            }
            for (int p = 0; p < pairs; p++)
                for (int t = 0; t < ROW_TILE; t++) {
                    const __m512bh qp = (__m512bh)_mm512_set1_epi32((int)q[t][p]);
                    for (int u = 0; u < SUB; u++)
                        s[t][u] = _mm512_dpbf16_ps(s[t][u], (__m512bh)_mm512_loadu_si512(kt + p * KEY_BLOCK + 16 * u), qp);
                }
            for (int t = 0; t < tile; t++) {
                const int64_t y = x + t, position = cache_len + r0 + y / G;
                const int visible = position - k0 + 1 < n ? (int)(position - k0 + 1) : n;
                const int64_t from = window > 0 ? position - window + 1 - k0 : 0;
                const int first = from > 0 ? (int)from : 0;
                if (visible > first) update_row(s[t], first, visible, scale, state + y * (2 + d), vi, V);
            }
        }
    }
    for (int64_t r = r0; r < r1; r++)
        for (int64_t g = 0; g < G; g++) {
            const float *st = state + ((r - r0) * G + g) * (2 + d);
            const float inv = 1.0f / st[1];
            uint16_t *o = out + (r * heads + h * G + g) * d;
            /* vector 2c: dims 32c + 8L + e at lane 4L + e (L = 128-bit lane, e < 4); vector 2c + 1: dims + 4 */
            for (int64_t j = 0; j < d; j++)
                o[j] = float_to_bf16(st[2 + (j / 32 * 2 + (j % 8) / 4) * 16 + 4 * ((j % 32) / 8) + j % 4] * inv);
        }
}
#endif

#if defined(__AVX512BF16__)
/* The tasks over both cache formats: key_scales, value_scales NULL for bf16 caches. */
static int prefill_tasks(const uint16_t *query, const void *key_cache, const void *value_cache,
                         const uint16_t *key_scales, const uint16_t *value_scales, const int64_t *slots,
                         int64_t cache_len, int64_t new_len, int64_t heads, int64_t kv_heads, int64_t d, float scale,
                         int64_t window, uint16_t *out, int threads) {
    if ((d != 64 && d != 128) || heads % kv_heads != 0) return -2;
    const int64_t blocks = (new_len + QUERY_BLOCK - 1) / QUERY_BLOCK, tasks = blocks * kv_heads;
    const int64_t group = heads / kv_heads;
    const size_t scratch_bytes = sizeof(float) * (size_t)(QUERY_BLOCK * group * (2 + d) + d / 2 * KEY_BLOCK) +
                                 64 * (size_t)(KEY_BLOCK * d / 32);
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *scratch = aligned_alloc(64, (scratch_bytes + 63) / 64 * 64);
        failed |= scratch == NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            if (scratch == NULL) continue;
            const int64_t b = blocks - 1 - task / kv_heads, h = task % kv_heads; /* the longest rows first */
            const int64_t r0 = b * QUERY_BLOCK, r1 = r0 + QUERY_BLOCK < new_len ? r0 + QUERY_BLOCK : new_len;
            if (d == 64)
                query_block(query, key_cache, value_cache, key_scales, value_scales, slots, cache_len, r0, r1, h,
                            heads, kv_heads, scale, window, scratch, out, 4);
            else
                query_block(query, key_cache, value_cache, key_scales, value_scales, slots, cache_len, r0, r1, h,
                            heads, kv_heads, scale, window, scratch, out, 8);
        }
        free(scratch);
    }
    return failed ? -1 : 0;
}
#endif

int tgictl_prefill_attention_bf16(PREFILL_ATTENTION_ARGS) {
#if defined(__AVX512BF16__)
    return prefill_tasks(query, key_cache, value_cache, NULL, NULL, slots, cache_len, new_len, heads, kv_heads, d,
                         scale, window, out, threads);
#else
    PREFILL_ATTENTION_UNUSED_ARGS();
    return -2;
#endif
}

/* The same over an int8 cache: key_cache, value_cache [num_slots, kv_heads, d] int8, key_scales, value_scales
 * [num_slots, kv_heads] bf16 (kv_pages.Int8Pages); the other arguments and the status as above. */
int tgictl_prefill_attention_q8(const uint16_t *query, const int8_t *key_cache, const uint16_t *key_scales,
                                const int8_t *value_cache, const uint16_t *value_scales, const int64_t *slots,
                                int64_t cache_len, int64_t new_len, int64_t heads, int64_t kv_heads, int64_t d,
                                float scale, int64_t window, uint16_t *out, int threads) {
#if defined(__AVX512BF16__)
    return prefill_tasks(query, key_cache, value_cache, key_scales, value_scales, slots, cache_len, new_len, heads,
                         kv_heads, d, scale, window, out, threads);
#else
    (void)key_scales, (void)value_scales;
    PREFILL_ATTENTION_UNUSED_ARGS();
    return -2;
#endif
}
