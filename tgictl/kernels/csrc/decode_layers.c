/* A decode step's decoder layers in one call: 1-32 rows, bf16 activations, one rank, no biases but q|k|v's.
 *
 * At batch 1 the Python around each layer's eight compiled calls (tensor allocation, checks, ctypes
 * argument conversion) cost about as much as the attention and the norms together. This runs the
 * same calls, with the same arguments and in the same order, as models/llama.py's DecoderLayer does
 * on that path (input norm with the previous MLP output added, fused q|k|v projection, rotary and
 * the KV store, paged decode attention, o projection, post-attention norm with the residual, gate|up
 * projection, silu * up, down projection), so its results are those of the Python layers bit for bit
 * (for int4 and int8 weights: those of the Python layers on the C kernels, which the dispatch table may
 * not pick for every shape); kernels/decode_layers.py decides when it may run (above 4 rows only where
 * the many-row kernels run: AMX or VDPBF16PS for bf16 rows and decoded int8 rows, bf16 dot products for
 * int4 tiles of k_pad == k).
 *
 * norms:   per layer the input norm and the post-attention norm weights [H], bf16;
 * linears: per layer qkv [(heads + 2 kv_heads) d, H], o [H, heads d], gate_up [2 I, H], down [H, I],
 *          each bf16 rows, int4 tiles (linear_methods/int4.py: packed tiles, bf16 scales and zeros) or int8
 *          rows (linear_methods/int8.py: bf16 scales per row);
 * qkv_biases: NULL, or per layer its q|k|v bias [(heads + 2 kv_heads) d] float32 (Qwen2's), or NULL for a layer
 *          without: added by the projection's kernel, as the Python layers' call adds it;
 * caches:  per layer, the key then the value cache [num_slots, kv_heads, d] bf16; with kv_int8 (--kv-cache-dtype
 *          int8) per layer four: key values [num_slots, kv_heads, d] int8, key scales [num_slots, kv_heads]
 *          bf16, value values, value scales (kv_pages.Int8Pages), stored by tgictl_rotary_store_q8_bf16 and
 *          read by tgictl_paged_decode_q8, the calls the Python layers make on such a cache;
 * hidden:  [m, H] the residual stream before the first of the layers, overwritten with it after the
 *          last; delta: [m, H] the MLP output still to be added (read when has_delta), overwritten
 *          with the last layer's MLP output;
 * final_norm: the model's final norm weight [H] bf16, or NULL: when given, final_out [m, H] receives
 *          norm(hidden + delta) after the last layer (models/llama.py's last step, the same kernel) and
 *          hidden the sum, so a decode step's hidden states leave in this one call;
 * scratch: tgictl_decode_layers_scratch() bytes, 64-byte aligned.
 * Returns 0; -1 when a slot lies outside the cache (nothing written); -2 when scratch memory was
 * refused inside a kernel (the step fails: the KV of the layers before is written).
 */
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "linear_desc.h"

/* The kernels of the other csrc/ files this loop calls (one library, native.py builds them together). */
void tgictl_rmsnorm_bf16(const uint16_t *x, const uint16_t *delta, uint16_t *sum_out, const uint16_t *weight,
                         uint16_t *out, int64_t rows, int64_t dim, float eps, int threads);
void tgictl_silu_mul_bf16(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t inter, int threads);
int tgictl_rotary_store_bf16(const uint16_t *qkv, const uint16_t *cos, const uint16_t *sin, const int64_t *slots,
                             uint16_t *q_out, uint16_t *key_cache, uint16_t *value_cache, int64_t tokens,
                             int64_t heads, int64_t kv_heads, int64_t d, int64_t num_slots, int threads);
int tgictl_paged_decode_bf16(const uint16_t *query, const uint16_t *key_cache, const uint16_t *value_cache,
                             const int64_t *slots, const int64_t *context_lens, int64_t n, int64_t max_len,
                             int64_t heads, int64_t kv_heads, int64_t d, float scale, float softcap, uint16_t *out,
                             int threads);
int tgictl_rotary_store_q8_bf16(const uint16_t *qkv, const uint16_t *cos, const uint16_t *sin, const int64_t *slots,
                                uint16_t *q_out, int8_t *key_cache, uint16_t *key_scales, int8_t *value_cache,
                                uint16_t *value_scales, int64_t tokens, int64_t heads, int64_t kv_heads, int64_t d,
                                int64_t num_slots, int threads);
int tgictl_paged_decode_q8(const void *query, int query_bf16, const int8_t *key_cache, const uint16_t *key_scales,
                           const int8_t *value_cache, const uint16_t *value_scales, const int64_t *slots,
                           const int64_t *context_lens, int64_t n, int64_t max_len, int64_t heads, int64_t kv_heads,
                           int64_t d, float scale, float softcap, void *out, int threads, int portable);

/* One layer's rotary + KV store and decode attention on its caches (2 or 4 pointers, as `caches` above): the
 * status of the store (0, -1 for a slot outside the cache), or -2 when the attention's scratch was refused. */
static int store_and_attend(void *const *caches, int kv_int8, const uint16_t *qkv, const uint16_t *cos,
                            const uint16_t *sin, const int64_t *slots, uint16_t *q, const int64_t *attention_slots,
                            const int64_t *context_lens, int64_t max_len, int64_t m, int64_t heads, int64_t kv_heads,
                            int64_t d, int64_t num_slots, float scale, uint16_t *attention, int threads) {
    if (kv_int8) {
        int8_t *key_cache = caches[0], *value_cache = caches[2];
        uint16_t *key_scales = caches[1], *value_scales = caches[3];
        const int stored = tgictl_rotary_store_q8_bf16(qkv, cos, sin, slots, q, key_cache, key_scales, value_cache,
                                                       value_scales, m, heads, kv_heads, d, num_slots, threads);
        if (stored != 0) return stored == -1 ? -1 : -2; /* -2: a head over its limit, which the caller declines */
        return tgictl_paged_decode_q8(q, 1, key_cache, key_scales, value_cache, value_scales, attention_slots,
                                      context_lens, m, max_len, heads, kv_heads, d, scale, 0.0f, attention, threads,
                                      0) != 0 ? -2 : 0;
    }
    uint16_t *key_cache = caches[0], *value_cache = caches[1];
    if (tgictl_rotary_store_bf16(qkv, cos, sin, slots, q, key_cache, value_cache, m, heads, kv_heads, d, num_slots,
                                 threads) != 0)
        return -1;
    return tgictl_paged_decode_bf16(q, key_cache, value_cache, attention_slots, context_lens, m, max_len, heads,
                                    kv_heads, d, scale, 0.0f, attention, threads) != 0 ? -2 : 0;
}

enum { QKV, O_PROJ, GATE_UP, DOWN, LINEARS_PER_LAYER };

static inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

int64_t tgictl_decode_layers_scratch(int64_t m, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t d,
                                     int64_t inter) {
    const int64_t widest = max_i64((heads + 2 * kv_heads) * d, 2 * inter);  /* a projection's outputs */
    const int64_t deepest = max_i64(max_i64(hidden, heads * d), inter);    /* and its inputs */
    const int64_t halves = m * (3 * hidden + (heads + 2 * kv_heads) * d + 2 * heads * d + 3 * inter);
    return 2 * halves + 4 * m * (widest + deepest) + 4 * 64;  /* bf16 buffers, then float32 x and y */
}

static inline void *aligned(void *p) { return (void *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

int tgictl_decode_layers_bf16(int64_t layers, const void *const *norms, const linear_desc *linears,
                              const float *const *qkv_biases, void *const *caches, uint16_t *hidden,
                              uint16_t *delta, int has_delta,
                              const uint16_t *cos, const uint16_t *sin, const int64_t *slots,
                              const int64_t *attention_slots, const int64_t *context_lens, int64_t max_len, int64_t m,
                              int64_t hidden_size, int64_t heads, int64_t kv_heads, int64_t d, int64_t inter,
                              int64_t num_slots, float eps, float scale, const uint16_t *final_norm,
                              float final_eps, uint16_t *final_out, void *scratch, int threads, int kv_int8) {
    const int64_t H = hidden_size, qkv_width = (heads + 2 * kv_heads) * d;
    const int64_t widest = max_i64(qkv_width, 2 * inter);
    uint16_t *other = aligned(scratch), *normed = other + m * H, *attended = normed + m * H, *qkv = attended + m * H;
    uint16_t *q = qkv + m * qkv_width, *attention = q + m * heads * d, *gate_up = attention + m * heads * d;
    uint16_t *activated = gate_up + m * 2 * inter;
    float *y32 = aligned(activated + m * inter), *x32 = aligned(y32 + m * widest);
    uint16_t *residual = hidden; /* where the residual stream is now: hidden or other */
    for (int64_t layer = 0; layer < layers; layer++) {
        const void *input_norm = norms[2 * layer], *post_norm = norms[2 * layer + 1];
        const linear_desc *w = linears + layer * LINEARS_PER_LAYER;
        uint16_t *next = residual == hidden ? other : hidden;
        if (layer == 0 && !has_delta) {
            tgictl_rmsnorm_bf16(residual, NULL, NULL, input_norm, normed, m, H, eps, threads);
        } else {
            tgictl_rmsnorm_bf16(residual, delta, next, input_norm, normed, m, H, eps, threads);
            residual = next;
            next = residual == hidden ? other : hidden;
        }
        const float *qkv_bias = qkv_biases != NULL ? qkv_biases[layer] : NULL;
        if (linear_by_desc(&w[QKV], normed, qkv, m, qkv_width, H, qkv_bias, x32, y32, threads) != 0) return -2;
        /* the slots are every layer's: only the first can refuse them (-1) */
        const int attended_status = store_and_attend(caches + (kv_int8 ? 4 : 2) * layer, kv_int8, qkv, cos, sin,
                                                     slots, q, attention_slots, context_lens, max_len, m, heads,
                                                     kv_heads, d, num_slots, scale, attention, threads);
        if (attended_status != 0) return attended_status;
        if (linear_by_desc(&w[O_PROJ], attention, attended, m, H, heads * d, NULL, x32, y32, threads) != 0) return -2;
        tgictl_rmsnorm_bf16(residual, attended, next, post_norm, normed, m, H, eps, threads);
        residual = next;
        if (linear_by_desc(&w[GATE_UP], normed, gate_up, m, 2 * inter, H, NULL, x32, y32, threads) != 0) return -2;
        tgictl_silu_mul_bf16(gate_up, activated, m, inter, threads);
        if (linear_by_desc(&w[DOWN], activated, delta, m, H, inter, NULL, x32, y32, threads) != 0) return -2;
    }
    if (final_norm != NULL) {
        uint16_t *next = residual == hidden ? other : hidden;
        tgictl_rmsnorm_bf16(residual, delta, next, final_norm, final_out, m, H, final_eps, threads);
        residual = next;
    }
    if (residual != hidden) memcpy(hidden, residual, sizeof(uint16_t) * (size_t)(m * H));
    return 0;
}
